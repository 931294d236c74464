//! Tests of the reference formats: round-trip error bounds on fresh random
//! rows, known vectors, the block layouts against a second transcription of
//! ggml's decoding loops, and the reference dot products against
//! dequantize-then-dot.
//!
//! Inputs are random for every run; the seed is printed in every failure
//! message and `WEFT_TEST_SEED=<n>` replays it.

use super::*;
use crate::DType;

use weft_testkit::Rng;

const WEIGHT_TYPES: [DType; 10] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
];

fn quantized(dtype: DType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; dtype.row_bytes(x.len()).expect("whole blocks")];
    quantize_row(dtype, x, &mut q).expect("quantize");
    q
}

fn dequantized(dtype: DType, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(dtype, q, &mut y).expect("dequantize");
    y
}

/// Largest error allowed for one element of a block-32 format, from the
/// block's values: half a step (a full step where the top level is
/// clamped) plus the f16 rounding of the scale and minimum.
fn block32_bound(dtype: DType, x: &[f32]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (min, max) = x
        .iter()
        .fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    // f16 rounding: relative 2^-11 for normal values, absolute 2^-25 below
    // 2^-14 (subnormals).
    let f16_err = |v: f32| v.abs() / 2048.0 + 1.0 / (1u32 << 25) as f32;
    match dtype {
        // Half a step plus |q| <= 127 times the f16 error of d.
        DType::Q8_0 | DType::Q8_1 => (amax / 127.0 * 0.5 + 127.0 * f16_err(amax / 127.0)) * 1.001,
        // One full step (q = 16 clamps to 15) plus 8 (16) f16 errors of d.
        DType::Q4_0 => (amax / 8.0 + 8.0 * f16_err(amax / 8.0)) * 1.001,
        DType::Q5_0 => (amax / 16.0 + 16.0 * f16_err(amax / 16.0)) * 1.001,
        DType::Q4_1 | DType::Q5_1 => {
            let levels = if dtype == DType::Q4_1 { 15.0 } else { 31.0 };
            let d = (max - min) / levels;
            (d * 0.5 + levels * f16_err(d) + f16_err(min)) * 1.001
        }
        DType::Q8_K => (amax / 127.0) * 0.5 * 1.001,
        _ => f32::INFINITY,
    }
}

#[test]
fn block32_round_trip_stays_within_half_a_step() {
    let mut rng = Rng::from_env(1);
    let seed = rng.seed();
    for dtype in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q8_K,
    ] {
        for _ in 0..50 {
            let n = dtype.block_len() * rng.range(1, 9);
            let x = rng.spread_row(n, -3.0, 2.0);
            let y = dequantized(dtype, &quantized(dtype, &x), n);
            for (b, (xb, yb)) in x
                .chunks(dtype.block_len())
                .zip(y.chunks(dtype.block_len()))
                .enumerate()
            {
                let bound = block32_bound(dtype, xb);
                for (i, (a, c)) in xb.iter().zip(yb).enumerate() {
                    assert!((a - c).abs() <= bound, "{dtype} seed {seed}: block {b} element {i}: {a} came back as {c} (bound {bound})");
                }
            }
        }
    }
}

/// Relative RMS error bounds of the K-quants on uniform random rows with
/// magnitudes 0.1..100 (smaller values push the f16 super-scales into
/// subnormals, where the format itself loses precision): about 1.5x the
/// worst seen over many seeds.
fn kquant_rms_bound(dtype: DType) -> f64 {
    match dtype {
        DType::Q2_K => 0.40,
        DType::Q3_K => 0.20,
        DType::Q4_K => 0.10,
        DType::Q5_K => 0.05,
        DType::Q6_K => 0.025,
        _ => 0.0,
    }
}

#[test]
fn k_quant_round_trip_error_is_bounded() {
    let mut rng = Rng::from_env(2);
    let seed = rng.seed();
    for dtype in [
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ] {
        for _ in 0..20 {
            let n = QK_K * rng.range(1, 5);
            let x = rng.spread_row(n, -1.0, 2.0);
            let y = dequantized(dtype, &quantized(dtype, &x), n);
            for (xs, ys) in x.chunks(QK_K).zip(y.chunks(QK_K)) {
                let err: f64 = xs
                    .iter()
                    .zip(ys)
                    .map(|(a, b)| ((a - b) as f64).powi(2))
                    .sum();
                let norm: f64 = xs.iter().map(|a| (*a as f64).powi(2)).sum();
                let rel = (err / norm).sqrt();
                assert!(
                    rel <= kquant_rms_bound(dtype),
                    "{dtype} seed {seed}: relative RMS error {rel}"
                );
            }
        }
    }
}

#[test]
fn float_round_trips_are_within_half_an_ulp() {
    let mut rng = Rng::from_env(3);
    let seed = rng.seed();
    let x = rng.spread_row(999, -3.0, 2.0);
    for (dtype, rel) in [
        (DType::F32, 0.0),
        (DType::F16, 1.0 / 2048.0),
        (DType::BF16, 1.0 / 256.0),
    ] {
        let y = dequantized(dtype, &quantized(dtype, &x), x.len());
        for (a, b) in x.iter().zip(&y) {
            // f16 subnormals are absolute, not relative.
            let bound = a.abs() * rel + if dtype == DType::F16 { 3e-8 } else { 0.0 };
            assert!((a - b).abs() <= bound, "{dtype} seed {seed}: {a} -> {b}");
        }
    }
}

#[test]
fn q4_0_known_block() {
    let mut bytes = vec![0u8; 18];
    bytes[..2].copy_from_slice(&f32_to_f16(0.5));
    for j in 0..16 {
        bytes[2 + j] = j as u8 | ((15 - j as u8) << 4);
    }
    let y = dequantized(DType::Q4_0, &bytes, 32);
    for j in 0..16 {
        assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
        assert_eq!(y[j + 16], (7.0 - j as f32) * 0.5);
    }
}

#[test]
fn q8_0_and_q8_1_round_half_to_even_like_ggml_x86() {
    // amax = 127 makes the multiplier exactly 1, so ties stay ties.
    let mut x = [0.25f32; 32];
    x[..6].copy_from_slice(&[127.0, 2.5, -0.5, 1.5, -2.5, 3.5]);
    let q = quantized(DType::Q8_0, &x);
    assert_eq!(f16_to_f32([q[0], q[1]]), 1.0);
    let qs: Vec<i8> = q[2..].iter().map(|&b| b as i8).collect();
    assert_eq!(&qs[..6], &[127, 2, 0, 2, -2, 4]);
    assert!(qs[6..].iter().all(|&v| v == 0));

    let q1 = quantized(DType::Q8_1, &x);
    assert_eq!(&q1[4..], &q[2..]);
    let sum: i32 = qs.iter().map(|&v| v as i32).sum();
    assert_eq!(f16_to_f32([q1[2], q1[3]]), sum as f32);
}

#[test]
fn q8_k_uses_the_signed_maximum_and_bsums() {
    let mut x = [0f32; 256];
    x[0] = -2.0;
    x[1] = 1.0;
    x[17] = 0.5;
    let q = quantized(DType::Q8_K, &x);
    let b: &BlockQ8K = bytemuck::from_bytes(&q);
    assert_eq!(b.d(), 1.0 / 63.5);
    // iscale = -127 / -2 = 63.5: the maximum maps to -127 ...
    assert_eq!(b.qs[0], -127);
    // ... and 63.5 is a tie that nearest_int sends to the even 64.
    assert_eq!(b.qs[1], 64);
    assert_eq!(b.qs[17], 32);
    assert_eq!(b.bsum(0), -127 + 64);
    assert_eq!(b.bsum(1), b.qs[17] as i16);
}

#[test]
fn q4_k_scales_pack_and_unpack() {
    let mut rng = Rng::from_env(4);
    let seed = rng.seed();
    for _ in 0..100 {
        let mut sc = [0u8; 8];
        let mut m = [0u8; 8];
        for j in 0..8 {
            sc[j] = rng.range(0, 64) as u8;
            m[j] = rng.range(0, 64) as u8;
        }
        assert_eq!(
            q4_k::unpack_scales_mins(&q4_k::pack_scales_mins(&sc, &m)),
            (sc, m),
            "seed {seed}"
        );
    }
}

/// Random block bytes with sane f16 scale fields at `scale_offsets`.
fn random_block(rng: &mut Rng, bytes: usize, scale_offsets: &[usize]) -> Vec<u8> {
    let mut b: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
    for &o in scale_offsets {
        b[o..o + 2].copy_from_slice(&f32_to_f16(rng.unit() + 0.01));
    }
    b
}

/// ggml's `dequantize_row_q6_K` loop, transcribed independently of
/// `BlockQ6K::quants`.
fn ggml_q6_k(b: &[u8]) -> Vec<f32> {
    let d = f16_to_f32([b[208], b[209]]);
    let mut y = vec![0f32; 256];
    for n in 0..2 {
        let (ql, qh, sc) = (&b[64 * n..], &b[128 + 32 * n..], &b[192 + 8 * n..]);
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[128 * n + l] = d * sc[is] as i8 as f32 * q1 as f32;
            y[128 * n + l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            y[128 * n + l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            y[128 * n + l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
    y
}

/// ggml's `dequantize_row_q3_K` loop (scales through the `kmask` shuffle).
fn ggml_q3_k(b: &[u8]) -> Vec<f32> {
    let d_all = f16_to_f32([b[108], b[109]]);
    let (hm, q) = (&b[0..32], &b[32..96]);
    let mut aux = [0u32; 4];
    for (i, a) in aux.iter_mut().take(3).enumerate() {
        *a = u32::from_le_bytes([b[96 + 4 * i], b[97 + 4 * i], b[98 + 4 * i], b[99 + 4 * i]]);
    }
    let (kmask1, kmask2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | ((tmp & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    let scales: Vec<i8> = aux
        .iter()
        .flat_map(|a| a.to_le_bytes())
        .map(|v| v as i8)
        .collect();
    let mut y = Vec::with_capacity(256);
    let (mut is, mut m) = (0, 1u8);
    for n in 0..2 {
        for j in 0..4 {
            let shift = 2 * j;
            for half in 0..2 {
                let dl = d_all * (scales[is] as i32 - 32) as f32;
                is += 1;
                for l in 16 * half..16 * half + 16 {
                    let v =
                        ((q[32 * n + l] >> shift) & 3) as i32 - if hm[l] & m != 0 { 0 } else { 4 };
                    y.push(dl * v as f32);
                }
            }
            m <<= 1;
        }
    }
    y
}

/// ggml's `dequantize_row_q2_K` loop.
fn ggml_q2_k(b: &[u8]) -> Vec<f32> {
    let (d, min) = (f16_to_f32([b[80], b[81]]), f16_to_f32([b[82], b[83]]));
    let mut y = Vec::with_capacity(256);
    let mut is = 0;
    for n in 0..2 {
        for shift in [0, 2, 4, 6] {
            for half in 0..2 {
                let sc = b[is];
                is += 1;
                let (dl, ml) = (d * (sc & 0xF) as f32, min * (sc >> 4) as f32);
                for l in 16 * half..16 * half + 16 {
                    y.push(dl * ((b[16 + 32 * n + l] >> shift) & 3) as f32 - ml);
                }
            }
        }
    }
    y
}

/// ggml's `dequantize_row_q4_K` / `q5_K` loops (`high` = the Q5_K qh bytes).
fn ggml_q45_k(b: &[u8], qs: &[u8], high: Option<&[u8]>) -> Vec<f32> {
    let (d, min) = (f16_to_f32([b[0], b[1]]), f16_to_f32([b[2], b[3]]));
    let scales: [u8; 12] = b[4..16].try_into().expect("12 bytes");
    let get = |j: usize| {
        if j < 4 {
            (scales[j] & 63, scales[j + 4] & 63)
        } else {
            (
                (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
                (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
            )
        }
    };
    let mut y = Vec::with_capacity(256);
    let (mut u1, mut u2) = (1u8, 2u8);
    for c in 0..4 {
        let ((s1, m1), (s2, m2)) = (get(2 * c), get(2 * c + 1));
        for (s, m, shift, u) in [(s1, m1, 0, u1), (s2, m2, 4, u2)] {
            for l in 0..32 {
                let h = high.map_or(0, |qh| if qh[l] & u != 0 { 16 } else { 0 });
                y.push(
                    d * s as f32 * (((qs[32 * c + l] >> shift) & 0xF) + h) as f32 - min * m as f32,
                );
            }
        }
        u1 <<= 2;
        u2 <<= 2;
    }
    y
}

#[test]
fn k_quant_layouts_match_ggml_decoding_loops() {
    let mut rng = Rng::from_env(5);
    let seed = rng.seed();
    for _ in 0..20 {
        let b = random_block(&mut rng, 210, &[208]);
        assert_eq!(
            dequantized(DType::Q6_K, &b, 256),
            ggml_q6_k(&b),
            "q6_k seed {seed}"
        );
        let b = random_block(&mut rng, 110, &[108]);
        assert_eq!(
            dequantized(DType::Q3_K, &b, 256),
            ggml_q3_k(&b),
            "q3_k seed {seed}"
        );
        let b = random_block(&mut rng, 84, &[80, 82]);
        assert_eq!(
            dequantized(DType::Q2_K, &b, 256),
            ggml_q2_k(&b),
            "q2_k seed {seed}"
        );
        let b = random_block(&mut rng, 144, &[0, 2]);
        assert_eq!(
            dequantized(DType::Q4_K, &b, 256),
            ggml_q45_k(&b, &b[16..], None),
            "q4_k seed {seed}"
        );
        let b = random_block(&mut rng, 176, &[0, 2]);
        assert_eq!(
            dequantized(DType::Q5_K, &b, 256),
            ggml_q45_k(&b, &b[48..], Some(&b[16..48])),
            "q5_k seed {seed}"
        );
    }
}

/// Reference dot vs the f64 dot of the dequantized rows. The integer parts
/// are exact, so the difference comes from f32 rounding of the block
/// combinations (relative 1e-5 of the sum of |terms| covers k up to 10^4)
/// and, for Q4_1/Q5_1, from the activation sum `s` being the f16 of
/// `d * sum(q)` with the unrounded `d`: per block `|m|` times the f16
/// rounding of `s` plus `|sum(q)|` times that of `d` (relative 2^-11,
/// absolute 2^-25 in the subnormal range).
#[test]
fn reference_dots_match_dequantized_dots() {
    let mut rng = Rng::from_env(6);
    let seed = rng.seed();
    for wdtype in WEIGHT_TYPES
        .into_iter()
        .chain([DType::F32, DType::F16, DType::BF16])
    {
        let adtype = vec_dot_type(wdtype);
        for _ in 0..30 {
            let n = wdtype.block_len().max(adtype.block_len()) * rng.range(1, 9);
            let (w, a) = (
                quantized(wdtype, &rng.spread_row(n, -3.0, 2.0)),
                quantized(adtype, &rng.spread_row(n, -3.0, 2.0)),
            );
            let got = vec_dot_reference(wdtype, &w, adtype, &a).expect("dot");
            let (wf, af) = (dequantized(wdtype, &w, n), dequantized(adtype, &a, n));
            let exact: f64 = wf.iter().zip(&af).map(|(x, y)| *x as f64 * *y as f64).sum();
            let abs_sum: f64 = wf
                .iter()
                .zip(&af)
                .map(|(x, y)| (*x as f64 * *y as f64).abs())
                .sum();
            let mut tol = 1e-5 * abs_sum + 1e-30;
            if matches!(wdtype, DType::Q4_1 | DType::Q5_1) {
                let f16_err = |v: f64| v.abs() / 2048.0 + 1.0 / (1u64 << 25) as f64;
                for (wb, ab) in w
                    .chunks(wdtype.block_bytes())
                    .zip(a.chunks(adtype.block_bytes()))
                {
                    let m = f16_to_f32([wb[2], wb[3]]) as f64;
                    let (d, s) = (
                        f16_to_f32([ab[0], ab[1]]) as f64,
                        f16_to_f32([ab[2], ab[3]]) as f64,
                    );
                    let qsum: i64 = ab[4..].iter().map(|&q| q as i8 as i64).sum();
                    tol += m.abs() * (f16_err(s) + qsum.unsigned_abs() as f64 * f16_err(d)) * 1.01;
                }
            }
            assert!(
                (got as f64 - exact).abs() <= tol,
                "{wdtype} seed {seed} n {n}: {got} vs {exact} (tol {tol})"
            );
        }
    }
}

#[test]
fn vec_dot_types_follow_ggml() {
    assert_eq!(vec_dot_type(DType::Q4_0), DType::Q8_0);
    assert_eq!(vec_dot_type(DType::Q4_1), DType::Q8_1);
    assert_eq!(vec_dot_type(DType::Q5_1), DType::Q8_1);
    assert_eq!(vec_dot_type(DType::Q8_0), DType::Q8_0);
    assert_eq!(vec_dot_type(DType::Q6_K), DType::Q8_K);
    assert_eq!(vec_dot_type(DType::F16), DType::F16);
    assert_eq!(vec_dot_type(DType::BF16), DType::BF16);
    assert_eq!(vec_dot_type(DType::F32), DType::F32);
}

#[test]
fn bad_lengths_and_types_are_errors() {
    let mut out = [0f32; 32];
    assert!(dequantize_row(DType::Q4_0, &[0u8; 17], &mut out).is_err());
    assert!(dequantize_row(DType::Q4_0, &[0u8; 36], &mut out).is_err());
    // Integer types have no block layout to decode (IQ2_XXS and MXFP4 now do).
    assert!(dequantize_row(DType::I16, &[0u8; 64], &mut [0f32; 32]).is_err());
    assert!(quantize_row(DType::Q8_0, &[1.0; 31], &mut [0u8; 34]).is_err());
    assert!(quantize_row(DType::Q8_0, &[1.0; 32], &mut [0u8; 33]).is_err());
    assert!(vec_dot_reference(DType::Q4_1, &[0u8; 20], DType::Q8_0, &[0u8; 34]).is_err());
    assert!(vec_dot_reference(DType::Q4_1, &[0u8; 20], DType::Q8_1, &[0u8; 72]).is_err());
}
