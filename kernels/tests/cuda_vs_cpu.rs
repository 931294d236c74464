//! The CUDA kernels against weft's CPU kernels, on fresh random inputs.
//!
//! Every op on the SmolLM2 path must give the CPU's bits exactly (the CPU
//! kernels reproduce llama.cpp's x86 arithmetic, and activations are
//! re-quantized to 8 bits before every matmul, so any deviation cascades).
//! The other formats follow the CPU's order too and are checked bit for bit
//! as well; the stated exceptions (soft-capped attention, rope positions
//! past the angle table) are checked against a tolerance.
//!
//! Without a GPU every test prints why and passes; `WEFT_TEST_REQUIRE_CUDA=1`
//! makes that a failure (the device script sets it).

#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use weft_kernels::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use weft_kernels::cuda::DeviceTensor;
use weft_ops::quant::vec_dot_type;
use weft_ops::reference::HostMemory;
use weft_ops::{AttentionParams, DType, Op, RopeMode, RopeParams, Tensor};
use weft_testkit::host::quantized;

/// `rows` rows of random weights in `dtype`.
fn weights(rng: &mut Rng, mem: &mut HostMemory, dtype: DType, rows: usize, k: usize) -> Tensor {
    let mut bytes = Vec::with_capacity(dtype.row_bytes(k).unwrap() * rows);
    for _ in 0..rows {
        let row = rng.rows(1, k);
        bytes.extend(quantized(dtype, &row));
    }
    mem.tensor(dtype, &[rows, k], &bytes).unwrap()
}

#[test]
fn quantize_rows_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(1);
    for dtype in [
        DType::Q8_0,
        DType::Q8_1,
        DType::Q8_K,
        DType::F16,
        DType::BF16,
    ] {
        for (rows, cols) in [(1, 576), (7, 1536), (3, 2048), (64, 256)] {
            if dtype.row_bytes(cols).is_none() {
                continue;
            }
            let mut mem = HostMemory::default();
            let mut v = rng.rows(rows, cols);
            v[..32].fill(0.0); // one all-zero block: the amax == 0 path
            let x = mem.f32_tensor(&[rows, cols], &v).unwrap();
            let o = mem.zeros(dtype, &[rows, cols]).unwrap();
            let n = node(Op::QuantizeRows, vec![x], vec![o]);
            check_exact(g, &format!("quantize {dtype} {rows}x{cols}"), &n, &mut mem);
        }
    }
}

#[test]
fn matmul_bit_exact_every_format() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(2);
    let formats = [
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q4_K,
        DType::Q6_K,
        DType::F32,
        DType::F16,
        DType::BF16,
    ];
    let mut failures = Vec::new();
    for wdtype in formats {
        let k_list: &[usize] = match wdtype {
            DType::Q4_K | DType::Q6_K => &[256, 1536],
            // 16420: DeepSeek-V4's mixer rows (16384) plus a tail.
            DType::F32 | DType::F16 | DType::BF16 => &[576, 100, 1536, 16420],
            _ => &[576, 1536, 2400],
        };
        for &k in k_list {
            for (m, n) in [(576, 1), (192, 1), (100, 3), (576, 5), (64, 64), (132, 130)] {
                for f32_input in [false, true] {
                    let mut mem = HostMemory::default();
                    let w = weights(&mut rng, &mut mem, wdtype, m, k);
                    let adtype = vec_dot_type(wdtype);
                    let act = rng.rows(n, k);
                    let x = if f32_input || adtype == DType::F32 {
                        mem.f32_tensor(&[n, k], &act).unwrap()
                    } else {
                        let bytes: Vec<u8> =
                            act.chunks(k).flat_map(|r| quantized(adtype, r)).collect();
                        mem.tensor(adtype, &[n, k], &bytes).unwrap()
                    };
                    let o = mem.zeros(DType::F32, &[n, m]).unwrap();
                    let nd = node(Op::MatMul, vec![x, w], vec![o]);
                    let what = format!("matmul {wdtype} m={m} k={k} n={n} x={}", x.dtype);
                    poison_outputs(&nd, &mut mem);
                    let want = run_cpu(&nd, &mem);
                    let got = run_gpu(g, &nd, &mem);
                    if let Err(e) = std::panic::catch_unwind(|| {
                        assert_same(&what, DType::F32, &got[0], &want[0])
                    }) {
                        let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
                        eprintln!("{msg}");
                        failures.push(what);
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "matmul mismatches: {failures:?}");
}

/// Tall Q8_0 matvecs (the tied output projection and others of 8192 rows
/// or more) take the staged kernel, alone and as a one-node group; a last
/// block of fewer than 32 rows, rows ending inside a 16-byte piece, and
/// long rows (more shared memory than the default limit).
#[test]
fn smollm2_output_matvec_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(3);
    for (m, k) in [(49152, 576), (8200, 64), (8223, 1344), (8224, 2048)] {
        let mut mem = HostMemory::default();
        let w = weights(&mut rng, &mut mem, DType::Q8_0, m, k);
        let x = mem.f32_tensor(&[1, k], &rng.rows(1, k)).unwrap();
        let o = mem.zeros(DType::F32, &[1, m]).unwrap();
        let n = node(Op::MatMul, vec![x, w], vec![o]);
        check_exact(g, &format!("matmul q8_0 {m}x{k}"), &n, &mut mem);
        let xq = mem
            .tensor(
                DType::Q8_0,
                &[1, k],
                &quantized(DType::Q8_0, &rng.rows(1, k)),
            )
            .unwrap();
        let n = node(Op::MatMul, vec![xq, w], vec![o]);
        poison_outputs(&n, &mut mem);
        let got = run_gpu_group(g, std::slice::from_ref(&n), &mem);
        let want = run_cpu(&n, &mem).remove(0);
        assert_same(
            &format!("matmul q8_0 {m}x{k} (group of one)"),
            DType::F32,
            &got[0],
            &want,
        );
    }
}

#[test]
fn get_rows_and_copy_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(4);
    let tables = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
    ];
    for dtype in tables {
        let cols = 512;
        let mut mem = HostMemory::default();
        let values = rng.rows(40, cols);
        let bytes: Vec<u8> = if dtype == DType::F32 {
            bytemuck::cast_slice(&values).to_vec()
        } else {
            values
                .chunks(cols)
                .flat_map(|r| quantized(dtype, r))
                .collect()
        };
        let table = mem.tensor(dtype, &[40, cols], &bytes).unwrap();
        let ids: Vec<i32> = (0..9).map(|_| rng.below(40) as i32).collect();
        let idt = mem
            .tensor(DType::I32, &[9], bytemuck::cast_slice(&ids))
            .unwrap();
        let o = mem.zeros(DType::F32, &[9, cols]).unwrap();
        let n = node(Op::GetRows, vec![table, idt], vec![o]);
        check_exact(g, &format!("get_rows {dtype}"), &n, &mut mem);
        for dst in [DType::F32, DType::F16, DType::BF16] {
            let o = mem.zeros(dst, &[40, cols]).unwrap();
            let n = weft_ops::OpNode::new(Op::Copy, vec![table], vec![o]);
            if n.validate().is_err() {
                continue;
            }
            check_exact(g, &format!("copy {dtype} -> {dst}"), &n, &mut mem);
        }
    }
}

#[test]
fn set_rows_bit_exact_with_step_scalars() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(5);
    for dst in [DType::F16, DType::BF16, DType::F32] {
        for (start, ring) in [(3u32, None), (14, Some(8u32)), (0, None)] {
            let mut mem = HostMemory::default();
            let x = mem.f32_tensor(&[5, 192], &rng.rows(5, 192)).unwrap();
            let cache = mem.zeros(dst, &[24, 192]).unwrap();
            mem.set_f32(&cache, &rng.vec(24 * 192, 1.0)).unwrap();
            let n = node(Op::SetRows { start, ring }, vec![x], vec![cache]);
            check_exact(
                g,
                &format!("set_rows {dst} start {start} ring {ring:?}"),
                &n,
                &mut mem,
            );
            // The same launch, its start taken from the step buffer.
            if g.is_none() {
                continue;
            }
            let other = node(
                Op::SetRows {
                    start: start + 2,
                    ring,
                },
                vec![x],
                vec![cache],
            );
            let want = run_cpu(&other, &mem);
            let got = run_gpu_with(g, &n, &mem, Some(vec![start + 2]));
            assert_same(&format!("set_rows {dst} via step"), dst, &got[0], &want[0]);
        }
    }
}

#[test]
fn norms_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(6);
    let mut shapes: Vec<(usize, usize, Vec<f32>)> = Vec::new();
    for (rows, cols) in [(1, 576), (9, 576), (3, 1000), (2, 8192), (5, 640), (4, 64)] {
        shapes.push((rows, cols, rng.rows(rows, cols)));
    }
    // Adversarial rows: magnitudes spread over 2^-60..2^10, repeated values
    // (ties in the f64 sum), a row of ones (exact powers of two).
    let spread: Vec<f32> = (0..576)
        .map(|i| 2f32.powi((i % 70) - 60) * if i % 3 == 0 { -1.0 } else { 1.5 })
        .collect();
    shapes.push((1, 576, spread));
    shapes.push((1, 576, vec![1.0; 576]));
    let ties: Vec<f32> = (0..576)
        .map(|i| {
            if i == 0 {
                4096.0
            } else {
                2f32.powi(-9) * (1.0 + (i % 5) as f32)
            }
        })
        .collect();
    shapes.push((1, 576, ties));
    for (rows, cols, values) in &shapes {
        let mut mem = HostMemory::default();
        let (rows, cols) = (*rows, *cols);
        let x = mem.f32_tensor(&[rows, cols], values).unwrap();
        let w = mem.f32_tensor(&[cols], &rng.vec(cols, 1.5)).unwrap();
        let b = mem.f32_tensor(&[cols], &rng.vec(cols, 0.5)).unwrap();
        let o = mem.zeros(DType::F32, &[rows, cols]).unwrap();
        let n = node(Op::RmsNorm { eps: 1e-5 }, vec![x, w], vec![o]);
        check_exact(g, &format!("rms_norm {rows}x{cols}"), &n, &mut mem);
        let n = node(Op::LayerNorm { eps: 1e-6 }, vec![x, w, b], vec![o]);
        check_exact(g, &format!("layer_norm {rows}x{cols}"), &n, &mut mem);
        let n = node(Op::Softmax { scale: 0.37 }, vec![x], vec![o]);
        check_exact(g, &format!("softmax {rows}x{cols}"), &n, &mut mem);
    }
}

/// The bounded method (the default) on rows built to defeat it: the f32
/// mean of `t0 + (many tiny terms)` where `t0 / n` lies on an f32 rounding
/// midpoint, so the order of the sum decides the rounding. Such rows must
/// fall back and still give the CPU's bits; random activation rows must not
/// fall back.
#[test]
fn bounded_sum_falls_back_where_the_order_decides() {
    let Some(g) = gpu() else { return };
    let stream = g.stream();
    let mut rng = Rng::new(29);
    let cpu_mean = |ts: &[f64]| {
        let mut s = 0f64;
        for t in ts {
            s += t;
        }
        (s / ts.len() as f64) as f32
    };
    let mut forced = 0;
    for n in [64usize, 576, 1536] {
        for k in 0..8 {
            // An f32 m plus half its ulp: a midpoint between two f32s.
            let m = 1.0f32 + (1 + k) as f32 * 2f32.powi(-20);
            let mid = m as f64 + 2f64.powi(-24);
            let tiny = mid * n as f64 * 2f64.powi(-60) * (1.0 + rng.val(0.5).abs() as f64);
            let mut ts = vec![tiny; n];
            ts[0] = mid * n as f64;
            let (got, fell_back) =
                weft_kernels::cuda::testing::bounded_mean(&g.kernels, &stream, &ts).unwrap();
            let want = cpu_mean(&ts);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "midpoint row n = {n}, k = {k}"
            );
            forced += fell_back as usize;
        }
    }
    assert_eq!(forced, 24, "every midpoint row must fall back");
    let mut fallbacks = 0;
    for r in 0..200 {
        let n = [576, 1536, 640, 2048][r % 4];
        let ts: Vec<f64> = rng.rows(1, n).iter().map(|v| (v * v) as f64).collect();
        let (got, fell_back) =
            weft_kernels::cuda::testing::bounded_mean(&g.kernels, &stream, &ts).unwrap();
        assert_eq!(got.to_bits(), cpu_mean(&ts).to_bits(), "activation row {r}");
        fallbacks += fell_back as usize;
    }
    println!("bounded f64 sums of activation squares: {fallbacks} of 200 fell back");
    assert!(
        fallbacks <= 2,
        "{fallbacks} of 200 activation rows fell back"
    );
}

#[test]
fn exact_sequential_sum_matches_the_cpu_loop() {
    let Some(g) = gpu() else { return };
    let stream = g.stream();
    let mut rng = Rng::new(7);
    let mut cases: Vec<Vec<f64>> = Vec::new();
    for n in [1, 5, 31, 576, 1000, 8192, 20000] {
        for kind in 0..6 {
            let v: Vec<f64> = (0..n)
                .map(|i| {
                    let x = rng.val(1.0);
                    match kind {
                        0 => (x * x) as f64,
                        1 => ((x * 2f32.powi(rng.below(60) as i32 - 40)).powi(2)) as f64,
                        2 => 2f64.powi(-(rng.below(30) as i32)) * (1 + rng.below(4)) as f64,
                        3 => {
                            if i == 0 {
                                1e6
                            } else {
                                (x * 1e-3) as f64 * (x as f64)
                            }
                        }
                        4 => 1.0 + (i % 2) as f64 * 2f64.powi(-53),
                        _ => ((x as f64) * (x as f64)) * 2f64.powi(rng.below(20) as i32),
                    }
                })
                .collect();
            cases.push(v);
        }
    }
    for (c, ts) in cases.iter().enumerate() {
        let mut want = 0f64;
        for t in ts {
            want += t;
        }
        let (got, _) = weft_kernels::cuda::testing::seq_sum(&g.kernels, &stream, ts).unwrap();
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "case {c} (n = {}): gpu {got:e} cpu {want:e}",
            ts.len()
        );
    }
    // Squares of activation rows must take the fast path (the fallback is
    // for partial sums within n 2^-50 of a power of two, or too many
    // binade changes in one lane).
    let mut fallbacks = 0;
    for r in 0..200 {
        let n = [576, 1536, 640, 2048][r % 4];
        let ts: Vec<f64> = rng.rows(1, n).iter().map(|v| (v * v) as f64).collect();
        let mut want = 0f64;
        for t in &ts {
            want += t;
        }
        let (got, fell_back) =
            weft_kernels::cuda::testing::seq_sum(&g.kernels, &stream, &ts).unwrap();
        assert_eq!(got.to_bits(), want.to_bits(), "activation row {r}");
        fallbacks += fell_back as usize;
    }
    println!(
        "exact f64 sums of activation squares: {fallbacks} of 200 took the sequential fallback"
    );
    assert!(
        fallbacks <= 2,
        "{fallbacks} of 200 activation rows took the sequential fallback"
    );
}

#[test]
fn elementwise_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(8);
    for (rows, cols) in [(1, 1536), (7, 576), (3, 100)] {
        let mut mem = HostMemory::default();
        let a = mem
            .f32_tensor(&[rows, cols], &rng.rows(rows, cols))
            .unwrap();
        let b = mem
            .f32_tensor(&[rows, cols], &rng.rows(rows, cols))
            .unwrap();
        let b1 = mem.f32_tensor(&[1, cols], &rng.vec(cols, 2.0)).unwrap();
        let big = mem
            .f32_tensor(&[rows, cols], &rng.vec(rows * cols, 30.0))
            .unwrap();
        let o = mem.zeros(DType::F32, &[rows, cols]).unwrap();
        for (what, n) in [
            ("add", node(Op::Add, vec![a, b], vec![o])),
            ("add broadcast", node(Op::Add, vec![a, b1], vec![o])),
            ("mul", node(Op::Mul, vec![a, b], vec![o])),
            ("mul broadcast", node(Op::Mul, vec![a, b1], vec![o])),
            ("scale", node(Op::Scale { factor: 0.37 }, vec![a], vec![o])),
            ("silu_mul", node(Op::SiluMul, vec![a, b], vec![o])),
            ("silu_mul wide", node(Op::SiluMul, vec![big, b], vec![o])),
            ("gelu", node(Op::Gelu, vec![big], vec![o])),
            ("gelu_mul", node(Op::GeluMul, vec![big, b], vec![o])),
        ] {
            check_exact(g, &format!("{what} {rows}x{cols}"), &n, &mut mem);
        }
    }
}

/// Ties, NaNs, infinities and signed zeros, on rows long enough for the
/// eight-block cluster (aligned or not, whole 16-byte pieces or not) and on
/// a short row (one block).
#[test]
fn argmax_lowest_index_on_ties() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(9);
    for c in [49152, 49150, 4099, 1000] {
        let mut v = rng.vec(6 * c, 4.0);
        v[3] = 9.0; // row 0: ties at 3 and at 4/5 of the row (another block)
        v[c * 4 / 5] = 9.0;
        v[c] = f32::NAN; // row 1: NaN at index 0
        v[2 * c + 7] = f32::NAN; // row 2: a NaN elsewhere
        v[3 * c..4 * c].fill(f32::NEG_INFINITY); // row 3: all -inf
        for x in &mut v[4 * c..5 * c] {
            *x = -x.abs() - 1.0;
        }
        v[4 * c + 100] = -0.0; // row 4: +-0 ties at the top
        v[4 * c + c / 2] = 0.0;
        let mut mem = HostMemory::default();
        let x = mem.f32_tensor(&[6, c], &v).unwrap();
        let o = mem.zeros(DType::I32, &[6]).unwrap();
        let n = node(Op::Argmax, vec![x], vec![o]);
        check_exact(g, &format!("argmax 6x{c}"), &n, &mut mem);
    }
}

#[test]
fn rope_bit_exact_from_the_angle_table() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(10);
    let (rows, heads, d) = (7, 3, 64);
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for n_dims in [64, 32] {
            for yarn in [false, true] {
                let mut p = RopeParams::plain(mode, d, n_dims, 100000.0);
                if yarn {
                    p.ext_factor = 1.0;
                    p.freq_scale = 0.25;
                    p.orig_ctx = 4096;
                    p.base = 10000.0;
                }
                let mut mem = HostMemory::default();
                let x = mem
                    .f32_tensor(&[rows, heads * d], &rng.rows(rows, heads * d))
                    .unwrap();
                let pos: Vec<i32> = (0..rows)
                    .map(|i| [0, 1, 5, 255, 1023, 4097, 32767][i])
                    .collect();
                let pt = mem
                    .tensor(DType::I32, &[rows], bytemuck::cast_slice(&pos))
                    .unwrap();
                let o = mem.zeros(DType::F32, &[rows, heads * d]).unwrap();
                let n = node(Op::Rope(p), vec![x, pt], vec![o]);
                check_exact(
                    g,
                    &format!("rope {mode:?} n_dims {n_dims} yarn {yarn}"),
                    &n,
                    &mut mem,
                );
                // Past the table: CUDA's cosf/sinf, within a few ulp.
                let far: Vec<i32> = (0..rows as i32).map(|i| 40000 + 977 * i).collect();
                let ft = mem
                    .tensor(DType::I32, &[rows], bytemuck::cast_slice(&far))
                    .unwrap();
                let n = node(Op::Rope(p), vec![x, ft], vec![o]);
                let want = run_cpu(&n, &mem);
                let got = run_gpu(g, &n, &mem);
                let e = max_rel(&got[0], &want[0], 1e-2);
                println!(
                    "rope past the table ({mode:?}, {n_dims}, yarn {yarn}): max rel error {e:e}"
                );
                assert!(e < 1e-3, "rope past the table: {e}");
            }
        }
    }
}

/// An attention case: `n` query rows at `q_position`, a cache view of
/// `kv_rows` rows (filled with random values everywhere).
#[allow(clippy::too_many_arguments)]
fn attention_case(
    rng: &mut Rng,
    mem: &mut HostMemory,
    kv: DType,
    heads: usize,
    kv_heads: usize,
    d: usize,
    n: usize,
    q_position: u32,
    kv_rows: usize,
    window: Option<u32>,
    ring: Option<u32>,
    softcap: f32,
) -> weft_ops::OpNode {
    let q = mem
        .f32_tensor(&[n, heads * d], &rng.vec(n * heads * d, 1.5))
        .unwrap();
    let k = mem.zeros(kv, &[kv_rows, kv_heads * d]).unwrap();
    let v = mem.zeros(kv, &[kv_rows, kv_heads * d]).unwrap();
    mem.set_f32(&k, &rng.vec(kv_rows * kv_heads * d, 1.5))
        .unwrap();
    mem.set_f32(&v, &rng.vec(kv_rows * kv_heads * d, 1.0))
        .unwrap();
    let o = mem.zeros(DType::F32, &[n, heads * d]).unwrap();
    let p = AttentionParams {
        heads,
        kv_heads,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        q_position,
        window,
        ring,
        softcap,
        kv_capacity: 0,
        flash: true,
    };
    node(Op::Attention(p), vec![q, k, v], vec![o])
}

#[test]
fn attention_bit_exact_in_all_three_variants() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(11);
    let mut failures = Vec::new();
    // (kv, heads, kv_heads, d, n, q_position, window, ring)
    let mut cases = Vec::new();
    for kv in [DType::F16, DType::F32] {
        // decode: one chunk (n_kv < 512) and split KV (n_kv >= 512); the
        // one-pass path's groups of 8 cells (whole, odd and empty tails)
        for qp in [0u32, 7, 9, 15, 16, 23, 63, 255, 256, 300, 511, 700, 1023] {
            cases.push((kv, 9, 3, 64, 1, qp, None, None));
        }
        // one-pass decode: wider heads, a window, a ring (the slot this
        // step wrote in the middle of the cells)
        cases.push((kv, 4, 1, 256, 1, 40, None, None));
        cases.push((kv, 8, 2, 128, 1, 100, None, None));
        cases.push((kv, 6, 2, 64, 1, 200, Some(50), None));
        cases.push((kv, 6, 2, 64, 1, 20, Some(8), Some(12)));
        // short prefill (one chunk), tiled, tiled + one-chunk remainder
        for (n, qp) in [
            (5, 0),
            (37, 20),
            (64, 0),
            (100, 30),
            (130, 0),
            (520, 0),
            (600, 7),
        ] {
            cases.push((kv, 9, 3, 64, n, qp, None, None));
        }
        // windows and rings
        cases.push((kv, 6, 2, 64, 4, 20, Some(8), Some(12)));
        cases.push((kv, 6, 2, 64, 3, 5, Some(4), None));
        cases.push((kv, 6, 2, 64, 100, 40, Some(50), None));
        cases.push((kv, 6, 2, 64, 1, 900, Some(512), Some(512)));
        cases.push((kv, 4, 4, 64, 70, 100, Some(64), Some(96)));
        // wider heads (Gemma 3: 4 heads over 1, head size 256)
        cases.push((kv, 4, 1, 256, 1, 600, None, None));
        cases.push((kv, 4, 1, 256, 9, 3, None, None));
        cases.push((kv, 4, 1, 256, 80, 0, Some(512), None));
        cases.push((kv, 8, 2, 128, 66, 10, None, None));
        // head sizes that are not multiples of 64 (partly idle threads)
        cases.push((kv, 4, 2, 96, 70, 5, None, None));
        cases.push((kv, 4, 2, 32, 64, 0, None, None));
        cases.push((kv, 2, 1, 192, 65, 0, Some(40), None));
    }
    for (kv, heads, kvh, d, n, qp, window, ring) in cases {
        let mut mem = HostMemory::default();
        let rows = ring.map_or(qp as usize + n, |r| r as usize);
        let nd = attention_case(
            &mut rng, &mut mem, kv, heads, kvh, d, n, qp, rows, window, ring, 0.0,
        );
        let what = format!(
            "attention {kv} h{heads}/{kvh} d{d} n={n} pos={qp} window={window:?} ring={ring:?}"
        );
        poison_outputs(&nd, &mut mem);
        let want = run_cpu(&nd, &mem);
        let got = run_gpu(g, &nd, &mem);
        if let Err(e) =
            std::panic::catch_unwind(|| assert_same(&what, DType::F32, &got[0], &want[0]))
        {
            eprintln!(
                "{}",
                e.downcast_ref::<String>().cloned().unwrap_or_default()
            );
            failures.push(what);
        }
    }
    assert!(failures.is_empty(), "attention mismatches: {failures:?}");
}

/// A decode matvec fused with its rows' consumer (rope, a cache write, or
/// both): the CPU's matmul, rope and set_rows, bit for bit; rotated heads of
/// 64 with all or half of their dimensions rotated, f32/f16/bf16 caches, a
/// ring, and short and long rows.
#[test]
fn matmul_rows_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(31);
    for wdtype in [DType::Q4_1, DType::Q8_0, DType::Q4_0, DType::Q5_0] {
        for (m, k) in [(192, 576), (576, 1536)] {
            let adtype = vec_dot_type(wdtype);
            for n_dims in [64, 32] {
                let rope = RopeParams::plain(RopeMode::Normal, 64, n_dims, 100000.0);
                for (cache, start, ring) in [
                    (None, 0u32, None),
                    (Some(DType::F16), 7, None),
                    (Some(DType::F32), 40, Some(16u32)),
                    (Some(DType::BF16), 3, None),
                ] {
                    for with_rope in [true, false] {
                        if !with_rope && cache.is_none() {
                            continue;
                        }
                        let mut mem = HostMemory::default();
                        let w = weights(&mut rng, &mut mem, wdtype, m, k);
                        let act = rng.rows(1, k);
                        let x = mem
                            .tensor(adtype, &[1, k], &quantized(adtype, &act))
                            .unwrap();
                        let pos = mem
                            .tensor(DType::I32, &[1], bytemuck::cast_slice(&[start as i32 + 3]))
                            .unwrap();
                        let out = match cache {
                            None => mem.zeros(DType::F32, &[1, m]).unwrap(),
                            Some(d) => {
                                let c = mem.zeros(d, &[48, m]).unwrap();
                                mem.set_f32(&c, &rng.vec(48 * m, 1.0)).unwrap();
                                c
                            }
                        };
                        let write = cache.map(|_| weft_ops::RowsWrite { start, ring });
                        let (inputs, rope_p) = if with_rope {
                            (vec![x, w, pos], Some(rope))
                        } else {
                            (vec![x, w], None)
                        };
                        let nd = node(
                            Op::MatMulRows {
                                rope: rope_p,
                                write,
                            },
                            inputs,
                            vec![out],
                        );
                        let what = format!(
                            "{} {wdtype} {m}x{k} rope dims {n_dims} cache {cache:?} at {start} ring {ring:?}",
                            nd.op.name()
                        );
                        check_exact(g, &what, &nd, &mut mem);
                    }
                }
            }
        }
    }
}

/// Decode matvecs of one activation row in one launch (a layer's q, k and
/// v): every node's output bit for bit the CPU's, for rope-only, rope and
/// cache write, cache write only (a ring) and plain nodes, groups of two and
/// three, short and long rows.
#[test]
fn grouped_decode_matvecs_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(41);
    for wdtype in [DType::Q4_1, DType::Q8_0, DType::Q4_0, DType::Q5_0] {
        for k in [576, 1536] {
            let adtype = vec_dot_type(wdtype);
            let mut mem = HostMemory::default();
            let act = rng.rows(1, k);
            let x = mem
                .tensor(adtype, &[1, k], &quantized(adtype, &act))
                .unwrap();
            let pos = mem
                .tensor(DType::I32, &[1], bytemuck::cast_slice(&[21i32]))
                .unwrap();
            let rope = RopeParams::plain(RopeMode::Normal, 64, 64, 100000.0);
            let mut cache = |mem: &mut HostMemory, d: DType, m: usize| {
                let c = mem.zeros(d, &[24, m]).unwrap();
                mem.set_f32(&c, &rng.vec(24 * m, 1.0)).unwrap();
                c
            };
            let (kc, vc) = (
                cache(&mut mem, DType::F16, 192),
                cache(&mut mem, DType::BF16, 192),
            );
            let wq = weights(&mut rng, &mut mem, wdtype, 576, k);
            let wk = weights(&mut rng, &mut mem, wdtype, 192, k);
            let wv = weights(&mut rng, &mut mem, wdtype, 192, k);
            let wp = weights(&mut rng, &mut mem, wdtype, 40, k);
            let q = mem.zeros(DType::F32, &[1, 576]).unwrap();
            let p = mem.zeros(DType::F32, &[1, 40]).unwrap();
            let rows = |rope, write, ins, out| node(Op::MatMulRows { rope, write }, ins, vec![out]);
            let write = |start, ring| Some(weft_ops::RowsWrite { start, ring });
            let qn = rows(Some(rope), None, vec![x, wq, pos], q);
            let kn = rows(Some(rope), write(21, None), vec![x, wk, pos], kc);
            let vn = rows(None, write(30, Some(16)), vec![x, wv], vc);
            let pn = node(Op::MatMul, vec![x, wp], vec![p]);
            for group in [
                vec![qn.clone(), kn.clone(), vn.clone()],
                vec![vn.clone(), pn.clone()],
                vec![pn, kn, qn],
            ] {
                for n in &group {
                    poison_outputs(n, &mut mem);
                }
                let got = run_gpu_group(g, &group, &mem);
                for (n, got) in group.iter().zip(&got) {
                    let want = run_cpu(n, &mem).remove(0);
                    let what = format!(
                        "{} {wdtype} k={k} in a group of {}",
                        n.op.name(),
                        group.len()
                    );
                    assert_same(&what, n.outputs[0].dtype, got, &want);
                }
            }
        }
    }
}

/// The feed-forward's middle fused: gate projection (and up projection),
/// silu_mul and quantize, bit for bit with the CPU's chain; short and long
/// rows (two rounds of weight loads).
#[test]
fn matmul_silu_quantize_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(37);
    for wdtype in [DType::Q4_1, DType::Q8_0, DType::Q4_0, DType::Q5_0] {
        // Gate/up rows staged in shared memory (a cluster of two 16-row blocks)
        // where they fit in 48 KiB: all shapes here but Q8_0 at 1536 columns.
        for (m, k) in [(1536, 576), (96, 1024), (32, 64), (64, 1536)] {
            for out_dtype in [DType::Q8_1, DType::Q8_0] {
                for up in [true, false] {
                    let mut mem = HostMemory::default();
                    let adtype = vec_dot_type(wdtype);
                    let wg = weights(&mut rng, &mut mem, wdtype, m, k);
                    let third = if up {
                        weights(&mut rng, &mut mem, wdtype, m, k)
                    } else {
                        mem.f32_tensor(&[1, m], &rng.vec(m, 2.0)).unwrap()
                    };
                    let act = rng.rows(1, k);
                    let x = mem
                        .tensor(adtype, &[1, k], &quantized(adtype, &act))
                        .unwrap();
                    let out = mem.zeros(out_dtype, &[1, m]).unwrap();
                    let nd = node(Op::MatMulSiluQuantize { up }, vec![x, wg, third], vec![out]);
                    let what = format!("{} {wdtype} {m}x{k} -> {out_dtype}", nd.op.name());
                    check_exact(g, &what, &nd, &mut mem);
                }
            }
        }
    }
}

/// Attention fused with quantize (the one-chunk kernel writes Q8_0 / Q8_1
/// blocks): the CPU's attention then quantize, bit for bit.
#[test]
fn attention_quantize_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(23);
    for kv in [DType::F16, DType::F32] {
        for act in [DType::Q8_1, DType::Q8_0] {
            for (heads, kvh, d, n, qp) in [
                (9, 3, 64, 1, 0u32),
                (9, 3, 64, 1, 200),
                (9, 3, 64, 1, 700),
                (4, 1, 256, 1, 40),
                (9, 3, 64, 7, 40),
                (4, 1, 256, 1, 300),
            ] {
                let mut mem = HostMemory::default();
                let rows = qp as usize + n;
                let a = attention_case(
                    &mut rng, &mut mem, kv, heads, kvh, d, n, qp, rows, None, None, 0.0,
                );
                let Op::Attention(p) = a.op else {
                    unreachable!()
                };
                let out = mem.zeros(act, &[n, heads * d]).unwrap();
                let nd = node(Op::AttentionQuantize(p), a.inputs.clone(), vec![out]);
                let what =
                    format!("attention+quantize {kv} -> {act} h{heads}/{kvh} d{d} n={n} pos={qp}");
                check_exact(g, &what, &nd, &mut mem);
            }
        }
    }
}

#[test]
fn attention_decode_over_the_whole_cache_with_step_scalars() {
    // A decode replay passes the whole cache as the K/V views and the real
    // extent in the step scalars; the result must equal the node recorded
    // with the natural view.
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(12);
    let capacity = 1024;
    for kv in [DType::F16, DType::F32] {
        for qp in [3u32, 255, 256, 511, 777] {
            let mut mem = HostMemory::default();
            let whole = attention_case(
                &mut rng, &mut mem, kv, 9, 3, 64, 1, qp, capacity, None, None, 0.0,
            );
            let (q, k, v, o) = (
                whole.inputs[0],
                whole.inputs[1],
                whole.inputs[2],
                whole.outputs[0],
            );
            let natural_rows = qp as usize + 1;
            let kn = k.rows_view(0, natural_rows).unwrap();
            let vn = v.rows_view(0, natural_rows).unwrap();
            let Op::Attention(p) = whole.op else {
                unreachable!()
            };
            let natural = node(Op::Attention(p), vec![q, kn, vn], vec![o]);
            poison_outputs(&natural, &mut mem);
            let want = run_cpu(&natural, &mem);
            let scalars = g.kernels.step_scalars(&natural);
            let got = run_gpu_with(Some(g), &whole, &mem, Some(scalars));
            assert_same(
                &format!("attention {kv} whole-cache decode at {qp}"),
                DType::F32,
                &got[0],
                &want[0],
            );
        }
    }
}

#[test]
fn attention_softcap_within_tolerance() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(13);
    for (n, qp) in [(1, 40), (7, 0), (70, 3)] {
        let mut mem = HostMemory::default();
        let nd = attention_case(
            &mut rng,
            &mut mem,
            DType::F16,
            4,
            2,
            64,
            n,
            qp,
            qp as usize + n,
            None,
            None,
            30.0,
        );
        let want = run_cpu(&nd, &mem);
        let got = run_gpu(g, &nd, &mem);
        let e = max_rel(&got[0], &want[0], 1e-2);
        println!("attention softcap n={n}: max rel error {e:e}");
        assert!(e < 2e-2, "softcap attention error {e}");
    }
}

/// glibc 2.36's `expf` (x86-64 `__expf_fma`), the reference llama.cpp ran
/// with; equal to that glibc's `expf` on all 2^32 inputs (checked on the
/// development machine).
fn glibc_236_expf(x: f32) -> f32 {
    const TAB: [u64; 32] = [
        0x3ff0000000000000,
        0x3fefd9b0d3158574,
        0x3fefb5586cf9890f,
        0x3fef9301d0125b51,
        0x3fef72b83c7d517b,
        0x3fef54873168b9aa,
        0x3fef387a6e756238,
        0x3fef1e9df51fdee1,
        0x3fef06fe0a31b715,
        0x3feef1a7373aa9cb,
        0x3feedea64c123422,
        0x3feece086061892d,
        0x3feebfdad5362a27,
        0x3feeb42b569d4f82,
        0x3feeab07dd485429,
        0x3feea47eb03a5585,
        0x3feea09e667f3bcd,
        0x3fee9f75e8ec5f74,
        0x3feea11473eb0187,
        0x3feea589994cce13,
        0x3feeace5422aa0db,
        0x3feeb737b0cdc5e5,
        0x3feec49182a3f090,
        0x3feed503b23e255d,
        0x3feee89f995ad3ad,
        0x3feeff76f2fb5e47,
        0x3fef199bdd85529c,
        0x3fef3720dcef9069,
        0x3fef5818dcfba487,
        0x3fef7c97337b9b5f,
        0x3fefa4afa2a490da,
        0x3fefd0765b6e4540,
    ];
    let n = 32.0f64;
    let invln2n = f64::from_bits(0x3ff71547652b82fe) * n;
    let shift = f64::from_bits(0x4338000000000000);
    let c0 = f64::from_bits(0x3fac6af84b912394) / n / n / n;
    let c1 = f64::from_bits(0x3fcebfce50fac4f3) / n / n;
    let c2 = f64::from_bits(0x3fe62e42ff0c52d6) / n;
    let ux = x.to_bits();
    let abstop = (ux >> 20) & 0x7ff;
    if abstop >= 0x42b {
        if ux == 0xff800000 {
            return 0.0;
        }
        if abstop >= 0x7f8 {
            return x + x;
        }
        if x > f32::from_bits(0x42b17217) {
            return f32::INFINITY;
        }
        if x < f32::from_bits(0xc2cff1b4) {
            return 0.0;
        }
    }
    let xd = x as f64;
    let kd0 = invln2n.mul_add(xd, shift);
    let ki = kd0.to_bits();
    let kd = kd0 - shift;
    let r = invln2n.mul_add(xd, -kd);
    let s = f64::from_bits(TAB[(ki % 32) as usize].wrapping_add(ki << 47));
    let z = c0.mul_add(r, c1);
    let r2 = r * r;
    let y = c2.mul_add(r, 1.0);
    let y = z.mul_add(r2, y);
    (y * s) as f32
}

#[test]
fn glibc_expf_port_matches_glibc() {
    let Some(g) = gpu() else { return };
    let stream = g.stream();
    let mut rng = Rng::new(14);
    let mut batch: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        88.0,
        88.72,
        88.7228,
        89.0,
        -87.0,
        -103.0,
        -103.97,
        -104.0,
        -150.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        1e-30,
        -1e-30,
    ];
    batch.extend((0..1_000_000).map(|_| rng.val(110.0)));
    let (mut checked, mut port_bad, mut host_bad) = (0usize, 0usize, 0usize);
    let (mut first_port, mut first_host) = (None, None);
    while checked < 100_000_000 {
        let got = weft_kernels::cuda::testing::glibc_expf(&g.kernels, &stream, &batch).unwrap();
        for (x, y) in batch.iter().zip(&got) {
            let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            let port = glibc_236_expf(*x);
            if !same(port, *y) {
                port_bad += 1;
                first_port.get_or_insert((*x, *y, port));
            }
            if !same(x.exp(), port) {
                host_bad += 1;
                first_host.get_or_insert((*x, x.exp(), port));
            }
        }
        checked += batch.len();
        batch = (0..9_900_000)
            .map(|i| {
                if i % 2 == 0 {
                    f32::from_bits(rng.next() as u32)
                } else {
                    -rng.unit() * 40.0
                }
            })
            .collect();
    }
    println!("glibc expf: {checked} inputs; device vs glibc-2.36 port: {port_bad} differ (first {first_port:?})");
    if host_bad > 0 {
        println!(
            "NOTE: this machine's libm expf differs from glibc 2.36's on {host_bad} inputs (first {first_host:?}): \
             CPU-vs-CUDA comparisons of attention and softmax here inherit that difference"
        );
    } else {
        println!("this machine's libm expf equals glibc 2.36's on every input checked");
    }
    assert_eq!(port_bad, 0, "expf port: first difference {first_port:?}");
}

#[test]
fn v_expf_port_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    let stream = g.stream();
    let mut rng = Rng::new(15);
    let mut xs: Vec<f32> = (0..4_000_000)
        .map(|_| f32::from_bits(rng.next() as u32))
        .collect();
    xs.extend((0..4_000_000).map(|_| rng.val(120.0)));
    xs.extend([
        0.0,
        -0.0,
        192.0,
        -192.0,
        1e-40,
        -87.5,
        88.9,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]);
    let got = weft_kernels::cuda::testing::v_expf(&g.kernels, &stream, &xs).unwrap();
    let mut bad = 0;
    for (x, y) in xs.iter().zip(&got) {
        let want = weft_kernels::cpu::simd::v_expf(*x);
        if want.to_bits() != y.to_bits() && !(want.is_nan() && y.is_nan()) {
            bad += 1;
            if bad < 5 {
                eprintln!("v_expf({x:e}): gpu {y:e} cpu {want:e}");
            }
        }
    }
    assert_eq!(bad, 0, "{bad} v_expf mismatches");
}

/// Plain causal attention (scale 1/8) at `qp` over a cache of `capacity` rows.
fn decode_params(heads: usize, kvh: usize, d: usize, qp: u32, capacity: usize) -> AttentionParams {
    AttentionParams {
        heads,
        kv_heads: kvh,
        head_dim: d,
        scale: 0.125,
        q_position: qp,
        window: None,
        ring: None,
        softcap: 0.0,
        kv_capacity: capacity as u32,
        flash: true,
    }
}

#[test]
fn captured_graph_replays_with_new_step_scalars() {
    // Capture a decode step's kernels (set_rows into the cache, attention
    // over the whole cache, rms_norm, a Q4_1 matvec) once, then replay it
    // for several positions, changing only the step buffers; compare each
    // replay with the CPU.
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(16);
    let capacity = 1024usize;
    let (heads, kvh, d) = (9, 3, 64);
    let mut mem = HostMemory::default();
    let q = mem
        .f32_tensor(&[1, heads * d], &rng.vec(heads * d, 1.0))
        .unwrap();
    let knew = mem
        .f32_tensor(&[1, kvh * d], &rng.vec(kvh * d, 1.0))
        .unwrap();
    let kc = mem.zeros(DType::F16, &[capacity, kvh * d]).unwrap();
    let vc = mem.zeros(DType::F16, &[capacity, kvh * d]).unwrap();
    mem.set_f32(&kc, &rng.vec(capacity * kvh * d, 1.0)).unwrap();
    mem.set_f32(&vc, &rng.vec(capacity * kvh * d, 1.0)).unwrap();
    let att = mem.zeros(DType::F32, &[1, heads * d]).unwrap();
    let w = mem
        .f32_tensor(&[heads * d], &rng.vec(heads * d, 1.0))
        .unwrap();
    let normed = mem.zeros(DType::F32, &[1, heads * d]).unwrap();
    let wq = weights(&mut rng, &mut mem, DType::Q4_1, 576, heads * d);
    let proj = mem.zeros(DType::F32, &[1, 576]).unwrap();
    let make = |qp: u32, view_rows: usize| {
        let p = decode_params(heads, kvh, d, qp, capacity);
        vec![
            node(
                Op::SetRows {
                    start: qp,
                    ring: None,
                },
                vec![knew],
                vec![kc],
            ),
            node(
                Op::Attention(p),
                vec![
                    q,
                    kc.rows_view(0, view_rows).unwrap(),
                    vc.rows_view(0, view_rows).unwrap(),
                ],
                vec![att],
            ),
            node(Op::RmsNorm { eps: 1e-5 }, vec![att, w], vec![normed]),
            node(Op::MatMul, vec![normed, wq], vec![proj]),
        ]
    };
    let stream = g.stream();
    let all = [q, knew, kc, vc, att, w, normed, wq, proj];
    let dev = DevMem::upload(&stream, &mem, &all);
    let captured = make(0, capacity);
    let scratch: Vec<_> = captured
        .iter()
        .map(|n| device_u8(&stream, g.kernels.scratch_bytes(n)))
        .collect();
    let mut steps: Vec<_> = captured.iter().map(|_| device_u8(&stream, 16)).collect();
    stream.synchronize().unwrap();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    for (i, n) in captured.iter().enumerate() {
        let ins: Vec<DeviceTensor> = n.inputs.iter().map(|t| dev.tensor(&stream, t)).collect();
        let outs: Vec<DeviceTensor> = n.outputs.iter().map(|t| dev.tensor(&stream, t)).collect();
        // SAFETY: all tensors are inside the uploaded buffers.
        unsafe {
            g.kernels
                .launch(
                    &stream,
                    n,
                    &ins,
                    &outs,
                    ptr_of(&stream, &scratch[i]),
                    ptr_of(&stream, &steps[i]),
                )
                .unwrap();
        }
    }
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a graph");
    let mut cpu_mem = mem.clone();
    for qp in [0u32, 1, 2, 100, 255, 256, 257, 600] {
        let nodes = make(qp, qp as usize + 1);
        for (i, n) in nodes.iter().enumerate() {
            let mut s = g.kernels.step_scalars(n);
            s.resize(4, 0);
            let bytes: &[u8] = bytemuck::cast_slice(&s);
            stream.memcpy_htod(bytes, &mut steps[i]).unwrap();
        }
        graph.launch().unwrap();
        stream.synchronize().unwrap();
        for n in &nodes {
            let outs = run_cpu(n, &cpu_mem);
            cpu_mem.bytes_mut(&n.outputs[0]).copy_from_slice(&outs[0]);
        }
        for t in [kc, att, normed, proj] {
            assert_same(
                &format!("replay at {qp}: {t:?}"),
                t.dtype,
                &dev.read(&stream, &t),
                cpu_mem.bytes(&t),
            );
        }
    }
}

/// Rows whose mean square lies exactly halfway between two f32s (1 and
/// 1 + 2^-23): there the tree sum's error bound cannot decide the f32 the
/// CPU's sequential sum rounds to, so the norm kernels take their in-order
/// fallback (every warp of the warp-per-block kernel, at 32 and 512 values;
/// the row kernel at 2048).
#[test]
fn norm_quantize_sum_fallback_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(29);
    for cols in [32usize, 512, 2048] {
        // n - 1 ones and one v with f32(v * v) = 1 + n 2^-24: the squares
        // sum to n (1 + 2^-24) exactly.
        let v = 1.0f32 + (cols as f32) * 2f32.powi(-25);
        assert_eq!(v * v, 1.0 + (cols as f32) * 2f32.powi(-24));
        let mut row = vec![1.0f32; cols];
        row[cols / 3] = v;
        let halves: Vec<f32> = row.iter().map(|r| r - 0.5).collect();
        for act in [DType::Q8_1, DType::Q8_0] {
            let mut mem = HostMemory::default();
            let x = mem.f32_tensor(&[1, cols], &row).unwrap();
            let xh = mem.f32_tensor(&[1, cols], &halves).unwrap();
            let b = mem.f32_tensor(&[1, cols], &vec![0.5f32; cols]).unwrap();
            let w = mem.f32_tensor(&[cols], &rng.vec(cols, 1.5)).unwrap();
            let q = mem.zeros(act, &[1, cols]).unwrap();
            let n = node(Op::RmsNormQuantize { eps: 1e-5 }, vec![x, w], vec![q]);
            check_exact(
                g,
                &format!("rms_norm_quantize {act} 1x{cols} (halfway)"),
                &n,
                &mut mem,
            );
            let n = node(
                Op::AddRmsNormQuantize { eps: 1e-5 },
                vec![xh, b, w],
                vec![xh, q],
            );
            check_exact(
                g,
                &format!("add_rms_norm_quantize {act} 1x{cols} (halfway)"),
                &n,
                &mut mem,
            );
        }
    }
}

#[test]
fn fused_ops_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(17);
    for act in [
        DType::Q8_1,
        DType::Q8_0,
        DType::Q8_K,
        DType::F16,
        DType::BF16,
    ] {
        // Up to 1024 values, Q8_0 / Q8_1 rows take the warp-per-block norm.
        for (rows, cols) in [
            (1, 1536),
            (5, 768),
            (33, 512),
            (2, 5120),
            (1, 576),
            (3, 640),
            (1, 1024),
            (2, 32),
        ] {
            if act == DType::Q8_K && cols % 256 != 0 {
                continue; // Q8_K rows are whole 256-element blocks
            }
            let mut mem = HostMemory::default();
            let x = mem
                .f32_tensor(&[rows, cols], &rng.rows(rows, cols))
                .unwrap();
            let u = mem
                .f32_tensor(&[rows, cols], &rng.rows(rows, cols))
                .unwrap();
            let b = mem
                .f32_tensor(&[rows, cols], &rng.rows(rows, cols))
                .unwrap();
            let b1 = mem.f32_tensor(&[1, cols], &rng.vec(cols, 1.0)).unwrap();
            let w = mem.f32_tensor(&[cols], &rng.vec(cols, 1.5)).unwrap();
            let q = mem.zeros(act, &[rows, cols]).unwrap();
            let what = |op: &str| format!("{op} -> {act} {rows}x{cols}");
            let n = node(Op::RmsNormQuantize { eps: 1e-5 }, vec![x, w], vec![q]);
            check_exact(g, &what("rms_norm_quantize"), &n, &mut mem);
            let n = node(Op::SiluMulQuantize, vec![x, u], vec![q]);
            check_exact(g, &what("silu_mul_quantize"), &n, &mut mem);
            for bb in [b, b1] {
                let n = node(
                    Op::AddRmsNormQuantize { eps: 1e-5 },
                    vec![x, bb, w],
                    vec![x, q],
                );
                check_exact(g, &what("add_rms_norm_quantize (in place)"), &n, &mut mem);
            }
        }
    }
    for dst in [DType::F16, DType::F32, DType::BF16] {
        for (start, ring) in [(5u32, None), (60, Some(16u32))] {
            for mode in [RopeMode::Normal, RopeMode::Neox] {
                let mut mem = HostMemory::default();
                let (n, heads, d) = (3, 3, 64);
                let x = mem
                    .f32_tensor(&[n, heads * d], &rng.rows(n, heads * d))
                    .unwrap();
                let pos: Vec<i32> = (0..n as i32).map(|i| start as i32 + i).collect();
                let pt = mem
                    .tensor(DType::I32, &[n], bytemuck::cast_slice(&pos))
                    .unwrap();
                let cache = mem.zeros(dst, &[80, heads * d]).unwrap();
                mem.set_f32(&cache, &rng.vec(80 * heads * d, 1.0)).unwrap();
                let rope = RopeParams::plain(
                    mode,
                    d,
                    if mode == RopeMode::Neox { 32 } else { 64 },
                    100000.0,
                );
                let nd = node(
                    Op::RopeSetRows { rope, start, ring },
                    vec![x, pt],
                    vec![cache],
                );
                check_exact(
                    g,
                    &format!("rope_set_rows {dst} {mode:?} start {start} ring {ring:?}"),
                    &nd,
                    &mut mem,
                );
                if g.is_none() {
                    continue;
                }
                let other = node(
                    Op::RopeSetRows {
                        rope,
                        start: start + 7,
                        ring,
                    },
                    vec![x, pt],
                    vec![cache],
                );
                let want = run_cpu(&other, &mem);
                let got = run_gpu_with(g, &nd, &mem, Some(vec![start + 7]));
                assert_same(
                    &format!("rope_set_rows {dst} via step"),
                    dst,
                    &got[0],
                    &want[0],
                );
            }
        }
    }
}

/// Decode attention with its q/k/v projections in one node (what the
/// fusion pass makes of a layer's `matmul+rope`, `matmul+rope+set_rows`,
/// `matmul+set_rows` and `attention+quantize`): the CPU's chain bit for
/// bit, with the key and value projections absorbed or not, in the
/// one-pass decode body (short contexts) and the general one (700 cells),
/// over the natural cache views and over the whole cache with the step
/// scalars (as a replayed decode graph runs it).
#[test]
fn qkv_attention_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(53);
    let (heads, kvh, d, k, capacity) = (9usize, 3usize, 64usize, 576usize, 1024usize);
    for wdtype in [DType::Q4_1, DType::Q8_0, DType::Q4_0, DType::Q5_0] {
        for act in [DType::Q8_1, DType::Q8_0] {
            for (qp, absorb) in [(0u32, 2), (40, 2), (200, 1), (511, 2), (700, 2), (63, 0)] {
                let mut mem = HostMemory::default();
                let adtype = vec_dot_type(wdtype);
                let x = mem
                    .tensor(adtype, &[1, k], &quantized(adtype, &rng.rows(1, k)))
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
                let rows =
                    |rope, write, ins, out| node(Op::MatMulRows { rope, write }, ins, vec![out]);
                let qn = rows(Some(rope), None, vec![x, wq, pos], q);
                let kn = rows(Some(rope), write, vec![x, wk, pos], kc);
                let vn = rows(None, write, vec![x, wv], vc);
                let natural = qp as usize + 1;
                for (view_rows, whole) in [(natural, false), (capacity, true)] {
                    let p = decode_params(heads, kvh, d, qp, capacity);
                    let (kview, vview) = (
                        kc.rows_view(0, view_rows).unwrap(),
                        vc.rows_view(0, view_rows).unwrap(),
                    );
                    let an = node(Op::AttentionQuantize(p), vec![q, kview, vview], vec![out]);
                    let mut fused = weft_ops::fused::fuse_pair(&qn, &an, false).expect("q fuses");
                    for part in [&kn, &vn].into_iter().take(absorb) {
                        fused = weft_ops::fused::fuse_pair(part, &fused, true).expect("k/v fuse");
                    }
                    fused.validate().expect("valid fused node");
                    let what = format!(
                        "qkv+attention {wdtype} -> {act} pos={qp} absorbed={absorb} whole={whole}"
                    );
                    if !whole {
                        // The CPU runs the fused node as the recorded chain.
                        poison_outputs(&fused, &mut mem);
                        let got = run_cpu(&fused, &mem);
                        let mut chain = mem.clone();
                        let absorbed = [&kn, &vn].into_iter().take(absorb);
                        for part in [&qn].into_iter().chain(absorbed).chain([&an]) {
                            let outs = run_cpu(part, &chain);
                            for (t, b) in part.outputs.iter().zip(outs) {
                                chain.bytes_mut(t).copy_from_slice(&b);
                            }
                        }
                        for (i, t) in fused.outputs.iter().enumerate() {
                            let what = format!("{what}: the chain's output {i}");
                            assert_same(&what, t.dtype, &got[i], chain.bytes(t));
                        }
                    }
                    if !whole {
                        check_exact(g, &what, &fused, &mut mem);
                        continue;
                    }
                    // The whole cache as the views, the extent in the step
                    // scalars: the natural node's results.
                    let mut nat = fused.clone();
                    nat.inputs[1] = kc.rows_view(0, natural).unwrap();
                    nat.inputs[2] = vc.rows_view(0, natural).unwrap();
                    poison_outputs(&nat, &mut mem);
                    let want = run_cpu(&nat, &mem);
                    let got = match g {
                        Some(g) => {
                            let scalars = g.kernels.step_scalars(&nat);
                            run_gpu_with(Some(g), &fused, &mem, Some(scalars))
                        }
                        None => want.clone(),
                    };
                    for (i, t) in nat.outputs.iter().enumerate() {
                        assert_same(&format!("{what} (output {i})"), t.dtype, &got[i], &want[i]);
                    }
                }
            }
        }
    }
}
