//! The CPU kernels against the reference semantics in weft-ops: every op,
//! on seeded random inputs, with the tolerance stated per op. The element-
//! wise, norm, rope and attention cases are `weft_testkit::cases`' lists,
//! which the Metal harness (`metal_vs_cpu.rs`) runs too.

use weft_kernels::cpu;
use weft_ops::reference::{self, HostMemory};
use weft_ops::{AttentionParams, DType, Op, OpNode, RopeMode, RopeParams, Tensor};
use weft_testkit::cases::{self, OpCase};
use weft_testkit::host::{encoded_tensor, node, run_cpu, run_ref};
use weft_testkit::Rng;

#[path = "ops_vs_reference/family.rs"]
mod family;
#[path = "ops_vs_reference/fused.rs"]
mod fused;

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

/// The CPU kernels' bound against the reference for a shared case's op.
fn tolerance(node: &OpNode) -> (f32, f32) {
    match &node.op {
        // Exact in f32 up to the order of one operation.
        Op::Add | Op::Mul | Op::Scale { .. } => (1e-6, 1e-6),
        // silu uses expf: a few ulps.
        Op::SiluMul => (1e-5, 1e-5),
        // ggml's f16 table (see gelu_and_layer_norm_match_reference); the
        // product with |b| < 3 scales the error against the same floor.
        Op::Gelu => (2e-3, 1e-2),
        Op::GeluMul => (6e-3, 1e-2),
        // f64 sums in both; the scale differs by f32 rounding. A layer
        // norm's `norm * w + b` can cancel to near zero: a floor of 0.1.
        Op::RmsNorm { .. } => (1e-5, 1e-5),
        Op::LayerNorm { .. } => (1e-5, 0.1),
        Op::Softmax { .. } => (1e-5, 1e-6),
        // The kernel builds theta by repeated multiplication (as ggml
        // does), the reference with powf: the angle drifts by about
        // n_dims/2 ulps, i.e. ~4e-4 rad at position 190.
        Op::Rope(_) => (2e-3, 1e-2),
        // f16 caches: the kernel rounds q and its running output to f16
        // like llama.cpp (~1e-3 relative per step); f32: summation order.
        Op::Attention(_) if node.inputs[1].dtype == DType::F16 => (3e-2, 5e-2),
        Op::Attention(_) => (1e-4, 5e-2),
        op => panic!("no CPU tolerance for {}", op.name()),
    }
}

/// Every case of a shared list, CPU kernels against the reference.
fn check_cases(cases: Vec<OpCase>) {
    for c in cases {
        let (tol, floor) = tolerance(&c.node);
        compare(&c.node, &c.mem, tol, floor, &c.name);
    }
}

#[test]
fn elementwise_and_norm_match_reference() {
    check_cases(cases::elementwise(&mut Rng::new(1)));
}

#[test]
fn argmax_copy_and_rows_match_reference() {
    let mut rng = Rng::new(2);
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
    check_cases(cases::rope(&mut Rng::new(3)));
}

#[test]
fn moe_softmax_routing_matches_reference() {
    let mut rng = Rng::new(11);
    let mut mem = HostMemory::default();
    let (n, e, k) = (5, 8, 3);
    let mut probs = rng.vec(n * e, 1.0);
    probs[3] = probs[5]; // a tie: the lower id first
    let p = mem.f32_tensor(&[n, e], &probs).unwrap();
    let ids = mem.zeros(DType::I32, &[n, k]).unwrap();
    let w = mem.zeros(DType::F32, &[n, k]).unwrap();
    let top = node(Op::MoeTopK { k }, vec![p], vec![ids]);
    let got = run_cpu(&top, &mem, 2);
    assert_eq!(
        got.to_i32(&ids),
        run_ref(&top, &mem).to_i32(&ids),
        "moe_top_k"
    );
    for normalize in [false, true] {
        // The same sums in the same order: identical.
        compare(
            &node(Op::MoeGather { normalize }, vec![p, ids], vec![w]),
            &got,
            0.0,
            0.0,
            "moe_gather",
        );
    }
}

#[test]
fn attention_matches_reference() {
    check_cases(cases::attention(&mut Rng::new(4)));
}

#[test]
fn gelu_and_layer_norm_match_reference() {
    let mut rng = Rng::new(5);
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
        // gelu_mul scales that error by |b| < 2 against the same floor:
        // twice gelu's bound.
        compare(
            &node(Op::GeluMul, vec![a, b], vec![o]),
            &mem,
            4e-3,
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

/// The fast attention kernels against the f64 reference
/// ([`weft_testkit::checks::fast_attention_agrees`]).
#[test]
fn fast_attention_matches_reference() {
    weft_testkit::checks::fast_attention_agrees();
}
