//! A vector register of f32 lanes as a trait ([`Lanes`]), with impls for
//! AVX-512's `__m512` (16 lanes) and AVX2's `__m256` (8 lanes), so that a
//! fast kernel's vector loop is written once instead of once per width:
//! generic code, inlined into one entry point per width compiled with that
//! width's `#[target_feature]`s. The lane-wise methods compute the same
//! thing in each lane at either width, so a loop whose lanes do not mix
//! gets the same bits at both. The fast decode and prefill attention use it.

use half::f16;
use std::arch::x86_64::*;

/// A vector register of f32 lanes and the operations the kernels need.
/// Every method is inlined into a caller compiled with the register's
/// target features (each kernel's entry points).
pub(super) trait Lanes {
    type V: Copy;
    const LANES: usize;
    /// How many registers of this width the instruction set names.
    const REGISTERS: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, x: Self::V);
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c`, one rounding.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn reduce_max(x: Self::V) -> f32;
    /// `LANES` f16 values as f32.
    unsafe fn widen(p: *const f16) -> Self::V;
    /// Lane `i` of the result is the sum of the lanes of `x[i]`, for the
    /// first `LANES` entries of `x`.
    unsafe fn sum_lanes(x: &[Self::V; 16]) -> Self::V;
    /// ggml's vector `exp`, lane for lane.
    unsafe fn exp(x: Self::V) -> Self::V;
}

pub(super) struct Avx512;

impl Lanes for Avx512 {
    type V = __m512;
    const LANES: usize = 16;
    const REGISTERS: usize = 32;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, x: __m512) {
        _mm512_storeu_ps(p, x)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn reduce_max(x: __m512) -> f32 {
        _mm512_reduce_max_ps(x)
    }
    #[inline(always)]
    unsafe fn widen(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn sum_lanes(x: &[__m512; 16]) -> __m512 {
        // Pairs: each 128-bit lane holds two cells' partial sums, interleaved.
        let mut pairs = [_mm512_setzero_ps(); 8];
        for (i, pair) in pairs.iter_mut().enumerate() {
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            *pair = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        }
        // Quads: each 128-bit lane holds four consecutive cells.
        let mut quads = [_mm512_setzero_ps(); 4];
        for (i, quad) in quads.iter_mut().enumerate() {
            let (a, b) = (pairs[2 * i], pairs[2 * i + 1]);
            *quad = _mm512_add_ps(
                _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
                _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
            );
        }
        // `[a0 + a1, a2 + a3, b0 + b1, b2 + b3]` of the 128-bit lanes.
        let fold = |a, b| {
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
            )
        };
        fold(fold(quads[0], quads[1]), fold(quads[2], quads[3]))
    }
    #[inline(always)]
    unsafe fn exp(x: __m512) -> __m512 {
        crate::cpu::simd::x86::v_expf(x)
    }
}

pub(super) struct Avx2;

impl Lanes for Avx2 {
    type V = __m256;
    const LANES: usize = 8;
    const REGISTERS: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, x: __m256) {
        _mm256_storeu_ps(p, x)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        _mm256_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn reduce_max(x: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m)))
    }
    #[inline(always)]
    unsafe fn widen(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn sum_lanes(x: &[__m256; 16]) -> __m256 {
        // Pairs, then quads, within each 128-bit half (as for AVX-512);
        // then the halves of two quads added across.
        let mut pairs = [_mm256_setzero_ps(); 4];
        for (i, pair) in pairs.iter_mut().enumerate() {
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            *pair = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
        }
        let quad = |a, b| {
            _mm256_add_ps(
                _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
                _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
            )
        };
        let (lo, hi) = (quad(pairs[0], pairs[1]), quad(pairs[2], pairs[3]));
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(lo, hi),
            _mm256_permute2f128_ps::<0x31>(lo, hi),
        )
    }
    #[inline(always)]
    unsafe fn exp(x: __m256) -> __m256 {
        crate::cpu::simd::avx2::v_expf(x)
    }
}
