//! AVX-512 (VNNI) decode kernel for the 32-element formats (Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0): one to [`MAX_TOKENS`] activation rows (a decode step
//! of a few sequences) against a range of weight rows, straight from the
//! GGUF rows, each weight block read once for all of them.
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

/// Most activation rows [`matvec`] takes in one pass over the weights
/// (a decode step of a few sequences); more take the prefill kernel.
pub(crate) const MAX_TOKENS: usize = 4;

/// Decode: `out[t * stride + r] = w_row(r) . act_row(t)` for `rows`
/// consecutive weight rows starting at `w` (`row_bytes` apart, `nb` blocks
/// each) and `T` activation rows from `act` (`act_row` bytes apart), using
/// `tok` (room for `T * nb` entries) as scratch. Each weight block is read
/// once for all `T` rows; every row's products are computed exactly as for
/// one row alone.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matvec<F: Block32, const T: usize>(
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    act: *const u8,
    act_row: usize,
    nb: usize,
    out: *mut f32,
    stride: usize,
    tok: *mut TokBlock,
) {
    let acts: [*const u8; T] = core::array::from_fn(|t| act.add(t * act_row));
    let toks: [*const TokBlock; T] = core::array::from_fn(|t| tok.add(t * nb) as *const TokBlock);
    for (t, &a) in acts.iter().enumerate() {
        prepare_tokens::<F>(a, nb, tok.add(t * nb));
    }
    let mut r0 = 0;
    while r0 < rows {
        let valid = (rows - r0).min(ROWS);
        let ahead = r0 + ROWS * PREFETCH_GROUPS;
        let next = (ahead < rows).then(|| w.add(ahead * row_bytes));
        let res = rows8::<F, T>(
            w.add(r0 * row_bytes),
            row_bytes,
            valid,
            &acts,
            &toks,
            nb,
            next,
        );
        for (t, r) in res.iter().enumerate() {
            _mm256_mask_storeu_ps(out.add(t * stride + r0), ((1u16 << valid) - 1) as u8, *r);
        }
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

/// Eight rows (the last `8 - valid` repeat row `valid - 1`) against `T`
/// activation rows (`toks[t]`: row `t`'s prepared blocks); returns the
/// eight dot products of each. `next`: rows to prefetch.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn rows8<F: Block32, const T: usize>(
    base: *const u8,
    row_bytes: usize,
    valid: usize,
    acts: &[*const u8; T],
    toks: &[*const TokBlock; T],
    nb: usize,
    next: Option<*const u8>,
) -> [__m256; T] {
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
    let (mut acc, mut summs) = ([[z; 4]; T], [z; T]);
    for b in 0..nb {
        let x = base.add(b * F::BYTES);
        if let Some(n) = next {
            // A hint only: addresses past the matrix are harmless.
            let p = n.wrapping_add(b * ROWS * F::BYTES);
            for line in (0..ROWS * F::BYTES).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line) as *const i8);
            }
        }
        let t = _mm512_cvtph_ps(_mm256_i32gather_epi32::<1>(x as *const i32, voffs));
        let codes: [__m512i; 4] = core::array::from_fn(|p| {
            codes2::<F>(
                x.offset(offs[2 * p] as isize),
                x.offset(offs[2 * p + 1] as isize),
            )
        });
        for tt in 0..T {
            let tb = &*toks[tt].add(b);
            let d = _mm512_mul_ps(t, _mm512_set1_ps(tb.dy));
            if F::HAS_MIN {
                summs[tt] = _mm512_fmadd_ps(t, _mm512_set1_ps(tb.s), summs[tt]);
            }
            let qy = acts[tt].add(b * ab + act_qs(F::HAS_MIN));
            let a = _mm512_broadcast_i64x4(_mm256_loadu_si256(qy as *const __m256i));
            let init = if F::OFFSET == 0 {
                _mm512_setzero_si512()
            } else {
                _mm512_broadcast_i64x4(_mm256_loadu_si256(tb.init.as_ptr() as *const __m256i))
            };
            for (p, acc) in acc[tt].iter_mut().enumerate() {
                let lanes = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init, codes[p], a));
                *acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(spread[p], d), lanes, *acc);
            }
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
    let pick = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0);
    core::array::from_fn(|tt| {
        let (s03, s47) = (fold(acc[tt][0], acc[tt][1]), fold(acc[tt][2], acc[tt][3]));
        let res = _mm512_castps512_ps256(_mm512_permutex2var_ps(s03, pick, s47));
        if F::HAS_MIN {
            _mm256_add_ps(
                res,
                _mm512_castps512_ps256(_mm512_permutexvar_ps(odd, summs[tt])),
            )
        } else {
            res
        }
    })
}
