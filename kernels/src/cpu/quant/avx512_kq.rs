//! AVX-512 kernels for the K super-block formats Q4_K and Q6_K against Q8_K
//! activations.
//!
//! Same register layout as `avx512_b32.rs` (128-bit lane = weight row,
//! *lo*/*hi* registers = ggml's lanes 0..3 / 4..7 = elements 0..15 /
//! 16..31 of every 32-element chunk). Per chunk the 6- or 8-bit sub-block
//! scale multiplies the pair sums with `vpdpwssd`, exactly as ggml's
//! `madd(scale, maddubs(q, y))`; per super-block the integer lanes are
//! converted and accumulated with one FMA by `d_w * d_a` (Q4_K's minimums
//! through four extra lanes per row), then reduced in `hsum_float_8` order.
//!
//! Weights are unpacked into panels of four rows (codes, spread scales)
//! and multiplied with up to four tokens per register tile. Q6_K's codes
//! are signed (`q - 32`); the activations are offset to unsigned
//! (`y + 128`) so `vpmaddubsw` can take them, and the `128 * (q - 32)` terms
//! are subtracted through a per-row start value computed at packing.
//! One token at a time (decode) goes to `avx512_kq_mv.rs`, which reads the
//! GGUF rows directly and gives the same results.

#![allow(clippy::missing_safety_doc)]

use super::formats::kq;
use super::matmul::RawCall;
use super::{avx512_kq_mv, scalar};
use core::arch::x86_64::*;
use weft_ops::quant::{f16_to_f32, unpack_q4k_scales_mins};
use weft_ops::{DType, OpError};

/// One super-block of four rows, unpacked.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct KPanel {
    lo: [[u8; 64]; 8],
    hi: [[u8; 64]; 8],
    sc_lo: [[i16; 32]; 8],
    sc_hi: [[i16; 32]; 8],
    init_lo: [i32; 16],
    init_hi: [i32; 16],
    d: [f32; 16],
    dmin: [f32; 16],
    mins: [i16; 32],
}

/// One super-block of one token: Q6_K's offset quants and the scales.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct KTok {
    flipped: [u8; 256],
    dy: f32,
    ndy: f32,
    bs32: [i16; 8],
}

const TILE: usize = 4;

/// Runs a Q4_K / Q6_K product (`c` validated by the caller).
pub(crate) unsafe fn matmul(wdtype: DType, c: &RawCall) -> Result<(), OpError> {
    let nb = c.k / 256;
    let q6 = wdtype == DType::Q6_K;
    if c.n == 1 {
        if q6 {
            avx512_kq_mv::matvec_q6k(c.w, c.row_bytes, c.rows, c.act, nb, c.out);
        } else {
            avx512_kq_mv::matvec_q4k(c.w, c.row_bytes, c.rows, c.act, nb, c.out);
        }
        return Ok(());
    }
    let panel_bytes = nb * size_of::<KPanel>();
    let tok_bytes = c.n * nb * size_of::<KTok>();
    super::matmul::with_scratch(panel_bytes + tok_bytes, |s| {
        let panel = s as *mut KPanel;
        let tok = s.add(panel_bytes) as *mut KTok;
        for t in 0..c.n {
            prepare_tokens(c.act.add(t * c.act_row), nb, q6, tok.add(t * nb));
        }
        let mut r0 = 0;
        while r0 < c.rows {
            let valid = (c.rows - r0).min(4);
            for b in 0..nb {
                let p = &mut *panel.add(b);
                for r in 0..4 {
                    let x = c.w.add(
                        (r0 + r.min(valid - 1)) * c.row_bytes
                            + b * if q6 { kq::Q6K_BYTES } else { kq::Q4K_BYTES },
                    );
                    if q6 {
                        pack_q6k_row(x, r, p);
                    } else {
                        pack_q4k_row(x, r, p);
                    }
                }
            }
            let mut t0 = 0;
            while t0 < c.n {
                let tt = (c.n - t0).min(TILE);
                let out = c.out.add(r0);
                match (q6, tt) {
                    (false, 4) => tile::<false, 4>(panel, nb, c, tok, t0, out, valid),
                    (false, 3) => tile::<false, 3>(panel, nb, c, tok, t0, out, valid),
                    (false, 2) => tile::<false, 2>(panel, nb, c, tok, t0, out, valid),
                    (false, _) => tile::<false, 1>(panel, nb, c, tok, t0, out, valid),
                    (true, 4) => tile::<true, 4>(panel, nb, c, tok, t0, out, valid),
                    (true, 3) => tile::<true, 3>(panel, nb, c, tok, t0, out, valid),
                    (true, 2) => tile::<true, 2>(panel, nb, c, tok, t0, out, valid),
                    (true, _) => tile::<true, 1>(panel, nb, c, tok, t0, out, valid),
                }
                t0 += tt;
            }
            r0 += 4;
        }
    });
    Ok(())
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn prepare_tokens(act: *const u8, nb: usize, q6: bool, tok: *mut KTok) {
    for b in 0..nb {
        let y = act.add(b * kq::Q8K_BYTES);
        let t = &mut *tok.add(b);
        if q6 {
            let flip = _mm512_set1_epi8(-128);
            for i in 0..4 {
                let v = _mm512_loadu_si512(y.add(kq::Q8K_QS + 64 * i) as *const __m512i);
                _mm512_storeu_si512(
                    t.flipped.as_mut_ptr().add(64 * i) as *mut __m512i,
                    _mm512_xor_si512(v, flip),
                );
            }
        }
        t.dy = (y as *const f32).read_unaligned();
        t.ndy = -t.dy;
        let bs = _mm256_loadu_si256(y.add(kq::Q8K_BSUMS) as *const __m256i);
        let pairs = _mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        );
        _mm_storeu_si128(t.bs32.as_mut_ptr() as *mut __m128i, pairs);
    }
}

/// Writes row `r`'s 16-byte pieces of chunk `c` (lo, hi) into the panel.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn put_chunk(p: &mut KPanel, c: usize, r: usize, codes: __m256i) {
    _mm_storeu_si128(
        p.lo[c].as_mut_ptr().add(16 * r) as *mut __m128i,
        _mm256_castsi256_si128(codes),
    );
    _mm_storeu_si128(
        p.hi[c].as_mut_ptr().add(16 * r) as *mut __m128i,
        _mm256_extracti128_si256::<1>(codes),
    );
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn pack_q4k_row(x: *const u8, r: usize, p: &mut KPanel) {
    let m4 = _mm256_set1_epi8(0x0f);
    for j in 0..4 {
        let bits = _mm256_loadu_si256(x.add(kq::Q4K_QS + 32 * j) as *const __m256i);
        put_chunk(p, 2 * j, r, _mm256_and_si256(bits, m4));
        put_chunk(
            p,
            2 * j + 1,
            r,
            _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
        );
    }
    let scales: [u8; 12] = (x.add(4) as *const [u8; 12]).read_unaligned();
    let (sc, m) = unpack_q4k_scales_mins(&scales);
    for (dst, &s) in p.sc_lo.iter_mut().zip(&sc) {
        dst[8 * r..8 * r + 8].fill(s as i16);
    }
    for (i, &mv) in m.iter().enumerate() {
        p.mins[8 * r + i] = mv as i16;
    }
    p.d[4 * r..4 * r + 4].fill(f16_to_f32([*x, *x.add(1)]));
    p.dmin[4 * r..4 * r + 4].fill(f16_to_f32([*x.add(2), *x.add(3)]));
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn pack_q6k_row(x: *const u8, r: usize, p: &mut KPanel) {
    let codes = scalar::q6k_codes(std::slice::from_raw_parts(x, kq::Q6K_BYTES));
    let (mut init_lo, mut init_hi) = ([0i32; 4], [0i32; 4]);
    for c in 0..8 {
        let mut signed = [0u8; 32];
        for (s, &q) in signed.iter_mut().zip(&codes[32 * c..32 * c + 32]) {
            *s = (q as i8 - 32) as u8;
        }
        put_chunk(
            p,
            c,
            r,
            _mm256_loadu_si256(signed.as_ptr() as *const __m256i),
        );
        let (s_lo, s_hi) = (
            *x.add(kq::Q6K_SCALES + 2 * c) as i8 as i32,
            *x.add(kq::Q6K_SCALES + 2 * c + 1) as i8 as i32,
        );
        p.sc_lo[c][8 * r..8 * r + 8].fill(s_lo as i16);
        p.sc_hi[c][8 * r..8 * r + 8].fill(s_hi as i16);
        for i in 0..4 {
            let group = |e0: usize| {
                (e0..e0 + 4)
                    .map(|e| codes[32 * c + e] as i32 - 32)
                    .sum::<i32>()
            };
            init_lo[i] -= 128 * s_lo * group(4 * i);
            init_hi[i] -= 128 * s_hi * group(16 + 4 * i);
        }
    }
    p.init_lo[4 * r..4 * r + 4].copy_from_slice(&init_lo);
    p.init_hi[4 * r..4 * r + 4].copy_from_slice(&init_hi);
    p.d[4 * r..4 * r + 4].fill(f16_to_f32([*x.add(kq::Q6K_D), *x.add(kq::Q6K_D + 1)]));
}

/// Four rows against `T` tokens starting at `t0`; `out` is the output of
/// the panel's first row for token 0 of the call.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const Q6: bool, const T: usize>(
    panel: *const KPanel,
    nb: usize,
    c: &RawCall,
    tok: *const KTok,
    t0: usize,
    out: *mut f32,
    valid: usize,
) {
    let z = _mm512_setzero_ps();
    let (mut lo, mut hi, mut accm) = ([z; T], [z; T], [z; T]);
    for b in 0..nb {
        let p = &*panel.add(b);
        let toks: [&KTok; T] = core::array::from_fn(|t| &*tok.add((t0 + t) * nb + b));
        let ys: [*const u8; T] = core::array::from_fn(|t| {
            if Q6 {
                toks[t].flipped.as_ptr()
            } else {
                c.act
                    .add((t0 + t) * c.act_row + b * kq::Q8K_BYTES + kq::Q8K_QS)
            }
        });
        let (mut ilo, mut ihi) = if Q6 {
            let (l, h) = (
                _mm512_loadu_si512(p.init_lo.as_ptr() as *const __m512i),
                _mm512_loadu_si512(p.init_hi.as_ptr() as *const __m512i),
            );
            ([l; T], [h; T])
        } else {
            ([_mm512_setzero_si512(); T], [_mm512_setzero_si512(); T])
        };
        for ch in 0..8 {
            let wl = _mm512_loadu_si512(p.lo[ch].as_ptr() as *const __m512i);
            let wh = _mm512_loadu_si512(p.hi[ch].as_ptr() as *const __m512i);
            let sl = _mm512_loadu_si512(p.sc_lo[ch].as_ptr() as *const __m512i);
            let sh = if Q6 {
                _mm512_loadu_si512(p.sc_hi[ch].as_ptr() as *const __m512i)
            } else {
                sl
            };
            for t in 0..T {
                let a_lo =
                    _mm512_broadcast_i32x4(_mm_loadu_si128(ys[t].add(32 * ch) as *const __m128i));
                let a_hi = _mm512_broadcast_i32x4(_mm_loadu_si128(
                    ys[t].add(32 * ch + 16) as *const __m128i
                ));
                let (p_lo, p_hi) = if Q6 {
                    (
                        _mm512_maddubs_epi16(a_lo, wl),
                        _mm512_maddubs_epi16(a_hi, wh),
                    )
                } else {
                    (
                        _mm512_maddubs_epi16(wl, a_lo),
                        _mm512_maddubs_epi16(wh, a_hi),
                    )
                };
                ilo[t] = _mm512_dpwssd_epi32(ilo[t], p_lo, sl);
                ihi[t] = _mm512_dpwssd_epi32(ihi[t], p_hi, sh);
            }
        }
        let d = _mm512_loadu_ps(p.d.as_ptr());
        for t in 0..T {
            let pd = _mm512_mul_ps(d, _mm512_set1_ps(toks[t].dy));
            lo[t] = _mm512_fmadd_ps(pd, _mm512_cvtepi32_ps(ilo[t]), lo[t]);
            hi[t] = _mm512_fmadd_ps(pd, _mm512_cvtepi32_ps(ihi[t]), hi[t]);
            if !Q6 {
                let mins = _mm512_loadu_si512(p.mins.as_ptr() as *const __m512i);
                let bs = _mm512_broadcast_i32x4(_mm_loadu_si128(
                    toks[t].bs32.as_ptr() as *const __m128i
                ));
                let prod = _mm512_madd_epi16(mins, bs);
                let dm = _mm512_mul_ps(
                    _mm512_loadu_ps(p.dmin.as_ptr()),
                    _mm512_set1_ps(toks[t].ndy),
                );
                accm[t] = _mm512_fmadd_ps(dm, _mm512_cvtepi32_ps(prod), accm[t]);
            }
        }
    }
    let pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    let mask = ((1u16 << valid) - 1) as u8;
    for t in 0..T {
        let s = _mm512_add_ps(hi[t], lo[t]);
        let s2 = _mm512_add_ps(s, _mm512_permute_ps::<0b11_10_11_10>(s));
        let mut s3 = _mm512_add_ps(s2, _mm512_permute_ps::<0b11_11_01_01>(s2));
        if !Q6 {
            let m = accm[t];
            let m2 = _mm512_add_ps(m, _mm512_permute_ps::<0b11_10_11_10>(m));
            let m3 = _mm512_add_ps(m2, _mm512_permute_ps::<0b11_11_01_01>(m2));
            s3 = _mm512_add_ps(s3, m3);
        }
        let res = _mm512_castps512_ps128(_mm512_permutexvar_ps(pick, s3));
        _mm_mask_storeu_ps(out.add((t0 + t) * c.stride), mask, res);
    }
}
