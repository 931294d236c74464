//! The cross-backend harness: every op, on fresh random inputs, run by each
//! backend's kernels and compared with the reference semantics in weft-ops,
//! with the tolerance stated per case.

use weft_kernels::cpu::{self, HostTensor};
use weft_ops::reference::{self, HostMemory};
use weft_ops::{AttentionParams, DType, Op, OpNode, RopeMode, RopeParams, Tensor};

/// Deterministic random numbers (SplitMix64) so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1), never exactly zero.
    fn f32(&mut self) -> f32 {
        let v = (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
        if v == 0.0 {
            0.5
        } else {
            v
        }
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
}

/// Runs `node` with the CPU kernels on a copy of `mem`, splitting the work
/// as for `threads` threads and running the pieces in reverse order.
fn run_cpu(node: &OpNode, mem: &HostMemory, threads: usize) -> HostMemory {
    let mut out = mem.clone();
    let resolve = |m: &mut HostMemory, t: &Tensor| HostTensor {
        ptr: m
            .bytes_mut(&Tensor { offset: 0, ..*t })
            .as_mut_ptr()
            .wrapping_add(t.offset as usize),
        tensor: *t,
    };
    let ins: Vec<HostTensor> = node.inputs.iter().map(|t| resolve(&mut out, t)).collect();
    let outs: Vec<HostTensor> = node.outputs.iter().map(|t| resolve(&mut out, t)).collect();
    let split = cpu::work_split(node, threads);
    for item in (0..split.items).rev() {
        // SAFETY: single-threaded; the tensors live in `out`, which outlives the loop.
        unsafe { cpu::run_item(node, &ins, &outs, &split, item) }.unwrap();
    }
    out
}

fn run_ref(node: &OpNode, mem: &HostMemory) -> HostMemory {
    let mut out = mem.clone();
    reference::run(node, &mut out).unwrap();
    out
}

/// Largest |a - b| / (|b| + floor) over the output.
fn compare(node: &OpNode, mem: &HostMemory, tol: f32, floor: f32, what: &str) {
    for threads in [1, 3] {
        let got = run_cpu(node, mem, threads);
        let want = run_ref(node, mem);
        let out = node.outputs[0];
        let (g, w) = (got.to_f32(&out).unwrap(), want.to_f32(&out).unwrap());
        let mut worst = 0f32;
        for (a, b) in g.iter().zip(&w) {
            let e = (a - b).abs() / (b.abs() + floor);
            assert!(e.is_finite(), "{what}: non-finite result {a} vs {b}");
            worst = worst.max(e);
        }
        assert!(worst <= tol, "{what}: worst relative error {worst} > {tol}");
    }
}

fn node(op: Op, inputs: Vec<Tensor>, outputs: Vec<Tensor>) -> OpNode {
    let n = OpNode::new(op, inputs, outputs);
    n.validate().unwrap();
    n
}

#[test]
fn elementwise_and_norm_match_reference() {
    let mut rng = Rng(1);
    let mut mem = HostMemory::default();
    for (rows, cols) in [(1, 576), (7, 64), (3, 1000)] {
        let a = mem
            .f32_tensor(&[rows, cols], &rng.vec(rows * cols, 3.0))
            .unwrap();
        let b = mem
            .f32_tensor(&[rows, cols], &rng.vec(rows * cols, 3.0))
            .unwrap();
        let b1 = mem.f32_tensor(&[1, cols], &rng.vec(cols, 3.0)).unwrap();
        let w = mem.f32_tensor(&[cols], &rng.vec(cols, 1.0)).unwrap();
        let o = mem.zeros(DType::F32, &[rows, cols]).unwrap();
        // Exact in f32 up to the order of one operation.
        compare(&node(Op::Add, vec![a, b], vec![o]), &mem, 1e-6, 1e-6, "add");
        compare(
            &node(Op::Mul, vec![a, b1], vec![o]),
            &mem,
            1e-6,
            1e-6,
            "mul broadcast",
        );
        compare(
            &node(Op::Scale { factor: 0.37 }, vec![a], vec![o]),
            &mem,
            1e-6,
            1e-6,
            "scale",
        );
        // silu uses expf: a few ulps.
        compare(
            &node(Op::SiluMul, vec![a, b], vec![o]),
            &mem,
            1e-5,
            1e-5,
            "silu_mul",
        );
        // rms_norm: f64 sum in both; the scale differs by f32 rounding.
        compare(
            &node(Op::RmsNorm { eps: 1e-5 }, vec![a, w], vec![o]),
            &mem,
            1e-5,
            1e-5,
            "rms_norm",
        );
        compare(
            &node(Op::Softmax { scale: 0.7 }, vec![a], vec![o]),
            &mem,
            1e-5,
            1e-6,
            "softmax",
        );
    }
}

#[test]
fn argmax_copy_and_rows_match_reference() {
    let mut rng = Rng(2);
    let mut mem = HostMemory::default();
    let x = mem.f32_tensor(&[5, 300], &rng.vec(1500, 2.0)).unwrap();
    let ids = mem.zeros(DType::I32, &[5]).unwrap();
    compare(
        &node(Op::Argmax, vec![x], vec![ids]),
        &mem,
        0.0,
        1.0,
        "argmax",
    );
    for dt in [DType::F16, DType::BF16] {
        let o = mem.zeros(dt, &[5, 300]).unwrap();
        // One rounding to the narrow type: exact match expected.
        compare(&node(Op::Copy, vec![x], vec![o]), &mem, 0.0, 1e-6, "copy");
        let cache = mem.zeros(dt, &[16, 300]).unwrap();
        compare(
            &node(
                Op::SetRows {
                    start: 3,
                    ring: None,
                },
                vec![x],
                vec![cache],
            ),
            &mem,
            0.0,
            1e-6,
            "set_rows",
        );
        compare(
            &node(
                Op::SetRows {
                    start: 14,
                    ring: Some(8),
                },
                vec![x],
                vec![cache],
            ),
            &mem,
            0.0,
            1e-6,
            "set_rows ring",
        );
    }
}

#[test]
fn rope_matches_reference() {
    let mut rng = Rng(3);
    let mut mem = HostMemory::default();
    let (rows, heads, d) = (6, 3, 64);
    let x = mem
        .f32_tensor(&[rows, heads * d], &rng.vec(rows * heads * d, 2.0))
        .unwrap();
    let pos: Vec<i32> = (0..rows as i32).map(|i| i * 37 + 5).collect();
    let p = mem
        .tensor(DType::I32, &[rows], bytemuck::cast_slice(&pos))
        .unwrap();
    let o = mem.zeros(DType::F32, &[rows, heads * d]).unwrap();
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for n_dims in [64, 32] {
            let mut params = RopeParams::plain(mode, d, n_dims, 10000.0);
            // The kernel builds theta by repeated multiplication (as ggml
            // does), the reference with powf: the angle drifts by about
            // n_dims/2 ulps, i.e. ~4e-4 rad at position 190.
            compare(
                &node(Op::Rope(params), vec![x, p], vec![o]),
                &mem,
                2e-3,
                1e-2,
                "rope",
            );
            params.ext_factor = 1.0;
            params.freq_scale = 0.25;
            params.orig_ctx = 4096;
            params.base = 100000.0;
            compare(
                &node(Op::Rope(params), vec![x, p], vec![o]),
                &mem,
                2e-3,
                1e-2,
                "rope yarn",
            );
        }
    }
}

#[test]
fn attention_matches_reference() {
    let mut rng = Rng(4);
    for (kv_dtype, tol) in [(DType::F32, 1e-4), (DType::F16, 3e-2)] {
        for (n, q_position, window, ring) in [
            (1, 9, None, None),
            (5, 0, None, None),
            (4, 20, Some(8), Some(12)),
            (3, 5, Some(4), None),
        ] {
            let mut mem = HostMemory::default();
            let (heads, kv_heads, d) = (6, 2, 64);
            let rows = ring.map_or(q_position as usize + n, |r| r as usize);
            let q = mem
                .f32_tensor(&[n, heads * d], &rng.vec(n * heads * d, 1.0))
                .unwrap();
            let k = mem.zeros(kv_dtype, &[rows, kv_heads * d]).unwrap();
            let v = mem.zeros(kv_dtype, &[rows, kv_heads * d]).unwrap();
            mem.set_f32(&k, &rng.vec(rows * kv_heads * d, 1.0)).unwrap();
            mem.set_f32(&v, &rng.vec(rows * kv_heads * d, 1.0)).unwrap();
            let o = mem.zeros(DType::F32, &[n, heads * d]).unwrap();
            let params = AttentionParams {
                heads,
                kv_heads,
                head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
                q_position,
                window,
                ring,
                softcap: 0.0,
                kv_capacity: 0,
            };
            // f16 caches: the kernel rounds q and its running output to f16
            // like llama.cpp (~1e-3 relative per step); f32: summation order.
            compare(
                &node(Op::Attention(params), vec![q, k, v], vec![o]),
                &mem,
                tol,
                5e-2,
                "attention",
            );
        }
    }
}

#[test]
fn gelu_and_layer_norm_match_reference() {
    let mut rng = Rng(5);
    let mut mem = HostMemory::default();
    for (rows, cols, scale) in [(1, 2048, 3.0), (7, 640, 12.0), (3, 100, 0.5)] {
        let a = mem
            .f32_tensor(&[rows, cols], &rng.vec(rows * cols, scale))
            .unwrap();
        let b = mem
            .f32_tensor(&[rows, cols], &rng.vec(rows * cols, 2.0))
            .unwrap();
        let w = mem.f32_tensor(&[cols], &rng.vec(cols, 1.0)).unwrap();
        let bias = mem.f32_tensor(&[cols], &rng.vec(cols, 1.0)).unwrap();
        let o = mem.zeros(DType::F32, &[rows, cols]).unwrap();
        // The CPU kernel follows ggml: the input is rounded to f16 (2^-11
        // relative), looked up in a table of f16 results (another 2^-11);
        // GELU's slope is at most 1.13, so the error stays below ~3.3 * 2^-11
        // of |x|. Where gelu(x) is tiny (x < -3) that is relative to |x|, so
        // the floor is 1e-2.
        compare(&node(Op::Gelu, vec![a], vec![o]), &mem, 2e-3, 1e-2, "gelu");
        compare(
            &node(Op::GeluMul, vec![a, b], vec![o]),
            &mem,
            2e-3,
            1e-2,
            "gelu_mul",
        );
        // f64 sums in both; the kernel's scale and products are f32, a few
        // ulps of the O(1) terms `norm * w` and `b`. Their sum can cancel to
        // near zero, so the error is measured against a floor of 0.1.
        compare(
            &node(Op::LayerNorm { eps: 1e-5 }, vec![a, w, bias], vec![o]),
            &mem,
            1e-5,
            0.1,
            "layer_norm",
        );
    }
}
