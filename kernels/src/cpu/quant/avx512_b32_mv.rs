//! AVX-512 (VNNI) decode kernel for the 32-element formats (Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0): one activation row against a range of weight rows,
//! straight from the GGUF rows.
//!
//! **Layout.** Two weight rows per 512-bit register: each 256-bit half is
//! ggml's AVX2 register for its row (lane `l` = elements `4l..4l+3` of the
//! block), so one `vpdpbusd` per block and row pair sums exactly what
//! ggml's lanes sum, and one FMA by `d_w * d_a` (per half) accumulates it
//! in ggml's order; `hsum_float_8` per row at the end. Bit-identical to
//! `scalar.rs`. Offsets (`code - OFFSET`) come in through start values
//! `-OFFSET * sum(y)` per lane, prepared once per call.
//!
//! **Streaming.** `ROWS` (eight) rows are in flight, read as 32-byte
//! pieces (no 128-bit inserts), their scales fetched with one gather per
//! block, the group `PREFETCH_GROUPS` ahead prefetched. The kernel is
//! meant to run at memory bandwidth: Gemma 3's decode is mostly its
//! 262144 x 640 Q8_0 output head.

#![allow(clippy::missing_safety_doc)]

use super::avx512_b32::{prepare_tokens, row_offsets, TokBlock};
use super::formats::{act_bytes, act_qs, Block32, Kind};
use core::arch::x86_64::*;

/// Weight rows in flight.
const ROWS: usize = 8;

/// Groups of `ROWS` ahead to prefetch.
const PREFETCH_GROUPS: usize = 2;

/// Decode: `out[r] = w_row(r) . act` for `rows` consecutive weight rows
/// starting at `w` (`row_bytes` apart, `nb` blocks each) and one activation
/// row `act`, using `tok` (room for `nb` entries) as scratch. `out` has
/// room for `rows` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matvec<F: Block32>(
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    act: *const u8,
    nb: usize,
    out: *mut f32,
    tok: *mut TokBlock,
) {
    prepare_tokens::<F>(act, nb, tok);
    let mut r0 = 0;
    while r0 < rows {
        let valid = (rows - r0).min(ROWS);
        let ahead = r0 + ROWS * PREFETCH_GROUPS;
        let next = (ahead < rows).then(|| w.add(ahead * row_bytes));
        let res = rows8::<F>(w.add(r0 * row_bytes), row_bytes, valid, act, tok, nb, next);
        _mm256_mask_storeu_ps(out.add(r0), ((1u16 << valid) - 1) as u8, res);
        r0 += ROWS;
    }
}

/// 32 bytes of row `a` then 32 bytes of row `b`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn pair32(a: *const u8, b: *const u8) -> __m512i {
    let lo = _mm512_castsi256_si512(_mm256_loadu_si256(a as *const __m256i));
    _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(b as *const __m256i))
}

/// The 32 nibble codes of a block of rows `a` and `b` (16 bytes each:
/// low nibbles = elements 0..15, high = 16..31), in element order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn nibbles2(a: *const u8, b: *const u8) -> __m512i {
    let aa = _mm256_broadcastsi128_si256(_mm_loadu_si128(a as *const __m128i));
    let bb = _mm256_broadcastsi128_si256(_mm_loadu_si128(b as *const __m128i));
    let z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(aa), bb);
    // 128-bit lanes 1 and 3 (i16 lanes 8..15, 24..31) take the high nibbles.
    let shifted = _mm512_mask_srli_epi16::<4>(z, 0xff00_ff00, z);
    _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f))
}

/// The unsigned codes of one block of rows `a` and `b`, in element order,
/// one row per 256-bit half.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn codes2<F: Block32>(a: *const u8, b: *const u8) -> __m512i {
    match F::KIND {
        Kind::Q8_0 => _mm512_xor_si512(pair32(a.add(F::QS), b.add(F::QS)), _mm512_set1_epi8(-128)),
        Kind::Q4_0 | Kind::Q4_1 => nibbles2(a.add(F::QS), b.add(F::QS)),
        Kind::Q5_0 | Kind::Q5_1 => {
            let c = nibbles2(a.add(F::QS), b.add(F::QS));
            let qa = (a.add(F::QH) as *const u32).read_unaligned() as u64;
            let qb = (b.add(F::QH) as *const u32).read_unaligned() as u64;
            _mm512_mask_add_epi8(c, qa | qb << 32, c, _mm512_set1_epi8(16))
        }
    }
}

/// Eight rows (the last `8 - valid` repeat row `valid - 1`) against one
/// activation row (`tok`: its prepared blocks); returns the eight dot
/// products. `next`: rows to prefetch.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn rows8<F: Block32>(
    base: *const u8,
    row_bytes: usize,
    valid: usize,
    act: *const u8,
    tok: *const TokBlock,
    nb: usize,
    next: Option<*const u8>,
) -> __m256 {
    let offs = row_offsets(row_bytes, valid);
    let voffs = _mm256_loadu_si256(offs.as_ptr() as *const __m256i);
    let ab = act_bytes(F::HAS_MIN);
    // Lane 2r of the gathered scales is row r's `d`: pair p's halves take
    // rows 2p and 2p + 1.
    let spread: [__m512i; 4] = core::array::from_fn(|p| {
        let (a, b) = (4 * p as i32, 4 * p as i32 + 2);
        _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b)
    });
    let z = _mm512_setzero_ps();
    let (mut acc, mut summs) = ([z; 4], z);
    for b in 0..nb {
        let x = base.add(b * F::BYTES);
        if let Some(n) = next {
            // A hint only: addresses past the matrix are harmless.
            let p = n.wrapping_add(b * ROWS * F::BYTES);
            for line in (0..ROWS * F::BYTES).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line) as *const i8);
            }
        }
        let tb = &*tok.add(b);
        let t = _mm512_cvtph_ps(_mm256_i32gather_epi32::<1>(x as *const i32, voffs));
        let d = _mm512_mul_ps(t, _mm512_set1_ps(tb.dy));
        if F::HAS_MIN {
            summs = _mm512_fmadd_ps(t, _mm512_set1_ps(tb.s), summs);
        }
        let qy = act.add(b * ab + act_qs(F::HAS_MIN));
        let a = _mm512_broadcast_i64x4(_mm256_loadu_si256(qy as *const __m256i));
        let init = if F::OFFSET == 0 {
            _mm512_setzero_si512()
        } else {
            _mm512_broadcast_i64x4(_mm256_loadu_si256(tb.init.as_ptr() as *const __m256i))
        };
        for (p, acc) in acc.iter_mut().enumerate() {
            let (xa, xb) = (
                x.offset(offs[2 * p] as isize),
                x.offset(offs[2 * p + 1] as isize),
            );
            let lanes = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init, codes2::<F>(xa, xb), a));
            *acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(spread[p], d), lanes, *acc);
        }
    }
    // hsum_float_8 per row: halves, then pairs, then the two sums.
    let fold = |a: __m512, c: __m512| {
        let s = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, c),
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, c),
        );
        let s2 = _mm512_add_ps(s, _mm512_permute_ps::<0b11_10_11_10>(s));
        _mm512_add_ps(s2, _mm512_permute_ps::<0b11_11_01_01>(s2))
    };
    let (s03, s47) = (fold(acc[0], acc[1]), fold(acc[2], acc[3]));
    let pick = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    let res = _mm512_castps512_ps256(_mm512_permutex2var_ps(s03, pick, s47));
    if F::HAS_MIN {
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0);
        _mm256_add_ps(
            res,
            _mm512_castps512_ps256(_mm512_permutexvar_ps(odd, summs)),
        )
    } else {
        res
    }
}
