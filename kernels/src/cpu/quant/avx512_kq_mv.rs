//! AVX-512 decode kernels (one activation row) for Q4_K and Q6_K, straight
//! from the GGUF rows.
//!
//! - [`DotOrder::VecDot`] (Q6_K; Q4_K whose row count is no multiple of
//!   8): two weight rows per 512-bit register, each 256-bit half exactly
//!   ggml's AVX2 register for that row (`ggml_vec_dot_q4_K_q8_K` /
//!   `_q6_K_`), so every lane sums the same integers and accumulates them
//!   in the same order; the rows are reduced with `hsum_float_8` at the end.
//! - [`DotOrder::RepackGemv`] (Q4_K, the usual case): eight rows in
//!   flight; per super-block the exact integer sums of every row are
//!   folded into one register (lane `4q + {0,1,2,3}`: row `q`'s `isum`,
//!   `imin`, row `4 + q`'s `isum`, `imin`), so one fused multiply-add
//!   accumulates both sums of all eight rows, as `ggml_gemv_q4_K_8x8_q8_K`
//!   does per row.
//!
//! Bit-identical to `scalar.rs`.
//!
//! [`DotOrder::VecDot`]: super::DotOrder::VecDot
//! [`DotOrder::RepackGemv`]: super::DotOrder::RepackGemv

#![allow(clippy::missing_safety_doc)]

use super::formats::kq;
use core::arch::x86_64::*;

/// ggml's `hsum_float_8` of both 256-bit halves: lane 0 of each 128-bit
/// pair (0 and 8) holds row 0's / row 1's sum.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn hsum_halves(x: __m512) -> (f32, f32) {
    let lo = _mm512_castps512_ps256(x);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
    (super::avx2::hsum8(lo), super::avx2::hsum8(hi))
}

/// 32 bytes of row 0 and 32 bytes of row 1.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn pair32(r0: *const u8, r1: *const u8) -> __m512i {
    let lo = _mm512_castsi256_si512(_mm256_loadu_si256(r0 as *const __m256i));
    _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(r1 as *const __m256i))
}

/// 32 activation bytes in both halves.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn both32(y: *const u8) -> __m512i {
    _mm512_broadcast_i64x4(_mm256_loadu_si256(y as *const __m256i))
}

/// An f32 per half.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn halves(a: f32, b: f32) -> __m512 {
    _mm512_insertf32x8::<1>(_mm512_castps256_ps512(_mm256_set1_ps(a)), _mm256_set1_ps(b))
}

/// Q4_K's eight 6-bit scales and eight mins of one super-block, one per
/// byte (ggml's `kmask` unpacking of the 12 packed bytes).
#[inline]
unsafe fn q4k_scales(x: *const u8) -> (i64, i64) {
    let p = x.add(4) as *const u32;
    let (a, b, c) = (
        p.read_unaligned(),
        p.add(1).read_unaligned(),
        p.add(2).read_unaligned(),
    );
    let (k1, k2, k3) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    let sc = (a & k1) as u64 | (((c & k2) | (((a >> 6) & k3) << 4)) as u64) << 32;
    let m = (b & k1) as u64 | ((((c >> 4) & k2) | (((b >> 6) & k3) << 4)) as u64) << 32;
    (sc as i64, m as i64)
}

#[inline]
fn f16(p: *const u8) -> f32 {
    // SAFETY: callers pass pointers to two readable bytes of a block.
    let bits = unsafe { (p as *const u16).read_unaligned() };
    half::f16::from_bits(bits).to_f32()
}

/// Rows `0..rows` (at `w`, `row_bytes` apart) of Q4_K against one Q8_K row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn matvec_q4k(
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    act: *const u8,
    nb: usize,
    out: *mut f32,
) {
    let mut r = 0;
    while r < rows {
        let r1 = if r + 1 < rows { r + 1 } else { r };
        let (a, b) = pair_q4k(w.add(r * row_bytes), w.add(r1 * row_bytes), act, nb);
        *out.add(r) = a;
        if r + 1 < rows {
            *out.add(r + 1) = b;
        }
        r += 2;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn pair_q4k(w0: *const u8, w1: *const u8, act: *const u8, nb: usize) -> (f32, f32) {
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = _mm512_setzero_ps();
    let mut acc_m = _mm256_setzero_ps();
    for i in 0..nb {
        let (x0, x1) = (w0.add(i * kq::Q4K_BYTES), w1.add(i * kq::Q4K_BYTES));
        let y = act.add(i * kq::Q8K_BYTES);
        let yd = (y as *const f32).read_unaligned();
        let ((sc0, m0), (sc1, m1)) = (q4k_scales(x0), q4k_scales(x1));
        let packed = _mm_set_epi64x(sc1, sc0);
        let mins = _mm_set_epi64x(m1, m0);
        let sc16 = _mm256_cvtepu8_epi16(packed); // [sc0 x8 | sc1 x8] as i16
        let scales = _mm512_shuffle_i64x2::<0b01_01_00_00>(
            _mm512_castsi256_si512(sc16),
            _mm512_castsi256_si512(sc16),
        );
        // Minimums: ggml's four lanes per row, m * (bsums pairs).
        let bs = _mm256_loadu_si256(y.add(kq::Q8K_BSUMS) as *const __m256i);
        let q8s = _mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        );
        let mins16 = _mm256_cvtepu8_epi16(mins);
        let prod = _mm256_madd_epi16(mins16, _mm256_broadcastsi128_si256(q8s));
        let dmin = _mm256_insertf128_ps::<1>(
            _mm256_castps128_ps256(_mm_set1_ps(-yd * f16(x0.add(2)))),
            _mm_set1_ps(-yd * f16(x1.add(2))),
        );
        acc_m = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(prod), acc_m);
        let mut sumi = _mm512_setzero_si512();
        for j in 0..4 {
            let bits = pair32(x0.add(kq::Q4K_QS + 32 * j), x1.add(kq::Q4K_QS + 32 * j));
            let lo = _mm512_and_si512(bits, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(bits), m4);
            let ylo = both32(y.add(kq::Q8K_QS + 64 * j));
            let yhi = both32(y.add(kq::Q8K_QS + 64 * j + 32));
            let sl = _mm512_shuffle_epi8(
                scales,
                _mm512_set1_epi16((0x0101 * (4 * j as i16)) + 0x0100),
            );
            let sh = _mm512_shuffle_epi8(
                scales,
                _mm512_set1_epi16((0x0101 * (4 * j as i16 + 2)) + 0x0100),
            );
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(lo, ylo), sl);
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(hi, yhi), sh);
        }
        let d = halves(yd * f16(x0), yd * f16(x1));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
    }
    let (a, b) = hsum_halves(acc);
    let m = |v: __m128| {
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
    };
    (
        a + m(_mm256_castps256_ps128(acc_m)),
        b + m(_mm256_extractf128_ps::<1>(acc_m)),
    )
}

/// Weight-row groups of eight ahead to prefetch in the gemv kernel.
const PREFETCH_GROUPS: usize = 2;

/// Sums of four lanes, transposed: lane `4q + t` of the result is the sum
/// of lanes `4q..4q + 4` of `v[t]` (exact, i32).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(crate) fn sum4_transposed(v: [__m512i; 4]) -> __m512i {
    let s01 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(v[0], v[1]),
        _mm512_unpackhi_epi32(v[0], v[1]),
    );
    let s23 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(v[2], v[3]),
        _mm512_unpackhi_epi32(v[2], v[3]),
    );
    _mm512_add_epi32(
        _mm512_unpacklo_epi64(s01, s23),
        _mm512_unpackhi_epi64(s01, s23),
    )
}

/// Q4_K rows `0..rows` against `T` Q8_K rows (`act`, `act_row` bytes
/// apart; outputs `stride` apart) in the repacked gemv order, each weight
/// block read once for all of them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matvec_q4k_gemv<const T: usize>(
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    act: *const u8,
    act_row: usize,
    nb: usize,
    out: *mut f32,
    stride: usize,
) {
    let acts: [*const u8; T] = core::array::from_fn(|t| act.add(t * act_row));
    let mut r0 = 0;
    while r0 < rows {
        let valid = (rows - r0).min(8);
        let ahead = r0 + 8 * PREFETCH_GROUPS;
        let next = (ahead < rows).then(|| w.add(ahead * row_bytes));
        let res = gemv8_q4k::<T>(w.add(r0 * row_bytes), row_bytes, valid, &acts, nb, next);
        for (t, v) in res.into_iter().enumerate() {
            _mm256_mask_storeu_ps(out.add(t * stride + r0), ((1u16 << valid) - 1) as u8, v);
        }
        r0 += 8;
    }
}

/// Eight Q4_K rows (the last `8 - valid` repeat row `valid - 1`) against
/// `T` Q8_K rows; `next`: the rows to prefetch.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn gemv8_q4k<const T: usize>(
    base: *const u8,
    row_bytes: usize,
    valid: usize,
    acts: &[*const u8; T],
    nb: usize,
    next: Option<*const u8>,
) -> [__m256; T] {
    let m4 = _mm512_set1_epi8(0x0f);
    let offs: [i32; 8] = core::array::from_fn(|r| (r.min(valid - 1) * row_bytes) as i32);
    let voffs = _mm256_loadu_si256(offs.as_ptr() as *const __m256i);
    // (d, dmin) of row r at lanes 2r, 2r + 1, moved to the sums' layout.
    let dm_order = _mm512_setr_epi32(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let x = base.add(b * kq::Q4K_BYTES);
        let ys: [*const u8; T] = core::array::from_fn(|t| acts[t].add(b * kq::Q8K_BYTES));
        if let Some(n) = next {
            // A hint only: addresses past the matrix are harmless.
            let p = n.wrapping_add(b * 8 * kq::Q4K_BYTES);
            for line in (0..8 * kq::Q4K_BYTES).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line) as *const i8);
            }
        }
        let mut mins = [0i64; 8];
        let sums: [[__m512i; T]; 4] = core::array::from_fn(|p| {
            let (xa, xb) = (
                x.offset(offs[2 * p] as isize),
                x.offset(offs[2 * p + 1] as isize),
            );
            let ((sca, ma), (scb, mb)) = (q4k_scales(xa), q4k_scales(xb));
            (mins[2 * p], mins[2 * p + 1]) = (ma, mb);
            pair_sums_q4k::<T>(xa, xb, sca, scb, &ys, m4)
        });
        // Rows 0..3 / 4..7, one per 128-bit lane (the two halves of each
        // row's eight lanes added).
        let fold = |a: __m512i, c: __m512i| {
            _mm512_add_epi32(
                _mm512_shuffle_i64x2::<0b10_00_10_00>(a, c),
                _mm512_shuffle_i64x2::<0b11_01_11_01>(a, c),
            )
        };
        let dm = _mm512_cvtph_ps(_mm256_i32gather_epi32::<1>(x as *const i32, voffs));
        let dm = _mm512_permutexvar_ps(dm_order, dm);
        let m16 = |m: &[i64]| _mm512_cvtepu8_epi16(_mm256_setr_epi64x(m[0], m[1], m[2], m[3]));
        let (m_lo, m_hi) = (m16(&mins[0..4]), m16(&mins[4..8]));
        for t in 0..T {
            let y = ys[t];
            let bs = _mm256_loadu_si256(y.add(kq::Q8K_BSUMS) as *const __m256i);
            let bs32 = _mm512_broadcast_i32x4(_mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            ));
            let v = sum4_transposed([
                fold(sums[0][t], sums[1][t]),
                _mm512_madd_epi16(m_lo, bs32),
                fold(sums[2][t], sums[3][t]),
                _mm512_madd_epi16(m_hi, bs32),
            ]);
            let yd = _mm512_set1_ps((y as *const f32).read_unaligned());
            let scale = _mm512_mul_ps(dm, yd);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), scale, acc[t]);
        }
    }
    let sums = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    let mins = _mm512_setr_epi32(1, 5, 9, 13, 3, 7, 11, 15, 0, 0, 0, 0, 0, 0, 0, 0);
    core::array::from_fn(|t| {
        _mm256_sub_ps(
            _mm512_castps512_ps256(_mm512_permutexvar_ps(sums, acc[t])),
            _mm512_castps512_ps256(_mm512_permutexvar_ps(mins, acc[t])),
        )
    })
}

/// The scaled code x activation lanes of one super-block of two Q4_K rows
/// (row `a` in the low 256 bits, `b` in the high), ggml's AVX2 layout per
/// half, against each of `T` activation super-blocks `ys[t]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn pair_sums_q4k<const T: usize>(
    xa: *const u8,
    xb: *const u8,
    sca: i64,
    scb: i64,
    ys: &[*const u8; T],
    m4: __m512i,
) -> [__m512i; T] {
    let sc16 = _mm256_cvtepu8_epi16(_mm_set_epi64x(scb, sca));
    let scales = _mm512_shuffle_i64x2::<0b01_01_00_00>(
        _mm512_castsi256_si512(sc16),
        _mm512_castsi256_si512(sc16),
    );
    let mut sumi = [_mm512_setzero_si512(); T];
    for j in 0..4 {
        let bits = pair32(xa.add(kq::Q4K_QS + 32 * j), xb.add(kq::Q4K_QS + 32 * j));
        let lo = _mm512_and_si512(bits, m4);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(bits), m4);
        let sl = _mm512_shuffle_epi8(scales, _mm512_set1_epi16(0x0101 * (4 * j as i16) + 0x0100));
        let sh = _mm512_shuffle_epi8(
            scales,
            _mm512_set1_epi16(0x0101 * (4 * j as i16 + 2) + 0x0100),
        );
        for t in 0..T {
            let ylo = both32(ys[t].add(kq::Q8K_QS + 64 * j));
            let yhi = both32(ys[t].add(kq::Q8K_QS + 64 * j + 32));
            sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(lo, ylo), sl);
            sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(hi, yhi), sh);
        }
    }
    sumi
}

/// Rows `0..rows` of Q6_K against `T` Q8_K rows (`act`, `act_row` bytes
/// apart; outputs `stride` apart): each weight block is read once for all
/// of them, every product in the one-row order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matvec_q6k<const T: usize>(
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    act: *const u8,
    act_row: usize,
    nb: usize,
    out: *mut f32,
    stride: usize,
) {
    let acts: [*const u8; T] = core::array::from_fn(|t| act.add(t * act_row));
    let mut r = 0;
    while r < rows {
        let r1 = if r + 1 < rows { r + 1 } else { r };
        let sums = pair_q6k::<T>(w.add(r * row_bytes), w.add(r1 * row_bytes), &acts, nb);
        for (t, (a, b)) in sums.into_iter().enumerate() {
            *out.add(t * stride + r) = a;
            if r + 1 < rows {
                *out.add(t * stride + r + 1) = b;
            }
        }
        r += 2;
    }
}

/// Two Q6_K rows against `T` activation rows: per row and activation, the
/// sums of ggml's AVX2 `vec_dot` (each 256-bit half one row's register).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn pair_q6k<const T: usize>(
    w0: *const u8,
    w1: *const u8,
    acts: &[*const u8; T],
    nb: usize,
) -> [(f32, f32); T] {
    let (m4, m2) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(3));
    let mut acc = [_mm512_setzero_ps(); T];
    for i in 0..nb {
        let (x0, x1) = (w0.add(i * kq::Q6K_BYTES), w1.add(i * kq::Q6K_BYTES));
        let ys: [*const u8; T] = core::array::from_fn(|t| acts[t].add(i * kq::Q8K_BYTES));
        // Row scales as i16: [row 0's 16 | row 0's 16 | row 1's | row 1's]
        // (8 per 128-bit lane, shuffled per chunk below).
        let s0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x0.add(kq::Q6K_SCALES) as *const __m128i));
        let s1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x1.add(kq::Q6K_SCALES) as *const __m128i));
        let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(s0), s1);
        // ggml's offset lanes: 32 * (bsum[2l] sc[2l] + bsum[2l+1] sc[2l+1]).
        let mut sumi: [__m512i; T] = core::array::from_fn(|t| {
            let bsums = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                ys[t].add(kq::Q8K_BSUMS) as *const __m256i
            ));
            _mm512_sub_epi32(
                _mm512_setzero_si512(),
                _mm512_slli_epi32::<5>(_mm512_madd_epi16(bsums, both)),
            )
        });
        for h in 0..2 {
            let ql0 = pair32(x0.add(64 * h), x1.add(64 * h));
            let ql1 = pair32(x0.add(64 * h + 32), x1.add(64 * h + 32));
            let qh = pair32(x0.add(kq::Q6K_QH + 32 * h), x1.add(kq::Q6K_QH + 32 * h));
            let high = |v: __m512i| _mm512_slli_epi16::<4>(_mm512_and_si512(v, m2));
            let q = [
                _mm512_or_si512(_mm512_and_si512(ql0, m4), high(qh)),
                _mm512_or_si512(_mm512_and_si512(ql1, m4), high(_mm512_srli_epi16::<2>(qh))),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql0), m4),
                    high(_mm512_srli_epi16::<4>(qh)),
                ),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql1), m4),
                    high(_mm512_srli_epi16::<6>(qh)),
                ),
            ];
            // Scales 8h..8h+8 of each row, two per 32-element chunk.
            let (sr0, sr1) = if h == 0 {
                (_mm256_castsi256_si128(s0), _mm256_castsi256_si128(s1))
            } else {
                (
                    _mm256_extracti128_si256::<1>(s0),
                    _mm256_extracti128_si256::<1>(s1),
                )
            };
            let sc = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_broadcastsi128_si256(sr0)),
                _mm256_broadcastsi128_si256(sr1),
            );
            for (k, qk) in q.iter().enumerate() {
                // i16 lanes 0..7 of each half: scale 2k, lanes 8..15: 2k+1.
                let e = (2 * k) as i8;
                let lo = _mm_set_epi8(
                    2 * e + 1,
                    2 * e,
                    2 * e + 1,
                    2 * e,
                    2 * e + 1,
                    2 * e,
                    2 * e + 1,
                    2 * e,
                    2 * e + 1,
                    2 * e,
                    2 * e + 1,
                    2 * e,
                    2 * e + 1,
                    2 * e,
                    2 * e + 1,
                    2 * e,
                );
                let hi = _mm_add_epi8(lo, _mm_set1_epi8(2));
                let ctl = _mm512_broadcast_i32x4(lo);
                let ctl = _mm512_mask_blend_epi64(0b1100_1100, ctl, _mm512_broadcast_i32x4(hi));
                let scale = _mm512_shuffle_epi8(sc, ctl);
                for t in 0..T {
                    let yk = both32(ys[t].add(kq::Q8K_QS + 128 * h + 32 * k));
                    let p16 = _mm512_maddubs_epi16(*qk, yk);
                    sumi[t] = _mm512_add_epi32(sumi[t], _mm512_madd_epi16(scale, p16));
                }
            }
        }
        let (d0, d1) = (f16(x0.add(kq::Q6K_D)), f16(x1.add(kq::Q6K_D)));
        for t in 0..T {
            let yd = (ys[t] as *const f32).read_unaligned();
            let d = halves(yd * d0, yd * d1);
            acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    core::array::from_fn(|t| hsum_halves(acc[t]))
}
