//! AVX-512 dot products of plain float rows, in the order of ggml's
//! AVX-512 build (`scalar.rs` spells it out): F32 and F16 with four 16-lane
//! FMA accumulators per 64 elements, BF16 with `vdpbf16ps` into two
//! accumulators when the CPU has AVX512_BF16 (otherwise the scalar
//! emulation, which gives the same bits).

#![allow(clippy::missing_safety_doc)]

use super::scalar;
use core::arch::x86_64::*;
use std::sync::OnceLock;

/// ggml's `GGML_F32_VEC_REDUCE` for four accumulators, then
/// `_mm512_reduce_add_ps`'s tree (halves, quarters, pairs).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
#[inline]
fn reduce4(acc: [__m512; 4]) -> f32 {
    let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
    reduce16(s)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
#[inline]
fn reduce16(s: __m512) -> f32 {
    let t8 = _mm256_add_ps(
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s))),
        _mm512_castps512_ps256(s),
    );
    let t4 = _mm_add_ps(_mm256_extractf128_ps::<1>(t8), _mm256_castps256_ps128(t8));
    let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)))
}

/// Four accumulators over the 64-element body; `load(i)` gives 16 floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
#[inline]
unsafe fn body64(
    n: usize,
    x: impl Fn(usize) -> __m512,
    y: impl Fn(usize) -> __m512,
) -> (f32, usize) {
    let body = n - n % 64;
    let mut acc = [_mm512_setzero_ps(); 4];
    for base in (0..body).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(x(base + 16 * j), y(base + 16 * j), *a);
        }
    }
    (reduce4(acc), body)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(crate) unsafe fn dot_f32(w: *const u8, a: *const u8, n: usize) -> f32 {
    let (w, a) = (w as *const f32, a as *const f32);
    let (mut sum, body) = body64(
        n,
        |i| _mm512_loadu_ps(w.add(i)),
        |i| _mm512_loadu_ps(a.add(i)),
    );
    for i in body..n {
        sum = w
            .add(i)
            .read_unaligned()
            .mul_add(a.add(i).read_unaligned(), sum);
    }
    sum
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(crate) unsafe fn dot_f16(w: *const u8, a: *const u8, n: usize) -> f32 {
    let ld = |p: *const u8, i: usize| {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i) as *const __m256i))
    };
    let (sum, body) = body64(n, |i| ld(w, i), |i| ld(a, i));
    let half = |p: *const u8, i: usize| {
        half::f16::from_bits((p.add(2 * i) as *const u16).read_unaligned()).to_f32()
    };
    let mut sumf = sum as f64;
    for i in body..n {
        sumf += (half(w, i) * half(a, i)) as f64;
    }
    sumf as f32
}

fn has_bf16() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx512bf16"))
}

/// BF16 with the hardware `vdpbf16ps` where present.
pub(crate) unsafe fn dot_bf16(w: *const u8, a: *const u8, n: usize) -> f32 {
    if has_bf16() {
        dot_bf16_hw(w, a, n)
    } else {
        scalar::dot_bf16(
            std::slice::from_raw_parts(w, 2 * n),
            std::slice::from_raw_parts(a, 2 * n),
            n,
        )
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")]
unsafe fn dot_bf16_hw(w: *const u8, a: *const u8, n: usize) -> f32 {
    let body = n - n % 64;
    let (mut c1, mut c2) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let ld = |p: *const u8, i: usize| -> __m512bh {
        core::mem::transmute(_mm512_loadu_si512(p.add(2 * i) as *const __m512i))
    };
    for i in (0..body).step_by(64) {
        c1 = _mm512_dpbf16_ps(c1, ld(w, i), ld(a, i));
        c2 = _mm512_dpbf16_ps(c2, ld(w, i + 32), ld(a, i + 32));
    }
    let mut sumf = 0f64;
    if body > 0 {
        sumf += reduce16(c1) as f64;
        sumf += reduce16(c2) as f64;
    }
    let bf = |p: *const u8, i: usize| {
        f32::from_bits(((p.add(2 * i) as *const u16).read_unaligned() as u32) << 16)
    };
    for i in body..n {
        sumf += (bf(w, i) * bf(a, i)) as f64;
    }
    sumf as f32
}
