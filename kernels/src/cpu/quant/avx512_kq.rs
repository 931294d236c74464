//! AVX-512 kernels for the K super-block formats Q4_K and Q6_K against Q8_K
//! activations, in every order of `order.rs`.
//!
//! Weights are unpacked into panels of four rows (unsigned codes, scales
//! spread for `vpdpwssd`) and multiplied with up to four tokens per register
//! tile, in the register layout of `avx512_b32.rs`: 128-bit lane = weight
//! row, *lo*/*hi* registers = ggml's lanes 0..3 / 4..7 = elements 0..15 /
//! 16..31 of every 32-element chunk. Per chunk the sub-block scale
//! multiplies the pair sums with `vpdpwssd`, exactly as ggml's
//! `madd(scale, maddubs(q, y))`. Then, per order:
//!
//! - [`DotOrder::VecDot`] ([`tile_lanes`]): per super-block the integer
//!   lanes are converted and accumulated with one FMA by `d_w * d_a`
//!   (Q4_K's minimums through four extra lanes per row, Q6_K's `-32`
//!   offsets as start values from the activation sums), then reduced in
//!   `hsum_float_8` order.
//! - the repacked Q4_K gemv/gemm and the tiled order ([`tile_sums`]): the
//!   lanes of each row are summed exactly (per 64 elements for the gemm, per
//!   super-block otherwise) into one register whose lane `4r + t` is
//!   (row `r`, token `t`), and the per-(row, token) float chains run side by
//!   side in that register.
//!
//! One token at a time (decode) goes to `avx512_kq_mv.rs`, which reads the
//! GGUF rows directly and gives the same results.
//!
//! [`DotOrder::VecDot`]: super::DotOrder::VecDot

#![allow(clippy::missing_safety_doc)]

use super::avx512_kq_mv::{self, matvec_q4k_gemv as g4, matvec_q6k as q6k, sum4_transposed};
use super::formats::kq;
use super::matmul::RawCall;
use super::order::TILED_MIN_ROWS;
use super::{scalar, DotOrder};
use core::arch::x86_64::*;
use weft_ops::quant::{f16_to_f32, unpack_q4k_scales_mins};
use weft_ops::{DType, OpError};

/// One super-block of four rows, unpacked.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct KPanel {
    /// Unsigned codes (Q4_K 0..=15, Q6_K 0..=63), elements 0..15 / 16..31
    /// of each chunk, row `r` at bytes `16r..16r + 16`.
    lo: [[u8; 64]; 8],
    hi: [[u8; 64]; 8],
    /// Sub-block scales per chunk for the lo / hi halves (Q4_K: `hi`
    /// unused, one scale per chunk), row `r` at `8r..8r + 8`.
    sc_lo: [[i16; 32]; 8],
    sc_hi: [[i16; 32]; 8],
    /// Q6_K: the sixteen scales, 8 per half, row `r` at `8r..8r + 8`.
    offset_scales: [[i16; 32]; 2],
    /// Row `r`'s `d` / `dmin` at lanes `4r..4r + 4`.
    d: [f32; 16],
    dmin: [f32; 16],
    /// Q4_K: row `r`'s eight mins at `8r..8r + 8`.
    mins: [i16; 32],
}

/// One super-block of one token: its scale and block sums.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct KTok {
    dy: f32,
    ndy: f32,
    /// Q4_K: the eight 32-element sums.
    bs32: [i16; 8],
    /// Q6_K: the sixteen 16-element sums.
    bs16: [i16; 16],
}

const TILE: usize = 4;

/// Runs a Q4_K / Q6_K product (`c` validated by the caller).
pub(crate) unsafe fn matmul(wdtype: DType, c: &RawCall) -> Result<(), OpError> {
    let nb = c.k / 256;
    let q6 = wdtype == DType::Q6_K;
    // A few activation rows in one token's order (a batch decode step:
    // Q6_K and unrepacked Q4_K below the tiled size, repacked Q4_K below a
    // gemm group) take the decode kernel once per row: the panel packing
    // below costs several decode passes at these sizes.
    let order = DotOrder::of(wdtype, c.stride, 1, 0);
    if c.n < TILED_MIN_ROWS && (0..c.n).all(|t| DotOrder::of(wdtype, c.stride, c.n, t) == order) {
        let (w, rb, rows, ar, st) = (c.w, c.row_bytes, c.rows, c.act_row, c.stride);
        let mut t0 = 0;
        while t0 < c.n {
            let (act, out) = (c.act.add(t0 * ar), c.out.add(t0 * st));
            // Q6_K and repacked Q4_K read each weight block once for up
            // to four rows.
            let gemv = !q6 && order == DotOrder::RepackGemv;
            let step = if q6 || gemv { (c.n - t0).min(4) } else { 1 };
            match (q6, gemv, step) {
                (true, _, 1) => q6k::<1>(w, rb, rows, act, ar, nb, out, st),
                (true, _, 2) => q6k::<2>(w, rb, rows, act, ar, nb, out, st),
                (true, _, 3) => q6k::<3>(w, rb, rows, act, ar, nb, out, st),
                (true, _, _) => q6k::<4>(w, rb, rows, act, ar, nb, out, st),
                (false, true, 1) => g4::<1>(w, rb, rows, act, ar, nb, out, st),
                (false, true, 2) => g4::<2>(w, rb, rows, act, ar, nb, out, st),
                (false, true, 3) => g4::<3>(w, rb, rows, act, ar, nb, out, st),
                (false, true, _) => g4::<4>(w, rb, rows, act, ar, nb, out, st),
                (false, false, _) => avx512_kq_mv::matvec_q4k(w, rb, rows, act, nb, out),
            }
            t0 += step;
        }
        return Ok(());
    }
    let panel_bytes = nb * size_of::<KPanel>();
    let tok_bytes = c.n * nb * size_of::<KTok>();
    super::matmul::with_scratch(panel_bytes + tok_bytes, |s| {
        let panel = s as *mut KPanel;
        let tok = s.add(panel_bytes) as *mut KTok;
        for t in 0..c.n {
            prepare_tokens(c.act.add(t * c.act_row), nb, tok.add(t * nb));
        }
        let mut r0 = 0;
        while r0 < c.rows {
            let valid = (c.rows - r0).min(4);
            pack_panel(c, r0, valid, q6, panel);
            let mut t0 = 0;
            while t0 < c.n {
                let tt = (c.n - t0).min(TILE);
                // Tiles start at multiples of 4, so one order covers a tile.
                let order = DotOrder::of(wdtype, c.stride, c.n, t0);
                let job = Tile {
                    panel,
                    nb,
                    c,
                    tok,
                    t0,
                    out: c.out.add(r0),
                    valid,
                };
                job.run(q6, order, tt);
                t0 += tt;
            }
            r0 += 4;
        }
    });
    Ok(())
}

/// One register tile's operands: four rows of `panel` against the tokens
/// from `t0`; `out` is the output of the panel's first row for token 0.
struct Tile<'a> {
    panel: *const KPanel,
    nb: usize,
    c: &'a RawCall,
    tok: *const KTok,
    t0: usize,
    out: *mut f32,
    valid: usize,
}

impl Tile<'_> {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn run(&self, q6: bool, order: DotOrder, tokens: usize) {
        macro_rules! go {
            ($q6:literal, $t:literal) => {
                if order == DotOrder::VecDot {
                    tile_lanes::<$q6, $t>(self)
                } else {
                    tile_sums::<$q6, $t>(self, order)
                }
            };
        }
        match (q6, tokens) {
            (false, 4) => go!(false, 4),
            (false, 3) => go!(false, 3),
            (false, 2) => go!(false, 2),
            (false, _) => go!(false, 1),
            (true, 4) => go!(true, 4),
            (true, 3) => go!(true, 3),
            (true, 2) => go!(true, 2),
            (true, _) => go!(true, 1),
        }
    }

    /// Token `t`'s prepared block `b`.
    unsafe fn tok(&self, t: usize, b: usize) -> &KTok {
        &*self.tok.add((self.t0 + t) * self.nb + b)
    }

    /// Token `t`'s activation quants of block `b`.
    unsafe fn quants(&self, t: usize, b: usize) -> *const u8 {
        self.c
            .act
            .add((self.t0 + t) * self.c.act_row + b * kq::Q8K_BYTES + kq::Q8K_QS)
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn prepare_tokens(act: *const u8, nb: usize, tok: *mut KTok) {
    for b in 0..nb {
        let y = act.add(b * kq::Q8K_BYTES);
        let t = &mut *tok.add(b);
        t.dy = (y as *const f32).read_unaligned();
        t.ndy = -t.dy;
        let bs = _mm256_loadu_si256(y.add(kq::Q8K_BSUMS) as *const __m256i);
        _mm256_storeu_si256(t.bs16.as_mut_ptr() as *mut __m256i, bs);
        let pairs = _mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        );
        _mm_storeu_si128(t.bs32.as_mut_ptr() as *mut __m128i, pairs);
    }
}

/// Unpacks weight rows `r0..r0 + valid` (relative to `c.w`) into
/// `panel[0..nb]`; missing rows repeat the last valid one.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn pack_panel(c: &RawCall, r0: usize, valid: usize, q6: bool, panel: *mut KPanel) {
    let block = if q6 { kq::Q6K_BYTES } else { kq::Q4K_BYTES };
    for b in 0..c.k / 256 {
        let p = &mut *panel.add(b);
        for r in 0..4 {
            let x = c.w.add((r0 + r.min(valid - 1)) * c.row_bytes + b * block);
            if q6 {
                pack_q6k_row(x, r, p);
            } else {
                pack_q4k_row(x, r, p);
            }
        }
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
    let scale = |j: usize| *x.add(kq::Q6K_SCALES + j) as i8 as i16;
    for c in 0..8 {
        put_chunk(
            p,
            c,
            r,
            _mm256_loadu_si256(codes.as_ptr().add(32 * c) as *const __m256i),
        );
        p.sc_lo[c][8 * r..8 * r + 8].fill(scale(2 * c));
        p.sc_hi[c][8 * r..8 * r + 8].fill(scale(2 * c + 1));
    }
    for (h, half) in p.offset_scales.iter_mut().enumerate() {
        for (i, s) in half[8 * r..8 * r + 8].iter_mut().enumerate() {
            *s = scale(8 * h + i);
        }
    }
    p.d[4 * r..4 * r + 4].fill(f16_to_f32([*x.add(kq::Q6K_D), *x.add(kq::Q6K_D + 1)]));
}

/// Q6_K's offsets `32 * (bsum[2l] sc[2l] + bsum[2l+1] sc[2l+1])` of one
/// token for the four rows' lo (`h = 0`) or hi (`h = 1`) lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q6k_offsets(p: &KPanel, tok: &KTok, h: usize) -> __m512i {
    let bs = _mm512_broadcast_i32x4(_mm_loadu_si128(
        tok.bs16.as_ptr().add(8 * h) as *const __m128i
    ));
    let sc = _mm512_loadu_si512(p.offset_scales[h].as_ptr() as *const __m512i);
    _mm512_slli_epi32::<5>(_mm512_madd_epi16(sc, bs))
}

/// Accumulates chunk `ch` of the panel block `p` for `T` tokens into
/// `lo[t]` / `hi[t]` (`ys[t]`: token `t`'s quants).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn chunk<const Q6: bool, const T: usize>(
    p: &KPanel,
    ch: usize,
    ys: &[*const u8; T],
    lo: &mut [__m512i; T],
    hi: &mut [__m512i; T],
) {
    let wl = _mm512_loadu_si512(p.lo[ch].as_ptr() as *const __m512i);
    let wh = _mm512_loadu_si512(p.hi[ch].as_ptr() as *const __m512i);
    let sl = _mm512_loadu_si512(p.sc_lo[ch].as_ptr() as *const __m512i);
    let sh = if Q6 {
        _mm512_loadu_si512(p.sc_hi[ch].as_ptr() as *const __m512i)
    } else {
        sl
    };
    for t in 0..T {
        let a_lo = _mm512_broadcast_i32x4(_mm_loadu_si128(ys[t].add(32 * ch) as *const __m128i));
        let a_hi =
            _mm512_broadcast_i32x4(_mm_loadu_si128(ys[t].add(32 * ch + 16) as *const __m128i));
        lo[t] = _mm512_dpwssd_epi32(lo[t], _mm512_maddubs_epi16(wl, a_lo), sl);
        hi[t] = _mm512_dpwssd_epi32(hi[t], _mm512_maddubs_epi16(wh, a_hi), sh);
    }
}

/// [`DotOrder::VecDot`]: ggml's eight lanes per (row, token).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_lanes<const Q6: bool, const T: usize>(job: &Tile) {
    let z = _mm512_setzero_ps();
    let (mut lo, mut hi, mut accm) = ([z; T], [z; T], [z; T]);
    for b in 0..job.nb {
        let p = &*job.panel.add(b);
        let ys: [*const u8; T] = core::array::from_fn(|t| job.quants(t, b));
        let (mut ilo, mut ihi) = ([_mm512_setzero_si512(); T], [_mm512_setzero_si512(); T]);
        if Q6 {
            for t in 0..T {
                let tok = job.tok(t, b);
                ilo[t] = _mm512_sub_epi32(ilo[t], q6k_offsets(p, tok, 0));
                ihi[t] = _mm512_sub_epi32(ihi[t], q6k_offsets(p, tok, 1));
            }
        }
        for ch in 0..8 {
            chunk::<Q6, T>(p, ch, &ys, &mut ilo, &mut ihi);
        }
        let d = _mm512_loadu_ps(p.d.as_ptr());
        for t in 0..T {
            let tok = job.tok(t, b);
            let pd = _mm512_mul_ps(d, _mm512_set1_ps(tok.dy));
            lo[t] = _mm512_fmadd_ps(pd, _mm512_cvtepi32_ps(ilo[t]), lo[t]);
            hi[t] = _mm512_fmadd_ps(pd, _mm512_cvtepi32_ps(ihi[t]), hi[t]);
            if !Q6 {
                let mins = _mm512_loadu_si512(p.mins.as_ptr() as *const __m512i);
                let bs =
                    _mm512_broadcast_i32x4(_mm_loadu_si128(tok.bs32.as_ptr() as *const __m128i));
                let prod = _mm512_madd_epi16(mins, bs);
                let dm = _mm512_mul_ps(_mm512_loadu_ps(p.dmin.as_ptr()), _mm512_set1_ps(tok.ndy));
                accm[t] = _mm512_fmadd_ps(dm, _mm512_cvtepi32_ps(prod), accm[t]);
            }
        }
    }
    let pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    let mask = ((1u16 << job.valid) - 1) as u8;
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
        _mm_mask_storeu_ps(job.out.add((job.t0 + t) * job.c.stride), mask, res);
    }
}

/// `v[t]` for `t < T`, zero after.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn padded<const T: usize>(v: &[__m512i; T]) -> [__m512i; 4] {
    core::array::from_fn(|t| if t < T { v[t] } else { _mm512_setzero_si512() })
}

/// 4x4 transposes inside every 128-bit lane: lane `4q + t` of result `k`
/// is lane `4q + k` of `v[t]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn transpose4(v: [__m512i; 4]) -> [__m512i; 4] {
    let a = _mm512_unpacklo_epi32(v[0], v[1]);
    let b = _mm512_unpackhi_epi32(v[0], v[1]);
    let c = _mm512_unpacklo_epi32(v[2], v[3]);
    let d = _mm512_unpackhi_epi32(v[2], v[3]);
    [
        _mm512_unpacklo_epi64(a, c),
        _mm512_unpackhi_epi64(a, c),
        _mm512_unpacklo_epi64(b, d),
        _mm512_unpackhi_epi64(b, d),
    ]
}

/// The repacked gemv / gemm and the tiled order: exact sums per (row,
/// token), float chains in lane `4r + t`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_sums<const Q6: bool, const T: usize>(job: &Tile, order: DotOrder) {
    let gemm = order == DotOrder::RepackGemm;
    let (mut acc, mut accm) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let zi = _mm512_setzero_si512();
    for b in 0..job.nb {
        let p = &*job.panel.add(b);
        let ys: [*const u8; T] = core::array::from_fn(|t| job.quants(t, b));
        let dys: [f32; 4] = core::array::from_fn(|t| if t < T { job.tok(t, b).dy } else { 0.0 });
        let dy = _mm512_broadcast_f32x4(_mm_loadu_ps(dys.as_ptr()));
        let dw = _mm512_loadu_ps(p.d.as_ptr());
        let dmin = _mm512_loadu_ps(p.dmin.as_ptr());
        // Q4_K: lane 4r + k of mins[t] = row r's minimums of pair k.
        let mins: [__m512i; T] = core::array::from_fn(|t| {
            if Q6 {
                return zi;
            }
            let bs = _mm512_broadcast_i32x4(_mm_loadu_si128(
                job.tok(t, b).bs32.as_ptr() as *const __m128i
            ));
            _mm512_madd_epi16(_mm512_loadu_si512(p.mins.as_ptr() as *const __m512i), bs)
        });
        if gemm {
            let (dd, dm) = (_mm512_mul_ps(dw, dy), _mm512_mul_ps(dmin, dy));
            let min_pairs = transpose4(padded(&mins));
            for (pair, min_pair) in min_pairs.iter().enumerate() {
                let (mut lo, mut hi) = ([zi; T], [zi; T]);
                chunk::<Q6, T>(p, 2 * pair, &ys, &mut lo, &mut hi);
                chunk::<Q6, T>(p, 2 * pair + 1, &ys, &mut lo, &mut hi);
                let sums: [__m512i; T] = core::array::from_fn(|t| _mm512_add_epi32(lo[t], hi[t]));
                let v = sum4_transposed(padded(&sums));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), dd, acc);
                accm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*min_pair), dm, accm);
            }
            continue;
        }
        let (mut lo, mut hi) = ([zi; T], [zi; T]);
        if Q6 {
            for (t, l) in lo.iter_mut().enumerate() {
                let tok = job.tok(t, b);
                let off = _mm512_add_epi32(q6k_offsets(p, tok, 0), q6k_offsets(p, tok, 1));
                *l = _mm512_sub_epi32(zi, off);
            }
        }
        for ch in 0..8 {
            chunk::<Q6, T>(p, ch, &ys, &mut lo, &mut hi);
        }
        let sums: [__m512i; T] = core::array::from_fn(|t| _mm512_add_epi32(lo[t], hi[t]));
        let v = _mm512_cvtepi32_ps(sum4_transposed(padded(&sums)));
        if Q6 {
            acc = _mm512_fmadd_ps(_mm512_mul_ps(v, dw), dy, acc);
            continue;
        }
        let m = _mm512_cvtepi32_ps(sum4_transposed(padded(&mins)));
        if order == DotOrder::Tiled {
            let r = _mm512_fnmadd_ps(dmin, m, _mm512_mul_ps(v, dw));
            acc = _mm512_fmadd_ps(r, dy, acc);
        } else {
            acc = _mm512_fmadd_ps(v, _mm512_mul_ps(dw, dy), acc);
            accm = _mm512_fmadd_ps(m, _mm512_mul_ps(dmin, dy), accm);
        }
    }
    let res = if !Q6 && order != DotOrder::Tiled {
        _mm512_sub_ps(acc, accm)
    } else {
        acc
    };
    let mask = ((1u16 << job.valid) - 1) as u8;
    for t in 0..T {
        let t32 = t as i32;
        let pick = _mm512_setr_epi32(
            t32,
            4 + t32,
            8 + t32,
            12 + t32,
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
        let row = _mm512_castps512_ps128(_mm512_permutexvar_ps(pick, res));
        _mm_mask_storeu_ps(job.out.add((job.t0 + t) * job.c.stride), mask, row);
    }
}
