//! Fast activation quantizers: f32 rows to Q8_0, Q8_1, Q8_K, F16 and BF16,
//! bit-identical to `weft_ops::quant::quantize_row` (which is the scalar
//! path): Q8_0/Q8_1 as ggml's x86 code (scale `127 / amax`, round half to
//! even), Q8_K as `quantize_row_q8_K_ref` (`-127 / max`, `nearest_int`),
//! F16 round-to-nearest-even, BF16 as `ggml_compute_fp32_to_bf16`.
//!
//! Lengths are checked by the caller (`mod.rs`).

#![allow(clippy::missing_safety_doc)]

use core::arch::x86_64::*;
use weft_ops::quant::f32_to_f16;

/// Q8_0 (`with_sum = false`, 34-byte blocks) or Q8_1 (36-byte blocks).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_blocks_avx2(src: &[f32], dst: &mut [u8], with_sum: bool) {
    let bytes = if with_sum { 36 } else { 34 };
    for (x, y) in src.chunks_exact(32).zip(dst.chunks_exact_mut(bytes)) {
        let v: [__m256; 4] = core::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for vi in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
        }
        let mut m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let amax = _mm_cvtss_f32(m4);
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let q: [__m256i; 4] = core::array::from_fn(|i| {
            _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(_mm256_mul_ps(v[i], id)))
        });
        let (head, qs) = y.split_at_mut(bytes - 32);
        head[..2].copy_from_slice(&f32_to_f16(d));
        if with_sum {
            let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            let sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<0b10_11_00_01>(s2)));
            head[2..4].copy_from_slice(&f32_to_f16(d * sum as f32));
        }
        let p01 = _mm256_packs_epi32(q[0], q[1]);
        let p23 = _mm256_packs_epi32(q[2], q[3]);
        let packed = _mm256_packs_epi16(p01, p23);
        let fixed = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, fixed);
    }
}

/// Q8_0 / Q8_1 with AVX-512.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(crate) unsafe fn q8_blocks_avx512(src: &[f32], dst: &mut [u8], with_sum: bool) {
    let bytes = if with_sum { 36 } else { 34 };
    for (x, y) in src.chunks_exact(32).zip(dst.chunks_exact_mut(bytes)) {
        let v0 = _mm512_loadu_ps(x.as_ptr());
        let v1 = _mm512_loadu_ps(x.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        const RNE: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let q0 = _mm512_cvt_roundps_epi32::<RNE>(_mm512_mul_ps(v0, id));
        let q1 = _mm512_cvt_roundps_epi32::<RNE>(_mm512_mul_ps(v1, id));
        let (head, qs) = y.split_at_mut(bytes - 32);
        head[..2].copy_from_slice(&f32_to_f16(d));
        if with_sum {
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            head[2..4].copy_from_slice(&f32_to_f16(d * sum as f32));
        }
        _mm_storeu_si128(qs.as_mut_ptr() as *mut __m128i, _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128(
            qs.as_mut_ptr().add(16) as *mut __m128i,
            _mm512_cvtsepi32_epi8(q1),
        );
    }
}

/// Q8_K (292-byte blocks of 256) with AVX-512.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(crate) unsafe fn q8k_blocks_avx512(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
        let v: [__m512; 16] = core::array::from_fn(|i| _mm512_loadu_ps(x.as_ptr().add(16 * i)));
        let mut m = _mm512_abs_ps(v[0]);
        for vi in &v[1..] {
            m = _mm512_max_ps(m, _mm512_abs_ps(*vi));
        }
        let amax = _mm512_reduce_max_ps(m);
        if amax == 0.0 {
            y.fill(0);
            continue;
        }
        // The first element whose magnitude is the maximum gives the sign.
        let target = _mm512_set1_ps(amax);
        let mut max = amax;
        for (i, vi) in v.iter().enumerate() {
            let hit = _mm512_cmpeq_ps_mask(_mm512_abs_ps(*vi), target);
            if hit != 0 {
                max = x[16 * i + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0 / max;
        let is = _mm512_set1_ps(iscale);
        let top = _mm512_set1_epi32(127);
        const RNE: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        y[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        for (i, vi) in v.iter().enumerate() {
            let q = _mm512_min_epi32(_mm512_cvt_roundps_epi32::<RNE>(_mm512_mul_ps(*vi, is)), top);
            _mm_storeu_si128(
                y.as_mut_ptr().add(4 + 16 * i) as *mut __m128i,
                _mm512_cvtsepi32_epi8(q),
            );
            let sum = _mm512_reduce_add_epi32(q) as i16;
            y[260 + 2 * i..262 + 2 * i].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

/// F16, round to nearest even (F16C).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_avx2(src: &[f32], dst: &mut [u8]) {
    let body = src.len() - src.len() % 8;
    for i in (0..body).step_by(8) {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
        _mm_storeu_si128(dst.as_mut_ptr().add(2 * i) as *mut __m128i, h);
    }
    for i in body..src.len() {
        dst[2 * i..2 * i + 2].copy_from_slice(&f32_to_f16(src[i]));
    }
}

/// BF16 as `ggml_compute_fp32_to_bf16` (round to nearest even, NaNs
/// quieted), eight at a time.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn bf16_avx2(src: &[f32], dst: &mut [u8]) {
    let body = src.len() - src.len() % 8;
    for i in (0..body).step_by(8) {
        let u = _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(u), _mm256_set1_epi32(1));
        let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(
            u,
            _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb),
        ));
        let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(u), _mm256_set1_epi32(64));
        let abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fff_ffff));
        let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f80_0000));
        let r = _mm256_blendv_epi8(rounded, quiet, nan);
        let packed = _mm256_packus_epi32(r, r);
        let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(packed);
        _mm_storeu_si128(
            dst.as_mut_ptr().add(2 * i) as *mut __m128i,
            _mm256_castsi256_si128(ordered),
        );
    }
    for i in body..src.len() {
        dst[2 * i..2 * i + 2].copy_from_slice(&weft_ops::quant::f32_to_bf16(src[i]));
    }
}

/// Q8_K with AVX2 (same results as the reference).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8k_blocks_avx2(src: &[f32], dst: &mut [u8]) {
    let sign = _mm256_set1_ps(-0.0);
    for (x, y) in src.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
        let v: [__m256; 32] = core::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for vi in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
        }
        let mut m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        if amax == 0.0 {
            y.fill(0);
            continue;
        }
        // The first element whose magnitude is the maximum gives the sign.
        let target = _mm256_set1_ps(amax);
        let mut max = amax;
        for (i, vi) in v.iter().enumerate() {
            let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
                _mm256_andnot_ps(sign, *vi),
                target,
            ));
            if hit != 0 {
                max = x[8 * i + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0 / max;
        let is = _mm256_set1_ps(iscale);
        let top = _mm256_set1_epi32(127);
        y[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        for j in 0..16 {
            let q: [__m256i; 2] = core::array::from_fn(|h| {
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_mul_ps(v[2 * j + h], is),
                );
                _mm256_min_epi32(_mm256_cvtps_epi32(r), top)
            });
            let s = _mm256_add_epi32(q[0], q[1]);
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            let sum =
                _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<0b10_11_00_01>(s2))) as i16;
            y[260 + 2 * j..262 + 2 * j].copy_from_slice(&sum.to_le_bytes());
            let p16 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[0], q[1]));
            let p8 = _mm256_packs_epi16(p16, p16);
            let bytes = _mm256_permute4x64_epi64::<0b11_01_10_00>(p8);
            _mm_storeu_si128(
                y.as_mut_ptr().add(4 + 16 * j) as *mut __m128i,
                _mm256_castsi256_si128(bytes),
            );
        }
    }
}
