//! The fast quantized kernels against `weft_ops::quant`, on fresh random
//! inputs every run (the seed is printed in every failure; `WEFT_TEST_SEED`
//! replays it), on every path this machine supports: scalar, AVX2 and
//! AVX-512 are forced one after the other.
//!
//! Tolerances:
//! - activation quantizers: bit-identical to `weft_ops::quant::quantize_row`;
//! - the paths among themselves, and `matmul` against `vec_dot`:
//!   bit-identical (they all follow ggml's x86 lane order);
//! - against `vec_dot_reference` (ggml's generic C order): the integer parts
//!   are exact, so the difference is f32 summation order only, bounded by
//!   relative 1e-5 of the sum of the magnitudes of the terms.

mod quant {
    use weft_kernels::cpu::quant::{self, Isa, OutColumns, REFERENCE_WEIGHTS, SUPPORTED_WEIGHTS};
    use weft_ops::quant::{dequantize_row, quantize_row, vec_dot_reference, vec_dot_type};
    use weft_ops::DType;

    struct Rng(u64, u64);

    impl Rng {
        fn new(salt: u64) -> Rng {
            let seed = std::env::var("WEFT_TEST_SEED")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| {
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(7, |d| d.as_nanos() as u64)
                });
            Rng((seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1, seed)
        }
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32
        }
        fn range(&mut self, lo: usize, hi: usize) -> usize {
            lo + (self.next() % (hi - lo) as u64) as usize
        }
        /// Values in ±scale around an offset; scale 10^-2..10^1, never all zero.
        fn row(&mut self, n: usize) -> Vec<f32> {
            let scale = 10f32.powf(self.unit() * 3.0 - 2.0);
            let offset = (self.unit() - 0.5) * scale * if self.next() & 1 == 0 { 0.0 } else { 1.0 };
            (0..n)
                .map(|_| offset + (self.unit() * 2.0 - 1.0) * scale)
                .collect()
        }
        fn seed(&self) -> u64 {
            self.1
        }
    }

    fn paths() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.is_supported())
            .collect()
    }

    fn quantized(dtype: DType, x: &[f32]) -> Vec<u8> {
        let mut q = vec![0u8; dtype.row_bytes(x.len()).expect("whole blocks")];
        quantize_row(dtype, x, &mut q).expect("quantize");
        q
    }

    /// A random weight matrix (`rows` x `k`) of `dtype` and `n` activation rows.
    fn problem(rng: &mut Rng, dtype: DType, rows: usize, k: usize, n: usize) -> (Vec<u8>, Vec<u8>) {
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| quantized(dtype, &rng.row(k)))
            .collect();
        let adtype = vec_dot_type(dtype);
        let a: Vec<u8> = (0..n)
            .flat_map(|_| quantized(adtype, &rng.row(k)))
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
        let mut rng = Rng::new(11);
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
                let mut x = rng.row(n);
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
        let mut rng = Rng::new(12);
        for dtype in SUPPORTED_WEIGHTS.into_iter().chain(REFERENCE_WEIGHTS) {
            for _ in 0..25 {
                let k = random_k(&mut rng, dtype);
                let (w, a) = problem(&mut rng, dtype, 1, k, 1);
                let want =
                    vec_dot_reference(dtype, &w, vec_dot_type(dtype), &a).expect("reference");
                let tol = 1e-5 * magnitude(dtype, &w, &a, k) + 1e-30;
                let mut first: Option<f32> = None;
                for isa in paths() {
                    let got = quant::vec_dot_with(isa, dtype, &w, &a).expect("dot");
                    assert!(
                        ((got - want) as f64).abs() <= tol,
                        "{dtype} {isa:?} k {k} seed {}: {got} vs reference {want} (tol {tol})",
                        rng.seed()
                    );
                    let f = *first.get_or_insert(got);
                    assert_eq!(
                        got.to_bits(),
                        f.to_bits(),
                        "{dtype} {isa:?} k {k} seed {}: paths differ ({got} vs {f})",
                        rng.seed()
                    );
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
    /// the row dot products (ggml uses `vec_dot` for them at any n), float
    /// formats follow ggml's tinyBLAS order for n >= 2 (then they match the
    /// reference within rounding).
    #[test]
    fn matmul_is_bit_identical_across_paths_and_matches_the_reference() {
        let mut rng = Rng::new(13);
        for dtype in SUPPORTED_WEIGHTS.into_iter().chain(REFERENCE_WEIGHTS) {
            for _ in 0..4 {
                let k = random_k(&mut rng, dtype);
                let k = if rng.next() & 1 == 0 {
                    k.next_multiple_of(32)
                } else {
                    k
                };
                let rows = [rng.range(1, 40), 4 * rng.range(1, 10)][rng.range(0, 2)];
                let n = [1, 2, rng.range(3, 21)][rng.range(0, 3)];
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
                        let dot = quant::vec_dot_with(Isa::Scalar, dtype, wrow, arow).expect("dot");
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

    #[test]
    fn split_columns_on_threads_give_the_same_output() {
        let mut rng = Rng::new(14);
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
