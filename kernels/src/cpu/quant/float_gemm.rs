//! Prefill products of plain float weights (F32, F16, BF16), in the order
//! of ggml's `llamafile_sgemm` (tinyBLAS), which llama.cpp's CPU backend
//! uses for these types whenever a matmul has at least two activation rows,
//! `k` is a multiple of the vector length and the weight has a multiple of
//! four rows: each output gets one 16-lane accumulator, fed with a fused
//! multiply-add per 16 elements (F32, F16), or with `vdpbf16ps` per 32
//! elements (BF16: per lane the odd pair's exact product, then the even
//! one's, each added with one rounding), reduced with
//! `_mm512_reduce_add_ps`'s tree. Otherwise ggml uses `vec_dot` (see
//! `scalar.rs`), and so do we.
//!
//! The AVX-512 kernel tiles 4 weight rows x 6 tokens in 24 registers; the
//! scalar and AVX2 versions compute the same lanes one output at a time.

#![allow(clippy::missing_safety_doc)]

use super::matmul::RawCall;
use super::scalar::reduce16;
use super::Isa;
#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;
use weft_ops::quant::{bf16_to_f32, f16_to_f32};
use weft_ops::DType;

/// Elements per accumulation step.
fn step(dtype: DType) -> usize {
    if dtype == DType::BF16 {
        32
    } else {
        16
    }
}

/// Whether ggml would use tinyBLAS for this product (`m` = weight rows).
pub(crate) fn applies(dtype: DType, k: usize, m: usize, n: usize) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        && n >= 2
        && k.is_multiple_of(step(dtype))
        && m.is_multiple_of(4)
}

fn value(dtype: DType, row: &[u8], i: usize) -> f32 {
    match dtype {
        DType::F32 => {
            f32::from_le_bytes([row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]])
        }
        DType::F16 => f16_to_f32([row[2 * i], row[2 * i + 1]]),
        _ => bf16_to_f32([row[2 * i], row[2 * i + 1]]),
    }
}

/// One output, the specification.
fn dot_scalar(dtype: DType, w: &[u8], a: &[u8], k: usize) -> f32 {
    let mut acc = [0f32; 16];
    if dtype == DType::BF16 {
        for c in (0..k).step_by(32) {
            for (l, v) in acc.iter_mut().enumerate() {
                let (o, e) = (c + 2 * l + 1, c + 2 * l);
                *v += value(dtype, w, o) * value(dtype, a, o);
                *v += value(dtype, w, e) * value(dtype, a, e);
            }
        }
    } else {
        for c in (0..k).step_by(16) {
            for (l, v) in acc.iter_mut().enumerate() {
                *v = value(dtype, w, c + l).mul_add(value(dtype, a, c + l), *v);
            }
        }
    }
    reduce16(&acc)
}

/// Sixteen floats starting at element `i` of an F32/F16 row, as two halves.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load16_avx2(dtype: DType, p: *const u8, i: usize) -> (__m256, __m256) {
    if dtype == DType::F32 {
        let f = p as *const f32;
        (_mm256_loadu_ps(f.add(i)), _mm256_loadu_ps(f.add(i + 8)))
    } else {
        let h = p.add(2 * i);
        (
            _mm256_cvtph_ps(_mm_loadu_si128(h as *const __m128i)),
            _mm256_cvtph_ps(_mm_loadu_si128(h.add(16) as *const __m128i)),
        )
    }
}

/// One f16 x f16 product of `k` elements (a multiple of 16) in tinyBLAS's
/// order: [`dot_scalar`]'s bits, with AVX2 where the CPU has it.
pub(crate) fn dot_f16(w: &[u8], a: &[u8], k: usize) -> f32 {
    assert!(w.len() >= 2 * k && a.len() >= 2 * k && k.is_multiple_of(16));
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
    {
        // SAFETY: the features were detected and both rows hold k elements.
        return unsafe { dot_avx2(DType::F16, w.as_ptr(), a.as_ptr(), k) };
    }
    dot_scalar(DType::F16, w, a, k)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(dtype: DType, w: *const u8, a: *const u8, k: usize) -> f32 {
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for c in (0..k).step_by(16) {
        let (w0, w1) = load16_avx2(dtype, w, c);
        let (a0, a1) = load16_avx2(dtype, a, c);
        lo = _mm256_fmadd_ps(w0, a0, lo);
        hi = _mm256_fmadd_ps(w1, a1, hi);
    }
    let mut lanes = [0f32; 16];
    _mm256_storeu_ps(lanes.as_mut_ptr(), lo);
    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
    reduce16(&lanes)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
#[inline]
unsafe fn load16(dtype: DType, p: *const u8, i: usize) -> __m512 {
    if dtype == DType::F32 {
        _mm512_loadu_ps((p as *const f32).add(i))
    } else {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i) as *const __m256i))
    }
}

/// `_mm512_reduce_add_ps`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
#[inline]
fn reduce(s: __m512) -> f32 {
    let mut lanes = [0f32; 16];
    // SAFETY: `lanes` has room for 16 floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), s) };
    reduce16(&lanes)
}

/// F32/F16: a tile of 4 weight rows (`w[r]`) x `T` tokens (`a[t]`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn tile<const T: usize>(
    dtype: DType,
    w: [*const u8; 4],
    a: [*const u8; T],
    k: usize,
    out: [*mut f32; T],
    valid: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); 4]; T];
    for c in (0..k).step_by(16) {
        let wv: [__m512; 4] = core::array::from_fn(|r| load16(dtype, w[r], c));
        for t in 0..T {
            let av = load16(dtype, a[t], c);
            for r in 0..4 {
                acc[t][r] = _mm512_fmadd_ps(wv[r], av, acc[t][r]);
            }
        }
    }
    for t in 0..T {
        for (r, &v) in acc[t].iter().enumerate().take(valid) {
            *out[t].add(r) = reduce(v);
        }
    }
}

/// BF16 via `vdpbf16ps`, one output at a time (the CPU lacking AVX512_BF16
/// takes the scalar path, same results).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")]
unsafe fn dot_bf16_hw(w: *const u8, a: *const u8, k: usize) -> f32 {
    let mut acc = _mm512_setzero_ps();
    for c in (0..k).step_by(32) {
        let x: __m512bh = core::mem::transmute(_mm512_loadu_si512(w.add(2 * c) as *const __m512i));
        let y: __m512bh = core::mem::transmute(_mm512_loadu_si512(a.add(2 * c) as *const __m512i));
        acc = _mm512_dpbf16_ps(acc, x, y);
    }
    reduce(acc)
}

/// Runs the product (`applies` was checked; `c` validated by the caller).
pub(crate) unsafe fn matmul(isa: Isa, dtype: DType, c: &RawCall) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && dtype != DType::BF16 {
        return tiles(dtype, c);
    }
    let k = c.k;
    let one = |w: *const u8, a: *const u8| match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if dtype != DType::BF16 => dot_avx2(dtype, w, a, k),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if std::is_x86_feature_detected!("avx512bf16") => dot_bf16_hw(w, a, k),
        // The scalar path, and BF16 on a CPU without AVX512_BF16.
        _ => dot_scalar(
            dtype,
            std::slice::from_raw_parts(w, c.row_bytes),
            std::slice::from_raw_parts(a, c.act_row),
            k,
        ),
    };
    for r in 0..c.rows {
        for t in 0..c.n {
            *c.out.add(t * c.stride + r) = one(c.w.add(r * c.row_bytes), c.act.add(t * c.act_row));
        }
    }
}

/// F32/F16 on the AVX-512 path: tiles of 4 weight rows x up to 6 tokens.
#[cfg(target_arch = "x86_64")]
unsafe fn tiles(dtype: DType, c: &RawCall) {
    let k = c.k;
    for r0 in (0..c.rows).step_by(4) {
        let valid = (c.rows - r0).min(4);
        let w: [*const u8; 4] =
            core::array::from_fn(|r| c.w.add((r0 + r.min(valid - 1)) * c.row_bytes));
        let mut t0 = 0;
        while t0 < c.n {
            let a = |i: usize| c.act.add((t0 + i) * c.act_row);
            let o = |i: usize| c.out.add((t0 + i) * c.stride + r0);
            match c.n - t0 {
                1 => tile::<1>(dtype, w, [a(0)], k, [o(0)], valid),
                2 => tile::<2>(dtype, w, [a(0), a(1)], k, [o(0), o(1)], valid),
                3 => tile::<3>(
                    dtype,
                    w,
                    core::array::from_fn(a),
                    k,
                    core::array::from_fn(o),
                    valid,
                ),
                4 => tile::<4>(
                    dtype,
                    w,
                    core::array::from_fn(a),
                    k,
                    core::array::from_fn(o),
                    valid,
                ),
                5 => tile::<5>(
                    dtype,
                    w,
                    core::array::from_fn(a),
                    k,
                    core::array::from_fn(o),
                    valid,
                ),
                _ => tile::<6>(
                    dtype,
                    w,
                    core::array::from_fn(a),
                    k,
                    core::array::from_fn(o),
                    valid,
                ),
            }
            t0 += 6;
        }
    }
}
