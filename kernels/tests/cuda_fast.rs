//! The CUDA kernels of numerics `fast` against the reference
//! implementation (f64 softmax attention) on fresh random inputs, with the
//! error bound each kernel states; the exact kernels' bit-identity is
//! tests/cuda_vs_cpu.rs's.
//!
//! Split decode attention: relative error |gpu - ref| / (|ref| + 1e-2) at
//! most 1e-4 (f32 accumulation of exp2f weights; measured ~1e-6); quantized
//! outputs equal the f32 output quantized by the CPU's quantizer; a second
//! launch over the same scratch gives the same bits (the arrival counters
//! reset); the fused q/k/v projections keep the CPU's bits for the cache
//! rows they write.

#![cfg(feature = "cuda")]

#[path = "cuda_fast/attention_prefill.rs"]
mod attention_prefill;
mod cuda_common;
#[path = "cuda_fast/matmul.rs"]
mod matmul;
#[path = "cuda_fast/matmul_id.rs"]
mod matmul_id;

use cuda_common::*;
use std::sync::{Arc, OnceLock};
use weft_kernels::cuda::cudarc::driver::CudaContext;
use weft_kernels::cuda::{CudaKernels, DeviceTensor};
use weft_kernels::Numerics;
use weft_ops::quant::{quantize_row, vec_dot_type};
use weft_ops::reference::{self, HostMemory};
use weft_ops::{AttentionParams, DType, Op, OpNode, RopeMode, RopeParams, Tensor};

/// The relative error bound of the split attention (see the module doc).
const TOLERANCE: f32 = 1e-4;

/// Fast kernels on the device of [`gpu`] (`None` without one).
fn fast() -> Option<&'static Gpu> {
    static FAST: OnceLock<Option<Gpu>> = OnceLock::new();
    FAST.get_or_init(|| {
        let g = gpu()?;
        let ctx: Arc<CudaContext> = g.ctx.clone();
        let ptx_cache = std::env::var_os("WEFT_CUDA_PTX_CACHE").map(std::path::PathBuf::from);
        let kernels = CudaKernels::with_numerics(ctx.clone(), ptx_cache.as_deref(), Numerics::Fast)
            .expect("fast kernels load");
        assert_eq!(kernels.numerics(), Numerics::Fast);
        Some(Gpu { ctx, kernels })
    })
    .as_ref()
}

#[allow(clippy::too_many_arguments)]
fn params(
    heads: usize,
    kv_heads: usize,
    d: usize,
    q_position: u32,
    window: Option<u32>,
    ring: Option<u32>,
    softcap: f32,
    capacity: usize,
) -> AttentionParams {
    AttentionParams {
        heads,
        kv_heads,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        q_position,
        window,
        ring,
        softcap,
        kv_capacity: capacity as u32,
        flash: true,
    }
}

/// (heads, kv_heads, head size, query rows, q_position, window, ring, soft cap).
type Case = (
    usize,
    usize,
    usize,
    usize,
    u32,
    Option<u32>,
    Option<u32>,
    f32,
);

/// A decode case: `n` query rows at `p.q_position` over caches of
/// `capacity` rows (random everywhere), viewed as `view_rows` rows.
#[allow(clippy::too_many_arguments)]
fn case(
    rng: &mut Rng,
    mem: &mut HostMemory,
    kv: DType,
    p: AttentionParams,
    n: usize,
    capacity: usize,
    view_rows: usize,
    out: DType,
) -> OpNode {
    let (heads, kvh, d) = (p.heads, p.kv_heads, p.head_dim);
    let q = mem
        .f32_tensor(&[n, heads * d], &rng.vec(n * heads * d, 1.5))
        .unwrap();
    let k = mem.zeros(kv, &[capacity, kvh * d]).unwrap();
    let v = mem.zeros(kv, &[capacity, kvh * d]).unwrap();
    mem.set_f32(&k, &rng.vec(capacity * kvh * d, 1.5)).unwrap();
    mem.set_f32(&v, &rng.vec(capacity * kvh * d, 1.0)).unwrap();
    let o = mem.zeros(out, &[n, heads * d]).unwrap();
    let op = if out == DType::F32 {
        Op::Attention(p)
    } else {
        Op::AttentionQuantize(p)
    };
    node(
        op,
        vec![
            q,
            k.rows_view(0, view_rows).unwrap(),
            v.rows_view(0, view_rows).unwrap(),
        ],
        vec![o],
    )
}

/// The reference output of attention node `nd` over the cells its step
/// reads (`extent` rows of the view).
fn reference_out(nd: &OpNode, mem: &HostMemory, extent: usize) -> Vec<f32> {
    let (Op::Attention(p) | Op::AttentionQuantize(p)) = nd.op else {
        panic!("not attention")
    };
    let mut m = mem.clone();
    let o = m
        .zeros(DType::F32, &[nd.inputs[0].rows(), nd.inputs[0].cols()])
        .unwrap();
    let r = OpNode::new(
        Op::Attention(p),
        vec![
            nd.inputs[0],
            nd.inputs[1].rows_view(0, extent).unwrap(),
            nd.inputs[2].rows_view(0, extent).unwrap(),
        ],
        vec![o],
    );
    reference::run(&r, &mut m).unwrap();
    m.to_f32(&o).unwrap()
}

fn worst_rel(got: &[f32], want: &[f32]) -> f32 {
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs() / (b.abs() + 1e-2))
        .fold(
            0f32,
            |m, e| if e.is_nan() { f32::INFINITY } else { m.max(e) },
        )
}

/// Runs `nd` with the fast kernels `launches` times over one scratch
/// buffer, the step scalars `step`; per launch, the bytes of every output.
/// Inputs no output shares a buffer with are marked constant, as the
/// runtime marks weights.
fn run_fast(
    g: &Gpu,
    nd: &OpNode,
    mem: &HostMemory,
    step: Vec<u32>,
    launches: usize,
) -> Vec<Vec<Vec<u8>>> {
    let stream = g.stream();
    g.kernels.supports(nd).expect("supports");
    g.kernels.prepare(nd, &stream).expect("prepare");
    let all: Vec<Tensor> = nd.inputs.iter().chain(&nd.outputs).copied().collect();
    let dev = DevMem::upload(&stream, mem, &all);
    let ins: Vec<DeviceTensor> = nd
        .inputs
        .iter()
        .map(|t| DeviceTensor {
            constant: nd.outputs.iter().all(|o| o.buffer != t.buffer),
            ..dev.tensor(&stream, t)
        })
        .collect();
    let outs: Vec<DeviceTensor> = nd.outputs.iter().map(|t| dev.tensor(&stream, t)).collect();
    let scratch = device_u8(&stream, g.kernels.scratch_bytes(nd));
    let step_buf = stream.clone_htod(&step).expect("step");
    let mut results = Vec::new();
    for _ in 0..launches {
        // SAFETY: every tensor lies inside its uploaded buffer; scratch and
        // step are sized by the kernels' own answers.
        unsafe {
            g.kernels
                .launch(
                    &stream,
                    nd,
                    &ins,
                    &outs,
                    ptr_of(&stream, &scratch),
                    ptr_of(&stream, &step_buf),
                )
                .expect("launch");
        }
        stream.synchronize().expect("kernel execution");
        results.push(nd.outputs.iter().map(|t| dev.read(&stream, t)).collect());
    }
    results
}

fn dequantize(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    let (block, quants) = match dtype {
        DType::Q8_0 => (34, 2),
        DType::Q8_1 => (36, 4),
        other => panic!("{other}"),
    };
    bytes
        .chunks(block)
        .flat_map(|b| {
            let d = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            b[quants..].iter().map(move |&q| d * q as i8 as f32)
        })
        .collect()
}

#[test]
fn split_attention_matches_the_reference() {
    let Some(g) = fast() else { return };
    let mut rng = Rng::new(71);
    let mut failures = Vec::new();
    let mut cases: Vec<Case> = Vec::new();
    for qp in [0u32, 1, 7, 100, 127, 128, 255, 700, 1500, 4100] {
        cases.push((9, 3, 64, 1, qp, None, None, 0.0)); // SmolLM2
    }
    for qp in [0u32, 300, 2049] {
        cases.push((4, 1, 256, 1, qp, None, None, 0.0)); // Gemma 3 270M
        cases.push((4, 1, 256, 1, qp, Some(512), None, 0.0)); // its local layers
        cases.push((14, 2, 64, 1, qp, None, None, 0.0)); // Qwen2.5-0.5B
        cases.push((8, 8, 128, 2, qp, None, None, 0.0)); // multi-head, two rows
    }
    cases.push((4, 1, 256, 1, 900, Some(512), Some(512), 0.0)); // a ring
    cases.push((6, 2, 64, 3, 20, Some(8), Some(12), 0.0));
    cases.push((6, 2, 64, 4, 3000, Some(300), None, 0.0));
    cases.push((4, 2, 96, 2, 640, None, None, 0.0));
    cases.push((4, 2, 32, 1, 333, None, None, 0.0));
    cases.push((2, 1, 192, 4, 1024, Some(40), None, 0.0));
    cases.push((8, 4, 128, 1, 2500, None, None, 30.0)); // soft cap
    for kv in [DType::F16, DType::F32] {
        for &(heads, kvh, d, n, qp, window, ring, softcap) in &cases {
            let extent = ring.map_or(qp as usize + n, |r| r as usize);
            // The natural view, then the whole cache with the extent in the
            // step scalars (a replayed decode graph).
            for capacity in [extent, extent + 1000] {
                let mut mem = HostMemory::default();
                let p = params(heads, kvh, d, qp, window, ring, softcap, capacity);
                let nd = case(&mut rng, &mut mem, kv, p, n, capacity, capacity, DType::F32);
                let want = reference_out(&nd, &mem, extent);
                poison_outputs(&nd, &mut mem);
                let step = vec![qp, extent as u32];
                let got: Vec<Vec<u8>> = run_fast(g, &nd, &mem, step.clone(), 2)
                    .into_iter()
                    .map(|mut outs| outs.remove(0))
                    .collect();
                let what = format!(
                    "{kv} h{heads}/{kvh} d{d} n={n} pos={qp} window={window:?} ring={ring:?} \
                     softcap={softcap} view={capacity}"
                );
                let values: &[f32] = bytemuck::cast_slice(&got[0]);
                let e = worst_rel(values, &want);
                if e > TOLERANCE {
                    failures.push(format!("{what}: worst relative error {e:e}"));
                }
                if got[0] != got[1] {
                    failures.push(format!("{what}: a second launch gave other bits"));
                }
                // Quantized outputs: the f32 output through the CPU's quantizer.
                for act in [DType::Q8_0, DType::Q8_1] {
                    let out = mem.zeros(act, &[n, heads * d]).unwrap();
                    let qn = node(Op::AttentionQuantize(p), nd.inputs.clone(), vec![out]);
                    poison_outputs(&qn, &mut mem);
                    let q = run_fast(g, &qn, &mem, step.clone(), 1).remove(0);
                    let mut expect = Vec::new();
                    for row in values.chunks(heads * d) {
                        expect.extend(quantized(act, row));
                    }
                    if q[0] != expect {
                        let a = dequantize(act, &q[0]);
                        let b = dequantize(act, &expect);
                        let diff = a
                            .iter()
                            .zip(&b)
                            .map(|(x, y)| (x - y).abs())
                            .fold(0f32, f32::max);
                        failures.push(format!(
                            "{what} -> {act}: quantized bytes differ (max {diff:e})"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "split attention:\n{}",
        failures.join("\n")
    );
}

fn quantized(dtype: DType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; dtype.row_bytes(x.len()).expect("whole blocks")];
    quantize_row(dtype, x, &mut q).expect("quantize");
    q
}

fn weights(rng: &mut Rng, mem: &mut HostMemory, dtype: DType, rows: usize, k: usize) -> Tensor {
    let mut bytes = Vec::new();
    for _ in 0..rows {
        bytes.extend(quantized(dtype, &rng.rows(1, k)));
    }
    mem.tensor(dtype, &[rows, k], &bytes).unwrap()
}

/// The fused q/k/v projections and decode attention in numerics `fast`:
/// the cache rows it writes are the CPU chain's bits, the attention output
/// the reference's over the chain's query and caches, quantized (one
/// quantization step per block), whether block 0 attends (short views) or
/// the split kernel after it.
#[test]
fn fused_qkv_split_attention_matches_the_chain() {
    let Some(g) = fast() else { return };
    let mut rng = Rng::new(72);
    let (heads, kvh, d, k, capacity) = (9usize, 3usize, 64usize, 576usize, 4096usize);
    let mut failures = Vec::new();
    for wdtype in [DType::Q4_1, DType::Q8_0] {
        for act in [DType::Q8_1, DType::Q8_0] {
            for qp in [0u32, 40, 255, 511, 700, 3000] {
                let mut mem = HostMemory::default();
                let adtype = vec_dot_type(wdtype);
                let xs = rng.rows(1, k);
                let x = mem
                    .tensor(adtype, &[1, k], &quantized(adtype, &xs))
                    .unwrap();
                let pos = mem
                    .tensor(DType::I32, &[1], bytemuck::cast_slice(&[qp as i32]))
                    .unwrap();
                let mut cache = |mem: &mut HostMemory| {
                    let c = mem.zeros(DType::F16, &[capacity, kvh * d]).unwrap();
                    mem.set_f32(&c, &rng.vec(capacity * kvh * d, 1.0)).unwrap();
                    c
                };
                let (kc, vc) = (cache(&mut mem), cache(&mut mem));
                let wq = weights(&mut rng, &mut mem, wdtype, heads * d, k);
                let wk = weights(&mut rng, &mut mem, wdtype, kvh * d, k);
                let wv = weights(&mut rng, &mut mem, wdtype, kvh * d, k);
                let q = mem.zeros(DType::F32, &[1, heads * d]).unwrap();
                let out = mem.zeros(act, &[1, heads * d]).unwrap();
                let rope = RopeParams::plain(RopeMode::Normal, d, d, 10000.0);
                let write = Some(weft_ops::RowsWrite {
                    start: qp,
                    ring: None,
                });
                let rows = |rope, write, ins, out| {
                    let bias = false;
                    node(Op::MatMulRows { rope, write, bias }, ins, vec![out])
                };
                let qn = rows(Some(rope), None, vec![x, wq, pos], q);
                let kn = rows(Some(rope), write, vec![x, wk, pos], kc);
                let vn = rows(None, write, vec![x, wv], vc);
                let p = params(heads, kvh, d, qp, None, None, 0.0, capacity);
                let an = node(Op::AttentionQuantize(p), vec![q, kc, vc], vec![out]);
                let mut fused = weft_ops::fused::fuse_pair(&qn, &an, false).expect("q fuses");
                for part in [&kn, &vn] {
                    fused = weft_ops::fused::fuse_pair(part, &fused, true).expect("k/v fuse");
                }
                fused.validate().expect("valid fused node");
                // The chain on the CPU: q, k, v rows (the GPU's bits), then
                // the reference attention over them.
                let mut chain = mem.clone();
                for part in [&qn, &kn, &vn] {
                    let outs = run_cpu(part, &chain);
                    for (t, b) in part.outputs.iter().zip(outs) {
                        chain.bytes_mut(t).copy_from_slice(&b);
                    }
                }
                let extent = qp as usize + 1;
                let want = reference_out(&an, &chain, extent);
                poison_outputs(&fused, &mut mem);
                // [q_position, the step's extent, the key's and value's row].
                let step = vec![qp, extent as u32, qp, qp];
                let got = run_fast(g, &fused, &mem, step, 1).remove(0);
                let what = format!("qkv+attention {wdtype} -> {act} pos={qp}");
                // Cache rows written: the chain's bits.
                for (i, c) in [kc, vc].into_iter().enumerate() {
                    let row = c.rows_view(qp as usize, 1).unwrap();
                    let off = (row.offset - c.offset) as usize;
                    let len = row.bytes() as usize;
                    if got[1 + i][off..off + len] != chain.bytes(&row)[..] {
                        failures.push(format!("{what}: cache row {i} differs from the chain"));
                    }
                }
                let a = dequantize(act, &got[0]);
                let blocks = a.len() / 32;
                for b in 0..blocks {
                    let block = &want[32 * b..32 * b + 32];
                    let step = block.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                    for (x, y) in a[32 * b..32 * b + 32].iter().zip(block) {
                        if (x - y).abs() > 1.01 * step + 1e-6 {
                            failures.push(format!("{what}: block {b}: {x} against {y}"));
                            break;
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "fused split attention:\n{}",
        failures.join("\n")
    );
}

/// f32 values of little-endian output bytes.
fn bytemuck_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Per output, the absolute sum of the products of activation row `x` and
/// weight row `w` for each `(x, w)` of `rows` (f32 values, rows of `k`).
fn abs_dot_sums(
    xf: &[f32],
    wf: &[f32],
    k: usize,
    rows: impl Iterator<Item = (usize, usize)>,
) -> Vec<f64> {
    rows.map(|(x, w)| {
        xf[x * k..(x + 1) * k]
            .iter()
            .zip(&wf[w * k..(w + 1) * k])
            .map(|(a, b)| (*a as f64 * *b as f64).abs())
            .sum()
    })
    .collect()
}

/// A product's outputs against the reference, each within `tol` of its
/// sum of |w x| (plus 1e-6): the worst relative error, and the first
/// output past the bound (index, value, reference).
fn within_product_bound(
    out: &[f32],
    want: &[f32],
    sums: &[f64],
    tol: f64,
) -> (f64, Option<(usize, f32, f32)>) {
    let mut worst = 0f64;
    let mut bad = None;
    for (i, (a, b)) in out.iter().zip(want).enumerate() {
        let err = (*a as f64 - *b as f64).abs();
        if err > tol * sums[i] + 1e-6 || err.is_nan() {
            bad.get_or_insert((i, *a, *b));
        }
        let rel = err / (sums[i] + 1e-30);
        if rel.is_finite() {
            worst = worst.max(rel);
        }
    }
    (worst, bad)
}
