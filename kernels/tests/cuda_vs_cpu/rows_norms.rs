//! Row gathers and writes, norms and their sums, elementwise ops, argmax
//! and rope against the CPU.

use super::*;

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
