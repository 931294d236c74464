//! The fast quantized kernels against `weft_ops::quant`, on fresh random
//! inputs every run (the seed is printed in every failure; `WEFT_TEST_SEED`
//! replays it), on every path this machine supports: scalar, AVX2 and
//! AVX-512 are forced one after the other.
//!
//! Tolerances:
//! - activation quantizers: bit-identical to `weft_ops::quant::quantize_row`;
//! - the paths among themselves, and `matmul` against `vec_dot` in the
//!   order `DotOrder::of` picks: bit-identical (they all follow llama.cpp's
//!   x86 orders);
//! - the K-quant orders (repacked Q4_K gemv/gemm, tiled, Q6_K's `vec_dot`
//!   lanes) against the independent transcriptions below of llama.cpp's
//!   kernels: bit-identical, and the order chosen per call (Q4_K: gemm for
//!   the first `n - n % 4` activation rows when the weight has a multiple of
//!   8 rows, gemv for the rest; tiled from 8 activation rows) as llama.cpp
//!   chooses it;
//! - against `vec_dot_reference` (ggml's generic C order): the integer parts
//!   are exact, so the difference is f32 summation order only, bounded by
//!   relative 1e-5 of the sum of the magnitudes of the terms.

mod quant {
    use weft_kernels::cpu::quant::{
        self, DotOrder, Isa, OutColumns, REFERENCE_WEIGHTS, SUPPORTED_WEIGHTS,
    };
    use weft_ops::quant::{dequantize_row, vec_dot_reference, vec_dot_type};
    use weft_ops::DType;
    use weft_testkit::host::quantized;
    use weft_testkit::Rng;

    fn paths() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.is_supported())
            .collect()
    }

    /// A random weight matrix (`rows` x `k`) of `dtype` and `n` activation rows.
    fn problem(rng: &mut Rng, dtype: DType, rows: usize, k: usize, n: usize) -> (Vec<u8>, Vec<u8>) {
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| quantized(dtype, &rng.spread_row(k, -2.0, 1.0)))
            .collect();
        let adtype = vec_dot_type(dtype);
        let a: Vec<u8> = (0..n)
            .flat_map(|_| quantized(adtype, &rng.spread_row(k, -2.0, 1.0)))
            .collect();
        (w, a)
    }

    /// A k for `dtype`: a random whole number of blocks, also odd counts.
    fn random_k(rng: &mut Rng, dtype: DType) -> usize {
        let unit = vec_dot_type(dtype)
            .block_len()
            .max(dtype.block_len())
            .max(1);
        let unit = if unit == 1 { 1 } else { unit };
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => rng.range(1, 700),
            _ => unit * rng.range(1, if unit == 256 { 12 } else { 80 }),
        }
    }

    /// Sum of |w_i a_i| over the dequantized rows plus |m s| per block for
    /// the formats with minimums: the scale of the f32 rounding differences.
    fn magnitude(dtype: DType, w: &[u8], a: &[u8], k: usize) -> f64 {
        let adtype = vec_dot_type(dtype);
        let (mut wf, mut af) = (vec![0f32; k], vec![0f32; k]);
        dequantize_row(dtype, w, &mut wf).expect("dequantize");
        dequantize_row(adtype, a, &mut af).expect("dequantize");
        let mut sum: f64 = wf
            .iter()
            .zip(&af)
            .map(|(x, y)| (*x as f64 * *y as f64).abs())
            .sum();
        if matches!(dtype, DType::Q4_1 | DType::Q5_1) {
            let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32() as f64;
            for (wb, ab) in w
                .chunks(dtype.block_bytes())
                .zip(a.chunks(adtype.block_bytes()))
            {
                sum += (f16(&wb[2..]) * f16(&ab[2..])).abs();
            }
        }
        sum
    }

    #[test]
    fn activation_quantizers_are_bit_identical_to_the_reference() {
        let mut rng = Rng::from_env(11);
        for dtype in [
            DType::Q8_0,
            DType::Q8_1,
            DType::Q8_K,
            DType::F16,
            DType::BF16,
            DType::F32,
        ] {
            for _ in 0..40 {
                let n = dtype.block_len()
                    * rng.range(1, 20)
                    * if dtype.block_len() == 1 { 7 } else { 1 };
                let mut x = rng.spread_row(n, -2.0, 1.0);
                // Exact ties and a zero block stress the rounding and the guards.
                if n >= 64 && rng.next() & 1 == 0 {
                    x[0] = 127.0;
                    x[1] = 2.5;
                    x[2] = -0.5;
                    x[32..64].fill(0.0);
                }
                let want = quantized(dtype, &x);
                for isa in paths() {
                    let mut got = vec![0u8; want.len()];
                    quant::quantize_activations_with(isa, dtype, &x, &mut got).expect("quantize");
                    assert!(
                        got == want,
                        "{dtype} on {isa:?}, n {n}, seed {}",
                        rng.seed()
                    );
                }
            }
        }
    }

    #[test]
    fn every_path_matches_the_reference_dot_within_rounding() {
        let mut rng = Rng::from_env(12);
        for dtype in SUPPORTED_WEIGHTS.into_iter().chain(REFERENCE_WEIGHTS) {
            for _ in 0..25 {
                let k = random_k(&mut rng, dtype);
                let (w, a) = problem(&mut rng, dtype, 1, k, 1);
                let want =
                    vec_dot_reference(dtype, &w, vec_dot_type(dtype), &a).expect("reference");
                let tol = 1e-5 * magnitude(dtype, &w, &a, k) + 1e-30;
                for order in orders(dtype) {
                    let mut first: Option<f32> = None;
                    for isa in paths() {
                        let got =
                            quant::vec_dot_in_order_with(isa, order, dtype, &w, &a).expect("dot");
                        assert!(
                            ((got - want) as f64).abs() <= tol,
                            "{dtype} {order:?} {isa:?} k {k} seed {}: {got} vs reference {want} (tol {tol})",
                            rng.seed()
                        );
                        let f = *first.get_or_insert(got);
                        assert_eq!(
                            got.to_bits(),
                            f.to_bits(),
                            "{dtype} {order:?} {isa:?} k {k} seed {}: paths differ ({got} vs {f})",
                            rng.seed()
                        );
                    }
                }
            }
        }
    }

    fn matmul_on(
        isa: Isa,
        dtype: DType,
        w: &[u8],
        k: usize,
        rows: usize,
        a: &[u8],
        n: usize,
    ) -> Vec<f32> {
        let mut out = vec![f32::NAN; n * rows];
        let mut view = OutColumns::new(&mut out, n, rows).expect("view");
        quant::matmul_with(isa, dtype, w, k, a, n, &mut view).expect("matmul");
        out
    }

    /// Every path computes the same bits; quantized formats give exactly
    /// the row dot products in the order `DotOrder::of` picks, float
    /// formats follow ggml's tinyBLAS order for n >= 2 (then they match the
    /// reference within rounding).
    #[test]
    fn matmul_is_bit_identical_across_paths_and_matches_the_reference() {
        let mut rng = Rng::from_env(13);
        for dtype in SUPPORTED_WEIGHTS.into_iter().chain(REFERENCE_WEIGHTS) {
            for _ in 0..8 {
                let k = random_k(&mut rng, dtype);
                let k = if rng.next() & 1 == 0 {
                    k.next_multiple_of(32)
                } else {
                    k
                };
                let rows = [rng.range(1, 40), 4 * rng.range(1, 10)][rng.range(0, 2)];
                // 1 to 4 rows take the decode kernels, more the prefill ones.
                let n = [1, 2, 3, 4, rng.range(5, 21)][rng.range(0, 5)];
                let (w, a) = problem(&mut rng, dtype, rows, k, n);
                let (wr, ar) = (w.len() / rows, a.len() / n);
                let float = matches!(dtype, DType::F32 | DType::F16 | DType::BF16);
                let want = matmul_on(Isa::Scalar, dtype, &w, k, rows, &a, n);
                for (i, v) in want.iter().enumerate() {
                    let (t, r) = (i / rows, i % rows);
                    let (wrow, arow) = (&w[r * wr..(r + 1) * wr], &a[t * ar..(t + 1) * ar]);
                    if float && n >= 2 {
                        let reference = vec_dot_reference(dtype, wrow, vec_dot_type(dtype), arow)
                            .expect("reference");
                        let tol = 1e-5 * magnitude(dtype, wrow, arow, k) + 1e-30;
                        assert!(
                            ((v - reference) as f64).abs() <= tol,
                            "{dtype} n {n} k {k}: {v} vs {reference}, seed {}",
                            rng.seed()
                        );
                    } else {
                        let order = DotOrder::of(dtype, rows, n, t);
                        let dot =
                            quant::vec_dot_in_order_with(Isa::Scalar, order, dtype, wrow, arow)
                                .expect("dot");
                        assert_eq!(
                            v.to_bits(),
                            dot.to_bits(),
                            "{dtype} rows {rows} n {n} k {k} t {t} r {r} seed {}",
                            rng.seed()
                        );
                    }
                }
                for isa in paths() {
                    let got = matmul_on(isa, dtype, &w, k, rows, &a, n);
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{dtype} {isa:?} rows {rows} n {n} k {k} token {} row {} seed {}: {g} vs {e}",
                            i / rows,
                            i % rows,
                            rng.seed()
                        );
                    }
                }
            }
        }
    }

    /// The orders a format has: every format `VecDot`, Q4_K all four, Q6_K
    /// also `Tiled`.
    fn orders(dtype: DType) -> Vec<DotOrder> {
        match dtype {
            DType::Q4_K => vec![
                DotOrder::VecDot,
                DotOrder::RepackGemv,
                DotOrder::RepackGemm,
                DotOrder::Tiled,
            ],
            DType::Q6_K => vec![DotOrder::VecDot, DotOrder::Tiled],
            _ => vec![DotOrder::VecDot],
        }
    }

    /// llama.cpp's kernels for Q4_K / Q6_K, transcribed independently of
    /// weft's kernels (scalar, from `ggml-cpu/arch/x86/repack.cpp`,
    /// `tiled/tiled-kernel.cpp` and `arch/x86/quants.c`).
    mod llama {
        use weft_ops::quant::{f16_to_f32, unpack_q4k_scales_mins};

        const Q8K: usize = 292;

        fn f32_at(b: &[u8]) -> f32 {
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        }

        /// Q8_K: d, 256 quants, 16 sums of 16.
        fn q8k(y: &[u8]) -> (f32, &[u8], [i32; 16]) {
            let bsum = core::array::from_fn(|j| {
                i16::from_le_bytes([y[260 + 2 * j], y[261 + 2 * j]]) as i32
            });
            (f32_at(y), &y[4..260], bsum)
        }

        /// Q4_K: d, dmin, scales, mins, the 256 codes.
        fn q4k(x: &[u8]) -> (f32, f32, [u8; 8], [u8; 8], Vec<i32>) {
            let scales: [u8; 12] = x[4..16].try_into().expect("12 bytes");
            let (sc, m) = unpack_q4k_scales_mins(&scales);
            let mut u = vec![0i32; 256];
            for j in 0..4 {
                for l in 0..32 {
                    let byte = x[16 + 32 * j + l];
                    u[64 * j + l] = (byte & 15) as i32;
                    u[64 * j + 32 + l] = (byte >> 4) as i32;
                }
            }
            (f16_to_f32([x[0], x[1]]), f16_to_f32([x[2], x[3]]), sc, m, u)
        }

        /// Q6_K: d, the 16 scales, the 256 codes (0..=63).
        fn q6k(x: &[u8]) -> (f32, [i32; 16], Vec<i32>) {
            let mut u = vec![0i32; 256];
            for h in 0..2 {
                for l in 0..32 {
                    let (a, b, q) = (x[64 * h + l], x[64 * h + 32 + l], x[128 + 32 * h + l]);
                    let e = 128 * h + l;
                    u[e] = ((a & 15) | ((q & 3) << 4)) as i32;
                    u[e + 32] = ((b & 15) | (((q >> 2) & 3) << 4)) as i32;
                    u[e + 64] = ((a >> 4) | (((q >> 4) & 3) << 4)) as i32;
                    u[e + 96] = ((b >> 4) | (((q >> 6) & 3) << 4)) as i32;
                }
            }
            let sc = core::array::from_fn(|j| x[192 + j] as i8 as i32);
            (f16_to_f32([x[208], x[209]]), sc, u)
        }

        /// Per 64 elements: (sum sc * dot, sum m * bsums) of one block.
        fn q4k_sums(x: &[u8], y: &[u8]) -> (f32, f32, f32, [(i32, i32); 4]) {
            let (d, dmin, sc, m, u) = q4k(x);
            let (yd, q, bsum) = q8k(y);
            let sums = core::array::from_fn(|sb| {
                let (mut isum, mut imin) = (0, 0);
                for c in [2 * sb, 2 * sb + 1] {
                    let dot: i32 = (32 * c..32 * c + 32)
                        .map(|e| u[e] * q[e] as i8 as i32)
                        .sum();
                    isum += sc[c] as i32 * dot;
                    imin += m[c] as i32 * (bsum[2 * c] + bsum[2 * c + 1]);
                }
                (isum, imin)
            });
            (d, dmin, yd, sums)
        }

        /// `ggml_gemv_q4_K_8x8_q8_K` (`gemm = false`) / `ggml_gemm_...`.
        pub fn q4k_repack(w: &[u8], a: &[u8], gemm: bool) -> f32 {
            let (mut acc, mut accm) = (0f32, 0f32);
            for (x, y) in w.chunks(144).zip(a.chunks(Q8K)) {
                let (d, dmin, yd, sums) = q4k_sums(x, y);
                let (dd, dm) = (d * yd, dmin * yd);
                if gemm {
                    for (isum, imin) in sums {
                        acc = (isum as f32).mul_add(dd, acc);
                        accm = (imin as f32).mul_add(dm, accm);
                    }
                } else {
                    let isum: i32 = sums.iter().map(|s| s.0).sum();
                    let imin: i32 = sums.iter().map(|s| s.1).sum();
                    acc = (isum as f32).mul_add(dd, acc);
                    accm = (imin as f32).mul_add(dm, accm);
                }
            }
            acc - accm
        }

        /// `tiled_run_micro_vnni_8x16` for Q4_K: `fnmadd(dmin, s2, s1 * d)`,
        /// then `buf + result * d1` contracted.
        pub fn q4k_tiled(w: &[u8], a: &[u8]) -> f32 {
            let mut acc = 0f32;
            for (x, y) in w.chunks(144).zip(a.chunks(Q8K)) {
                let (d, dmin, yd, sums) = q4k_sums(x, y);
                let s1: i32 = sums.iter().map(|s| s.0).sum();
                let s2: i32 = sums.iter().map(|s| s.1).sum();
                let result = (-dmin).mul_add(s2 as f32, s1 as f32 * d);
                acc = result.mul_add(yd, acc);
            }
            acc
        }

        /// The tiled kernel for Q6_K.
        pub fn q6k_tiled(w: &[u8], a: &[u8]) -> f32 {
            let mut acc = 0f32;
            for (x, y) in w.chunks(210).zip(a.chunks(Q8K)) {
                let (d, sc, u) = q6k(x);
                let (yd, q, _) = q8k(y);
                let isum: i32 = (0..256)
                    .map(|e| sc[e / 16] * (u[e] - 32) * q[e] as i8 as i32)
                    .sum();
                acc = (isum as f32 * d).mul_add(yd, acc);
            }
            acc
        }

        /// `ggml_vec_dot_q6_K_q8_K`, AVX2 branch: `sumi - q8sclsub` per lane.
        pub fn q6k_vec_dot(w: &[u8], a: &[u8]) -> f32 {
            let mut acc = [0f32; 8];
            for (x, y) in w.chunks(210).zip(a.chunks(Q8K)) {
                let (d, sc, u) = q6k(x);
                let (yd, q, bsum) = q8k(y);
                let mut sumi = [0i32; 8];
                for e in 0..256 {
                    sumi[(e % 32) / 4] += sc[e / 16] * u[e] * q[e] as i8 as i32;
                }
                for (l, s) in sumi.iter_mut().enumerate() {
                    *s -= (bsum[2 * l] * sc[2 * l] + bsum[2 * l + 1] * sc[2 * l + 1]) << 5;
                }
                let dd = yd * d;
                for (a, s) in acc.iter_mut().zip(sumi) {
                    *a = dd.mul_add(s as f32, *a);
                }
            }
            let h = [
                acc[0] + acc[4],
                acc[1] + acc[5],
                acc[2] + acc[6],
                acc[3] + acc[7],
            ];
            (h[0] + h[2]) + (h[1] + h[3])
        }
    }

    /// The K-quant orders on every path against the transcriptions of
    /// llama.cpp's kernels.
    #[test]
    fn kquant_orders_are_llama_cpps_kernels() {
        let mut rng = Rng::from_env(15);
        let mut differs = [0usize; 2];
        for dtype in [DType::Q4_K, DType::Q6_K] {
            for _ in 0..60 {
                let k = 256 * rng.range(1, 12);
                let (w, a) = problem(&mut rng, dtype, 1, k, 1);
                for order in orders(dtype) {
                    let want = match (dtype, order) {
                        (DType::Q4_K, DotOrder::RepackGemv) => llama::q4k_repack(&w, &a, false),
                        (DType::Q4_K, DotOrder::RepackGemm) => llama::q4k_repack(&w, &a, true),
                        (DType::Q4_K, DotOrder::Tiled) => llama::q4k_tiled(&w, &a),
                        (DType::Q6_K, DotOrder::Tiled) => llama::q6k_tiled(&w, &a),
                        (DType::Q6_K, DotOrder::VecDot) => llama::q6k_vec_dot(&w, &a),
                        // Q4_K's vec_dot lanes: unchanged, covered by SmolLM2-style tests.
                        _ => continue,
                    };
                    for isa in paths() {
                        let got =
                            quant::vec_dot_in_order_with(isa, order, dtype, &w, &a).expect("dot");
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{dtype} {order:?} {isa:?} k {k} seed {}: {got} vs llama.cpp's {want}",
                            rng.seed()
                        );
                    }
                }
                let vec_dot = quant::vec_dot_with(Isa::Scalar, dtype, &w, &a).expect("dot");
                let other = if dtype == DType::Q4_K {
                    llama::q4k_repack(&w, &a, false)
                } else {
                    llama::q6k_tiled(&w, &a)
                };
                differs[usize::from(dtype == DType::Q6_K)] +=
                    usize::from(vec_dot.to_bits() != other.to_bits());
            }
        }
        // The orders are distinguishable on random data (else this test
        // would prove nothing).
        assert!(differs.iter().all(|&d| d > 0), "{differs:?}");
    }

    /// The order llama.cpp takes for activation row `t` of `n`, written out
    /// independently of `DotOrder::of`.
    fn llama_order(dtype: DType, weight_rows: usize, n: usize, t: usize) -> DotOrder {
        let repacked = dtype == DType::Q4_K && weight_rows.is_multiple_of(8);
        if repacked {
            // forward_mul_mat_one_chunk: gemm on n - n % 4 rows, gemv after.
            if n > 3 && t < n - n % 4 {
                DotOrder::RepackGemm
            } else {
                DotOrder::RepackGemv
            }
        } else if n >= 8 {
            DotOrder::Tiled
        } else {
            DotOrder::VecDot
        }
    }

    /// Q4_K / Q6_K matmuls for every n from 1 to 13 (all `n % 4`
    /// leftovers, both sides of the tiled threshold), weights with and
    /// without a multiple of 8 rows, split over threads like the runtime:
    /// each output is the product in llama.cpp's order for its token, on
    /// every path.
    #[test]
    fn kquant_matmul_takes_llama_cpps_order_per_token() {
        let mut rng = Rng::from_env(16);
        for dtype in [DType::Q4_K, DType::Q6_K] {
            for (n, repackable) in (1..=13).flat_map(|n| [(n, true), (n, false)]) {
                let k = 256 * rng.range(1, 5);
                let rows = if repackable {
                    8 * rng.range(1, 6)
                } else {
                    8 * rng.range(1, 5) + rng.range(1, 8)
                };
                let (w, a) = problem(&mut rng, dtype, rows, k, n);
                let (wr, ar) = (w.len() / rows, a.len() / n);
                for isa in paths() {
                    // Two threads' column ranges, the split at a multiple of 4.
                    let mut out = vec![f32::NAN; n * rows];
                    let view = OutColumns::new(&mut out, n, rows).expect("view");
                    let (mut left, mut right) = view.split_at(4 * (rows / 8));
                    for part in [&mut left, &mut right] {
                        quant::matmul_with(isa, dtype, &w, k, &a, n, part).expect("matmul");
                    }
                    for t in 0..n {
                        let order = llama_order(dtype, rows, n, t);
                        assert_eq!(order, DotOrder::of(dtype, rows, n, t));
                        for r in 0..rows {
                            let (wrow, arow) = (&w[r * wr..(r + 1) * wr], &a[t * ar..(t + 1) * ar]);
                            let want =
                                quant::vec_dot_in_order_with(Isa::Scalar, order, dtype, wrow, arow)
                                    .expect("dot");
                            let got = out[t * rows + r];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{dtype} {isa:?} {order:?} rows {rows} n {n} k {k} t {t} r {r} seed {}: {got} vs {want}",
                                rng.seed()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn split_columns_on_threads_give_the_same_output() {
        let mut rng = Rng::from_env(14);
        let (dtype, k, rows, n) = (DType::Q4_1, 576, 37, 9);
        let (w, a) = problem(&mut rng, dtype, rows, k, n);
        let whole = matmul_on(Isa::detect().expect("isa"), dtype, &w, k, rows, &a, n);
        let mut out = vec![f32::NAN; n * rows];
        let view = OutColumns::new(&mut out, n, rows).expect("view");
        let (left, right) = view.split_at(13);
        let (mid, right) = right.split_at(30);
        std::thread::scope(|s| {
            for mut part in [left, mid, right] {
                let (w, a) = (&w, &a);
                s.spawn(move || quant::matmul(dtype, w, k, a, n, &mut part).expect("matmul"));
            }
        });
        assert_eq!(
            whole.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        let mut out = vec![0f32; 4];
        let mut view = OutColumns::new(&mut out, 2, 2).expect("view");
        // k not a multiple of the block, too few weight bytes, too few activations.
        assert!(quant::matmul(DType::Q4_1, &[0u8; 40], 33, &[0u8; 72], 2, &mut view).is_err());
        assert!(quant::matmul(DType::Q4_1, &[0u8; 20], 32, &[0u8; 72], 2, &mut view).is_err());
        assert!(quant::matmul(DType::Q4_1, &[0u8; 40], 32, &[0u8; 36], 2, &mut view).is_err());
        assert!(
            quant::matmul(DType::IQ2_XXS, &[0u8; 132], 256, &[0u8; 584], 2, &mut view).is_err()
        );
        assert!(OutColumns::new(&mut out, 3, 2).is_err());
        assert!(quant::quantize_activations(DType::Q8_0, &[1.0; 32], &mut [0u8; 36]).is_err());
        assert!(quant::vec_dot(DType::Q8_0, &[0u8; 34], &[0u8; 36]).is_err());
    }
}
