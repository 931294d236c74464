//! AVX-512 (VNNI) kernels for the 32-element formats: Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0 weights against Q8_0/Q8_1 activations.
//!
//! **Lane layout.** ggml's AVX2 kernels give each (weight row, activation
//! row) pair eight f32 accumulator lanes, lane `l` fed by elements
//! `4l..4l+3` of each block (see `scalar.rs`). Here a 512-bit register holds
//! four rows: 128-bit lane `r` is row `r`; the *lo* register carries each
//! row's lanes 0..3 (elements 0..15 of every block) and the *hi* register
//! lanes 4..7 (elements 16..31). A block of four rows is then two
//! `vpdpbusd` (unsigned codes x signed activations), two conversions and
//! two FMAs by the per-row scale `d_w * d_a`, each lane accumulating
//! exactly what ggml's lane accumulates, in the same order; the final
//! reduction replays `hsum_float_8`. Results are bit-identical to the
//! scalar path.
//!
//! **Decode** lives in `avx512_b32_mv.rs` (two rows per register, straight
//! from the GGUF rows); this file keeps the shared token preparation.
//!
//! **Prefill** (`gemm`): weights of 16 rows are unpacked once into a panel
//! of ready-to-multiply codes and scales, then multiplied with tiles of 8
//! tokens (register tile: 4 rows x 8 tokens, 16 accumulators), so each
//! weight block is decoded once per 16 rows x all tokens.
//!
//! Offsets (`code - OFFSET` for Q4_0, Q5_0, Q8_0) are folded in through the
//! activation sums: the accumulator starts at `-OFFSET * sum(y)` per lane.

#![allow(clippy::missing_safety_doc)]

use super::formats::{act_bytes, act_qs, Block32, Kind};
use core::arch::x86_64::*;

/// Byte offsets of rows 0..8 of a group (row `r` at `r * row_bytes`),
/// clamped to the last valid row so partial groups read valid memory.
pub(crate) fn row_offsets(row_bytes: usize, valid: usize) -> [i32; 8] {
    let mut o = [0i32; 8];
    for (r, v) in o.iter_mut().enumerate() {
        *v = (r.min(valid - 1) * row_bytes) as i32;
    }
    o
}

/// Four 16-byte pieces (row `r`'s at `base + offs[r] + at`) in one register.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn gather4x16(base: *const u8, offs: &[i32], at: usize) -> __m512i {
    let p = |r: usize| base.offset(offs[r] as isize).add(at) as *const __m128i;
    let mut z = _mm512_castsi128_si512(_mm_loadu_si128(p(0)));
    z = _mm512_inserti32x4::<1>(z, _mm_loadu_si128(p(1)));
    z = _mm512_inserti32x4::<2>(z, _mm_loadu_si128(p(2)));
    _mm512_inserti32x4::<3>(z, _mm_loadu_si128(p(3)))
}

/// Codes of one block of four rows: (elements 0..15, elements 16..31) of
/// each row in its 128-bit lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn codes4<F: Block32>(base: *const u8, offs: &[i32]) -> (__m512i, __m512i) {
    let m4 = _mm512_set1_epi8(0x0f);
    match F::KIND {
        Kind::Q8_0 => {
            let flip = _mm512_set1_epi8(-128);
            let lo = gather4x16(base, offs, F::QS);
            let hi = gather4x16(base, offs, F::QS + 16);
            (_mm512_xor_si512(lo, flip), _mm512_xor_si512(hi, flip))
        }
        Kind::Q4_0 | Kind::Q4_1 => {
            let z = gather4x16(base, offs, F::QS);
            (
                _mm512_and_si512(z, m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4),
            )
        }
        Kind::Q5_0 | Kind::Q5_1 => {
            let z = gather4x16(base, offs, F::QS);
            let (mut klo, mut khi) = (0u64, 0u64);
            for (r, &o) in offs.iter().take(4).enumerate() {
                let qh = (base.offset(o as isize).add(F::QH) as *const u32).read_unaligned() as u64;
                klo |= (qh & 0xffff) << (16 * r);
                khi |= (qh >> 16) << (16 * r);
            }
            let sixteen = _mm512_set1_epi8(16);
            let lo = _mm512_and_si512(z, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4);
            (
                _mm512_mask_add_epi8(lo, klo, lo, sixteen),
                _mm512_mask_add_epi8(hi, khi, hi, sixteen),
            )
        }
    }
}

/// `(d, m)` of eight rows' blocks as f32 `[d0, m0, d1, m1, ...]` (the `m`
/// lanes are meaningless for formats without a minimum).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn scales8(base: *const u8, offs: __m256i) -> __m512 {
    let dm = _mm256_i32gather_epi32::<1>(base as *const i32, offs);
    _mm512_cvtph_ps(dm)
}

/// Per-lane start values `-OFFSET * sum(y[4l..4l+4])` for the lo and hi
/// halves of an activation block (zero for offset-free formats).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn offset_init<F: Block32>(a_lo: __m512i, a_hi: __m512i) -> (__m512i, __m512i) {
    let zero = _mm512_setzero_si512();
    if F::OFFSET == 0 {
        return (zero, zero);
    }
    let off = _mm512_set1_epi8(F::OFFSET as u8 as i8);
    let lo = _mm512_dpbusd_epi32(zero, off, a_lo);
    let hi = _mm512_dpbusd_epi32(zero, off, a_hi);
    (_mm512_sub_epi32(zero, lo), _mm512_sub_epi32(zero, hi))
}

/// `hsum_float_8` of every row of a (lo, hi) accumulator pair: lane 0 of
/// each 128-bit lane of the result holds that row's sum.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn hsum_rows(lo: __m512, hi: __m512) -> __m512 {
    let s = _mm512_add_ps(hi, lo);
    let s2 = _mm512_add_ps(s, _mm512_permute_ps::<0b11_10_11_10>(s));
    _mm512_add_ps(s2, _mm512_permute_ps::<0b11_11_01_01>(s2))
}

/// One block of a four-row panel: codes ready for `vpdpbusd`, the row
/// scales spread over their 128-bit lanes, and the row minimums spread for
/// the (row, token) chains of [`tile`] (`m[8r..8r+8] = m_r`).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct PanelBlock {
    lo: [u8; 64],
    hi: [u8; 64],
    d: [f32; 16],
    m: [f32; 32],
}

/// Per token and block: the activation scale and sum, and the offset
/// start values for the lo/hi lanes.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub(crate) struct TokBlock {
    /// Lanes 0..3 (elements 0..15), then 4..7.
    pub(crate) init: [i32; 8],
    pub(crate) dy: f32,
    pub(crate) s: f32,
    _pad: [f32; 2],
}

/// Rows per panel group and tokens per register tile.
pub(crate) const PANEL_ROWS: usize = 4;
pub(crate) const TILE_TOKENS: usize = 8;
/// Weight rows unpacked into one panel (a multiple of `PANEL_ROWS`).
pub(crate) const GEMM_PANEL_ROWS: usize = 16;

/// Activation-side values of one prefill call, structure of arrays:
/// scales `d[b * npad + t]` and sums `s[b * npad + t]` (f32, zero past `n`),
/// offset start values `init[t * nb + b]` (lo lanes, then hi lanes).
struct TokSide {
    d: *mut f32,
    s: *mut f32,
    init: *mut [i32; 8],
    npad: usize,
    nb: usize,
}

/// Scratch the prefill driver needs, in bytes: panels, then the
/// activation-side arrays.
pub(crate) fn gemm_scratch_bytes(n: usize, nb: usize) -> usize {
    let panel = GEMM_PANEL_ROWS / PANEL_ROWS * nb * size_of::<PanelBlock>();
    let npad = n.next_multiple_of(16);
    panel + 2 * nb * npad * size_of::<f32>() + n * nb * size_of::<[i32; 8]>()
}

impl TokSide {
    unsafe fn carve(scratch: *mut u8, n: usize, nb: usize) -> TokSide {
        let panel = GEMM_PANEL_ROWS / PANEL_ROWS * nb * size_of::<PanelBlock>();
        let npad = n.next_multiple_of(16);
        let d = scratch.add(panel) as *mut f32;
        let s = d.add(nb * npad);
        let init = s.add(nb * npad) as *mut [i32; 8];
        TokSide {
            d,
            s,
            init,
            npad,
            nb,
        }
    }

    /// Fills the arrays from `n` activation rows: the scales and sums of 16
    /// tokens per gather, the offset sums per token.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn fill<F: Block32>(&self, act: *const u8, act_row: usize, n: usize) {
        let ab = act_bytes(F::HAS_MIN);
        let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
        let gatherable = n * act_row <= i32::MAX as usize;
        for b in 0..self.nb {
            let (drow, srow) = (self.d.add(b * self.npad), self.s.add(b * self.npad));
            for t0 in (0..self.npad).step_by(16) {
                let idx: [i32; 16] =
                    core::array::from_fn(|i| ((t0 + i).min(n - 1) * act_row + b * ab) as i32);
                let dm = if gatherable {
                    _mm512_i32gather_epi32::<1>(
                        _mm512_loadu_si512(idx.as_ptr() as *const __m512i),
                        act as *const i32,
                    )
                } else {
                    let v: [i32; 16] = core::array::from_fn(|i| {
                        (act.add(idx[i] as u32 as usize) as *const i32).read_unaligned()
                    });
                    _mm512_loadu_si512(v.as_ptr() as *const __m512i)
                };
                let a = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
                let c = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(dm));
                let live = if n - t0.min(n) >= 16 {
                    0xffff
                } else {
                    (1u16 << (n - t0.min(n))) - 1
                };
                _mm512_storeu_ps(
                    drow.add(t0),
                    _mm512_maskz_mov_ps(live, _mm512_permutex2var_ps(a, evens, c)),
                );
                _mm512_storeu_ps(
                    srow.add(t0),
                    _mm512_maskz_mov_ps(live, _mm512_permutex2var_ps(a, odds, c)),
                );
            }
        }
        if F::OFFSET != 0 {
            for t in 0..n {
                for b in 0..self.nb {
                    let qy = act.add(t * act_row + b * ab + act_qs(F::HAS_MIN));
                    let a_lo = _mm512_castsi128_si512(_mm_loadu_si128(qy as *const __m128i));
                    let a_hi =
                        _mm512_castsi128_si512(_mm_loadu_si128(qy.add(16) as *const __m128i));
                    let (lo, hi) = offset_init::<F>(a_lo, a_hi);
                    let both = _mm256_inserti128_si256::<1>(
                        _mm256_castsi128_si256(_mm512_castsi512_si128(lo)),
                        _mm512_castsi512_si128(hi),
                    );
                    _mm256_storeu_si256(self.init.add(t * self.nb + b) as *mut __m256i, both);
                }
            }
        }
    }
}

/// Unpacks `valid` (1..=4) rows into `panel[0..nb]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn pack_panel<F: Block32>(
    w: *const u8,
    row_bytes: usize,
    valid: usize,
    nb: usize,
    panel: *mut PanelBlock,
) {
    let offs = row_offsets(row_bytes, valid);
    let voffs = _mm256_loadu_si256(offs.as_ptr() as *const __m256i);
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    let m01 = _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3);
    let m23 = _mm512_setr_epi32(5, 5, 5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7);
    for b in 0..nb {
        let x = w.add(b * F::BYTES);
        let (lo, hi) = codes4::<F>(x, &offs[0..4]);
        let t = scales8(x, voffs);
        let dst = &mut *panel.add(b);
        _mm512_storeu_si512(dst.lo.as_mut_ptr() as *mut __m512i, lo);
        _mm512_storeu_si512(dst.hi.as_mut_ptr() as *mut __m512i, hi);
        _mm512_storeu_ps(dst.d.as_mut_ptr(), _mm512_permutexvar_ps(idx, t));
        _mm512_storeu_ps(dst.m.as_mut_ptr(), _mm512_permutexvar_ps(m01, t));
        _mm512_storeu_ps(dst.m.as_mut_ptr().add(16), _mm512_permutexvar_ps(m23, t));
    }
}

/// Activation-side values of `nb` blocks of one token row `act` into `tok`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn prepare_tokens<F: Block32>(act: *const u8, nb: usize, tok: *mut TokBlock) {
    let ab = act_bytes(F::HAS_MIN);
    let half = |p: *const u8| {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            (p as *const u16).read_unaligned() as i32,
        )))
    };
    for b in 0..nb {
        let y = act.add(b * ab);
        let qy = y.add(act_qs(F::HAS_MIN));
        let a_lo = _mm512_castsi128_si512(_mm_loadu_si128(qy as *const __m128i));
        let a_hi = _mm512_castsi128_si512(_mm_loadu_si128(qy.add(16) as *const __m128i));
        let (lo, hi) = offset_init::<F>(a_lo, a_hi);
        let t = &mut *tok.add(b);
        _mm_storeu_si128(
            t.init.as_mut_ptr() as *mut __m128i,
            _mm512_castsi512_si128(lo),
        );
        _mm_storeu_si128(
            t.init.as_mut_ptr().add(4) as *mut __m128i,
            _mm512_castsi512_si128(hi),
        );
        t.dy = half(y);
        t.s = if F::HAS_MIN { half(y.add(2)) } else { 0.0 };
    }
}

/// One register tile: the four rows of `panel` against `T` tokens from
/// token `t0`. `acts[t]` is token `t0 + t`'s activation row; `out[t]`
/// points at the output of the panel's first row for that token (four
/// consecutive floats, `valid` of them written).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<F: Block32, const T: usize>(
    panel: *const PanelBlock,
    side: &TokSide,
    t0: usize,
    acts: &[*const u8; T],
    out: &[*mut f32; T],
    valid: usize,
) {
    let (ab, aq) = (act_bytes(F::HAS_MIN), act_qs(F::HAS_MIN));
    let z = _mm512_setzero_ps();
    let (mut lo, mut hi) = ([z; T], [z; T]);
    // m*s chains: lane (r, t) of rows 0-1 / rows 2-3 (eight tokens each).
    let (mut ms01, mut ms23) = (z, z);
    for b in 0..side.nb {
        let pb = &*panel.add(b);
        let wl = _mm512_loadu_si512(pb.lo.as_ptr() as *const __m512i);
        let wh = _mm512_loadu_si512(pb.hi.as_ptr() as *const __m512i);
        let d = _mm512_loadu_ps(pb.d.as_ptr());
        let dys = side.d.add(b * side.npad + t0);
        for t in 0..T {
            let y = acts[t].add(b * ab + aq);
            let a_lo = _mm512_broadcast_i32x4(_mm_loadu_si128(y as *const __m128i));
            let a_hi = _mm512_broadcast_i32x4(_mm_loadu_si128(y.add(16) as *const __m128i));
            let (i_lo, i_hi) = if F::OFFSET == 0 {
                (_mm512_setzero_si512(), _mm512_setzero_si512())
            } else {
                let init = side.init.add((t0 + t) * side.nb + b) as *const i32;
                (
                    _mm512_broadcast_i32x4(_mm_loadu_si128(init as *const __m128i)),
                    _mm512_broadcast_i32x4(_mm_loadu_si128(init.add(4) as *const __m128i)),
                )
            };
            let p = _mm512_mul_ps(d, _mm512_set1_ps(*dys.add(t)));
            let lanes = |init, codes, a| _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init, codes, a));
            lo[t] = _mm512_fmadd_ps(p, lanes(i_lo, wl, a_lo), lo[t]);
            hi[t] = _mm512_fmadd_ps(p, lanes(i_hi, wh, a_hi), hi[t]);
        }
        if F::HAS_MIN {
            let sums = side.s.add(b * side.npad + t0) as *const f64;
            let s = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(sums)));
            ms01 = _mm512_fmadd_ps(_mm512_loadu_ps(pb.m.as_ptr()), s, ms01);
            ms23 = _mm512_fmadd_ps(_mm512_loadu_ps(pb.m.as_ptr().add(16)), s, ms23);
        }
    }
    // Lane 4t + r of tokens 0-3 / 4-7 from the chains (lane 8r + t).
    #[rustfmt::skip]
    let tr = |t: i32| _mm512_setr_epi32(
        t, 8 + t, 16 + t, 24 + t,
        t + 1, 9 + t, 17 + t, 25 + t,
        t + 2, 10 + t, 18 + t, 26 + t,
        t + 3, 11 + t, 19 + t, 27 + t,
    );
    let summs = [
        _mm512_permutex2var_ps(ms01, tr(0), ms23),
        _mm512_permutex2var_ps(ms01, tr(4), ms23),
    ];
    let pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    let mask = ((1u16 << valid) - 1) as u8;
    for t in 0..T {
        let mut res = _mm512_castps512_ps128(_mm512_permutexvar_ps(pick, hsum_rows(lo[t], hi[t])));
        if F::HAS_MIN {
            let q = (t % 4) as i32;
            let sel = _mm512_setr_epi32(
                4 * q,
                4 * q + 1,
                4 * q + 2,
                4 * q + 3,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
            );
            res = _mm_add_ps(
                res,
                _mm512_castps512_ps128(_mm512_permutexvar_ps(sel, summs[t / 4])),
            );
        }
        _mm_mask_storeu_ps(out[t], mask, res);
    }
}

/// Prefill driver for one thread's rows: `out[t * out_stride + r]` for
/// `r` in `0..rows` (rows relative to `w`) and `t` in `0..n`. `scratch`
/// holds [`gemm_scratch_bytes`] bytes, 64-byte aligned.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm<F: Block32>(
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    act: *const u8,
    act_row_bytes: usize,
    n: usize,
    nb: usize,
    out: *mut f32,
    out_stride: usize,
    scratch: *mut u8,
) {
    let panel = scratch as *mut PanelBlock;
    let side = TokSide::carve(scratch, n, nb);
    side.fill::<F>(act, act_row_bytes, n);
    let mut r0 = 0;
    while r0 < rows {
        let groups = (rows - r0).min(GEMM_PANEL_ROWS).div_ceil(PANEL_ROWS);
        for g in 0..groups {
            let gr = r0 + g * PANEL_ROWS;
            pack_panel::<F>(
                w.add(gr * row_bytes),
                row_bytes,
                (rows - gr).min(PANEL_ROWS),
                nb,
                panel.add(g * nb),
            );
        }
        for t0 in (0..n).step_by(TILE_TOKENS) {
            for g in 0..groups {
                let gr = r0 + g * PANEL_ROWS;
                let job = TileJob {
                    panel: panel.add(g * nb),
                    side: &side,
                    t0,
                    act,
                    act_row_bytes,
                    out: out.add(gr),
                    out_stride,
                    valid: (rows - gr).min(PANEL_ROWS),
                };
                job.run::<F>((n - t0).min(TILE_TOKENS));
            }
        }
        r0 += groups * PANEL_ROWS;
    }
}

/// One register tile's operands.
struct TileJob<'a> {
    panel: *const PanelBlock,
    side: &'a TokSide,
    t0: usize,
    act: *const u8,
    act_row_bytes: usize,
    out: *mut f32,
    out_stride: usize,
    valid: usize,
}

impl TileJob<'_> {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn run<F: Block32>(&self, tokens: usize) {
        macro_rules! go {
            ($t:literal) => {{
                let acts: [*const u8; $t] =
                    core::array::from_fn(|i| self.act.add((self.t0 + i) * self.act_row_bytes));
                let outs: [*mut f32; $t] =
                    core::array::from_fn(|i| self.out.add((self.t0 + i) * self.out_stride));
                tile::<F, $t>(self.panel, self.side, self.t0, &acts, &outs, self.valid)
            }};
        }
        match tokens {
            8 => go!(8),
            7 => go!(7),
            6 => go!(6),
            5 => go!(5),
            4 => go!(4),
            3 => go!(3),
            2 => go!(2),
            _ => go!(1),
        }
    }
}
