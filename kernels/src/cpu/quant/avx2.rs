//! The AVX2 path (x86-64-v3: AVX2, FMA, F16C): one weight row against one
//! activation row at a time, in the lane order `scalar.rs` specifies (which
//! is ggml's own AVX2 code), so results are bit-identical to the scalar and
//! AVX-512 paths. Matrix products loop over rows and tokens in `matmul.rs`.
//!
//! Every function here is `unsafe` because it is compiled for AVX2 and
//! reads through raw pointers; the callers check the CPU features once
//! (`Isa`) and the buffer lengths (`mod.rs`).

#![allow(clippy::missing_safety_doc)]

use super::formats::{act_bytes, act_qs, kq, Block32, Kind};
use super::DotOrder;
use core::arch::x86_64::*;

/// `hsum_float_8`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn hsum8(x: __m256) -> f32 {
    let mut r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller passes a pointer to two readable bytes.
    let bits = unsafe { (p as *const u16).read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The 32 unsigned codes of a block, in element order (Q8_0: the signed
/// quants themselves, see `lanes`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn codes<F: Block32>(b: *const u8) -> __m256i {
    let nib = |qs: *const u8| {
        let t = _mm_loadu_si128(qs as *const __m128i);
        let both = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(t), _mm_srli_epi16::<4>(t));
        _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
    };
    match F::KIND {
        Kind::Q8_0 => _mm256_loadu_si256(b.add(F::QS) as *const __m256i),
        Kind::Q4_0 | Kind::Q4_1 => nib(b.add(F::QS)),
        Kind::Q5_0 | Kind::Q5_1 => {
            let qh = (b.add(F::QH) as *const u32).read_unaligned();
            let hi = bits_to_bytes(qh);
            _mm256_or_si256(
                nib(b.add(F::QS)),
                _mm256_and_si256(hi, _mm256_set1_epi8(0x10)),
            )
        }
    }
}

/// Byte `j` = 0xFF where bit `j` of `x` is set.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn bits_to_bytes(x: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let bit = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit), _mm256_set1_epi64x(-1))
}

/// Eight i32 lanes: `sum((u - OFFSET) * y)` over each group of four bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn lanes<F: Block32>(u: __m256i, y: __m256i) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    if F::KIND == Kind::Q8_0 {
        // `codes` leaves Q8_0's quants signed: move x's sign onto y
        // (ggml's mul_sum_i8_pairs).
        let x = u;
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);
    }
    let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), ones);
    if F::OFFSET == 0 {
        return dot;
    }
    let off = _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_set1_epi8(F::OFFSET as i8), y),
        ones,
    );
    _mm256_sub_epi32(dot, off)
}

/// One weight row (`nb` blocks at `w`) against one activation row.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_block32<F: Block32>(w: *const u8, a: *const u8, nb: usize) -> f32 {
    let ab = act_bytes(F::HAS_MIN);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for b in 0..nb {
        let (x, y) = (w.add(b * F::BYTES), a.add(b * ab));
        let d = _mm256_set1_ps(F::d_ptr(x) * f16_at(y));
        let qy = _mm256_loadu_si256(y.add(act_qs(F::HAS_MIN)) as *const __m256i);
        let l = lanes::<F>(codes::<F>(x), qy);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(l), acc);
        if F::HAS_MIN {
            summs = f16_at(x.add(2)).mul_add(f16_at(y.add(2)), summs);
        }
    }
    if F::HAS_MIN {
        hsum8(acc) + summs
    } else {
        hsum8(acc)
    }
}

/// The f16 scale at the start of a block.
trait ScalePtr {
    unsafe fn d_ptr(p: *const u8) -> f32;
}

impl<F: Block32> ScalePtr for F {
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn d_ptr(p: *const u8) -> f32 {
        f16_at(p)
    }
}

/// Q4_K x Q8_K integer parts of one super-block: for each 64-element pair
/// of chunks `j`, the eight lanes of `sc * dot` in ggml's layout (lane `l`:
/// elements `4l..4l+3` of both chunks), and the four pair sums
/// `m[2j] * bs(2j) + m[2j+1] * bs(2j+1)` of the minimums.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q4k_parts(x: *const u8, y: *const u8) -> ([__m256i; 4], __m128i) {
    let m4 = _mm256_set1_epi8(0x0f);
    let scales: [u8; 12] = (x.add(4) as *const [u8; 12]).read_unaligned();
    let (sc, mins) = weft_ops::quant::unpack_q4k_scales_mins(&scales);
    let mins16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(mins.as_ptr() as *const __m128i));
    let bsums = _mm256_loadu_si256(y.add(kq::Q8K_BSUMS) as *const __m256i);
    let q8s = _mm_hadd_epi16(
        _mm256_castsi256_si128(bsums),
        _mm256_extracti128_si256::<1>(bsums),
    );
    let prod = _mm_madd_epi16(mins16, q8s);
    let parts = core::array::from_fn(|j| {
        let bits = _mm256_loadu_si256(x.add(kq::Q4K_QS + 32 * j) as *const __m256i);
        let lo = _mm256_and_si256(bits, m4);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
        let ylo = _mm256_loadu_si256(y.add(kq::Q8K_QS + 64 * j) as *const __m256i);
        let yhi = _mm256_loadu_si256(y.add(kq::Q8K_QS + 64 * j + 32) as *const __m256i);
        let plo = _mm256_madd_epi16(
            _mm256_set1_epi16(sc[2 * j] as i16),
            _mm256_maddubs_epi16(lo, ylo),
        );
        let phi = _mm256_madd_epi16(
            _mm256_set1_epi16(sc[2 * j + 1] as i16),
            _mm256_maddubs_epi16(hi, yhi),
        );
        _mm256_add_epi32(plo, phi)
    });
    (parts, prod)
}

/// `ggml_vec_dot_q4_K_q8_K`, AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4k(w: *const u8, a: *const u8, nb: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for i in 0..nb {
        let (x, y) = (w.add(i * kq::Q4K_BYTES), a.add(i * kq::Q8K_BYTES));
        let yd = (y as *const f32).read_unaligned();
        let d = yd * f16_at(x);
        let dmin = -yd * f16_at(x.add(2));
        let (parts, prod) = q4k_parts(x, y);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
        let sumi = _mm256_add_epi32(
            _mm256_add_epi32(parts[0], parts[1]),
            _mm256_add_epi32(parts[2], parts[3]),
        );
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    hsum8(acc) + _mm_cvtss_f32(acc_m)
}

/// The exact sums of the eight lanes of each of four vectors.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn sum_lanes4(v: &[__m256i; 4]) -> [i32; 4] {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
    let mut out = [0i32; 4];
    // SAFETY: `out` has room for four i32.
    unsafe { _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, s) };
    out
}

/// The four i32 of `v`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn lanes4(v: __m128i) -> [i32; 4] {
    let mut out = [0i32; 4];
    // SAFETY: `out` has room for four i32.
    unsafe { _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, v) };
    out
}

/// Q4_K repacked (gemv, or gemm with `GEMM`), `scalar::dot_q4k_repack`'s
/// order.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4k_repack<const GEMM: bool>(
    w: *const u8,
    a: *const u8,
    nb: usize,
) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for i in 0..nb {
        let (x, y) = (w.add(i * kq::Q4K_BYTES), a.add(i * kq::Q8K_BYTES));
        let yd = (y as *const f32).read_unaligned();
        let (dd, dm) = (f16_at(x) * yd, f16_at(x.add(2)) * yd);
        let (parts, prod) = q4k_parts(x, y);
        let (isum, imin) = (sum_lanes4(&parts), lanes4(prod));
        if GEMM {
            for (&s, &m) in isum.iter().zip(&imin) {
                acc = (s as f32).mul_add(dd, acc);
                accm = (m as f32).mul_add(dm, accm);
            }
        } else {
            acc = (isum.iter().sum::<i32>() as f32).mul_add(dd, acc);
            accm = (imin.iter().sum::<i32>() as f32).mul_add(dm, accm);
        }
    }
    acc - accm
}

/// Q4_K in the tiled order (`scalar::dot_q4k_tiled`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4k_tiled(w: *const u8, a: *const u8, nb: usize) -> f32 {
    let mut acc = 0f32;
    for i in 0..nb {
        let (x, y) = (w.add(i * kq::Q4K_BYTES), a.add(i * kq::Q8K_BYTES));
        let (parts, prod) = q4k_parts(x, y);
        let s = sum_lanes4(&parts).iter().sum::<i32>();
        let m = lanes4(prod).iter().sum::<i32>();
        let r = (-f16_at(x.add(2))).mul_add(m as f32, s as f32 * f16_at(x));
        acc = r.mul_add((y as *const f32).read_unaligned(), acc);
    }
    acc
}

/// Q6_K x Q8_K integer lanes of one super-block in
/// `ggml_vec_dot_q6_K_q8_K`'s layout: `scale * q * y` per lane, minus the
/// `32 * bsum * scale` offsets of the lane's 32 elements.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q6k_lanes(x: *const u8, y: *const u8) -> __m256i {
    let (m4, m2) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
    let q8sums = _mm256_loadu_si256(y.add(kq::Q8K_BSUMS) as *const __m256i);
    let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(kq::Q6K_SCALES) as *const __m128i));
    let offsets = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, scales16));
    let mut sumi = _mm256_setzero_si256();
    for h in 0..2 {
        let ql0 = _mm256_loadu_si256(x.add(64 * h) as *const __m256i);
        let ql1 = _mm256_loadu_si256(x.add(64 * h + 32) as *const __m256i);
        let qh = _mm256_loadu_si256(x.add(kq::Q6K_QH + 32 * h) as *const __m256i);
        let high = |s: i32| {
            let v = match s {
                0 => qh,
                2 => _mm256_srli_epi16::<2>(qh),
                4 => _mm256_srli_epi16::<4>(qh),
                _ => _mm256_srli_epi16::<6>(qh),
            };
            _mm256_slli_epi16::<4>(_mm256_and_si256(v, m2))
        };
        let q = [
            _mm256_or_si256(_mm256_and_si256(ql0, m4), high(0)),
            _mm256_or_si256(_mm256_and_si256(ql1, m4), high(2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4), high(4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4), high(6)),
        ];
        for (k, qk) in q.iter().enumerate() {
            let yk = _mm256_loadu_si256(y.add(kq::Q8K_QS + 128 * h + 32 * k) as *const __m256i);
            let s = x.add(kq::Q6K_SCALES + 8 * h + 2 * k);
            let (s0, s1) = (*s as i8 as i16, *s.add(1) as i8 as i16);
            let scale = _mm256_setr_epi16(
                s0, s0, s0, s0, s0, s0, s0, s0, s1, s1, s1, s1, s1, s1, s1, s1,
            );
            sumi = _mm256_add_epi32(
                sumi,
                _mm256_madd_epi16(scale, _mm256_maddubs_epi16(*qk, yk)),
            );
        }
    }
    _mm256_sub_epi32(sumi, offsets)
}

/// `ggml_vec_dot_q6_K_q8_K`, AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6k(w: *const u8, a: *const u8, nb: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (x, y) = (w.add(i * kq::Q6K_BYTES), a.add(i * kq::Q8K_BYTES));
        let d = (y as *const f32).read_unaligned() * f16_at(x.add(kq::Q6K_D));
        let sumi = q6k_lanes(x, y);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum8(acc)
}

/// Q6_K in the tiled order (`scalar::dot_q6k_tiled`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6k_tiled(w: *const u8, a: *const u8, nb: usize) -> f32 {
    let mut acc = 0f32;
    for i in 0..nb {
        let (x, y) = (w.add(i * kq::Q6K_BYTES), a.add(i * kq::Q8K_BYTES));
        let v = q6k_lanes(x, y);
        let s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let isum = lanes4(s4).iter().sum::<i32>();
        let r = isum as f32 * f16_at(x.add(kq::Q6K_D));
        acc = r.mul_add((y as *const f32).read_unaligned(), acc);
    }
    acc
}

/// One Q4_K / Q6_K product in `order`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_kquant(
    order: DotOrder,
    q6: bool,
    w: *const u8,
    a: *const u8,
    nb: usize,
) -> f32 {
    match (q6, order) {
        (true, DotOrder::Tiled) => dot_q6k_tiled(w, a, nb),
        (true, _) => dot_q6k(w, a, nb),
        (false, DotOrder::RepackGemm) => dot_q4k_repack::<true>(w, a, nb),
        (false, DotOrder::RepackGemv) => dot_q4k_repack::<false>(w, a, nb),
        (false, DotOrder::Tiled) => dot_q4k_tiled(w, a, nb),
        (false, DotOrder::VecDot) => dot_q4k(w, a, nb),
    }
}

/// Sixteen f32 lanes as two halves, for the f32/f16 dot products whose
/// ggml order is that of 16-lane AVX-512 vectors.
#[derive(Clone, Copy)]
struct Lanes16(__m256, __m256);

/// `ggml_vec_dot_f32` / `_f16` in the AVX-512 build's order, with
/// 8-lane registers: `load(i)` gives 8 floats starting at element `i`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_body64(
    n: usize,
    x: impl Fn(usize) -> __m256,
    y: impl Fn(usize) -> __m256,
) -> (f32, usize) {
    let body = n - n % 64;
    let z = _mm256_setzero_ps();
    let mut acc = [Lanes16(z, z); 4];
    for base in (0..body).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            let i = base + 16 * j;
            a.0 = _mm256_fmadd_ps(x(i), y(i), a.0);
            a.1 = _mm256_fmadd_ps(x(i + 8), y(i + 8), a.1);
        }
    }
    let add = |a: Lanes16, b: Lanes16| Lanes16(_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1));
    let s = add(add(acc[0], acc[2]), add(acc[1], acc[3]));
    // _mm512_reduce_add_ps: halves, then the 256-bit reduction.
    let t8 = _mm256_add_ps(s.1, s.0);
    let t4 = _mm_add_ps(_mm256_extractf128_ps::<1>(t8), _mm256_castps256_ps128(t8));
    let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    let t1 = _mm_add_ss(t2, _mm_movehdup_ps(t2));
    (_mm_cvtss_f32(t1), body)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f32(w: *const u8, a: *const u8, n: usize) -> f32 {
    let (w, a) = (w as *const f32, a as *const f32);
    let (mut sum, body) = dot_body64(
        n,
        |i| _mm256_loadu_ps(w.add(i)),
        |i| _mm256_loadu_ps(a.add(i)),
    );
    for i in body..n {
        sum = w
            .add(i)
            .read_unaligned()
            .mul_add(a.add(i).read_unaligned(), sum);
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f16(w: *const u8, a: *const u8, n: usize) -> f32 {
    let ld =
        |p: *const u8, i: usize| _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i));
    let (sum, body) = dot_body64(n, |i| ld(w, i), |i| ld(a, i));
    let mut sumf = sum as f64;
    for i in body..n {
        sumf += (f16_at(w.add(2 * i)) * f16_at(a.add(2 * i))) as f64;
    }
    sumf as f32
}
