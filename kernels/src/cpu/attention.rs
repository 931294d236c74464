//! Attention, computed the way llama.cpp's CPU flash-attention kernel does,
//! so weft's logits track llama.cpp's closely:
//!
//! - with an f16 cache, the query row is rounded to f16 and each score is an
//!   f16 x f16 dot product summed in f32 in the same lane order as ggml's
//!   AVX-512 `vec_dot_f16` (four 16-lane accumulators, then a tree);
//! - scores are scaled, optionally soft-capped, and masked positions skipped;
//! - one pass of online softmax over the cache in slot order, `expf` for the
//!   rescaling factors; with an f16 value cache the running output is kept
//!   in f16 (rounded after every update), as ggml does;
//! - the output is divided by the softmax sum at the end.

use super::{HostTensor, WorkSplit};
use half::f16;
use std::ops::Range;
use weft_ops::{AttentionParams, DType, OpError};

pub(super) fn split(q_rows: usize, p: &AttentionParams, threads: usize) -> WorkSplit {
    let total = q_rows * p.heads;
    WorkSplit::new(total, total.div_ceil(threads * 8).max(1))
}

/// Position held by cache slot `slot` once positions `0..end` are written.
fn slot_position(slot: usize, end: usize, ring: Option<u32>) -> Option<usize> {
    match ring {
        None => (slot < end).then_some(slot),
        Some(r) => {
            let r = r as usize;
            (slot < r && slot < end).then(|| slot + (end - 1 - slot) / r * r)
        }
    }
}

/// Units are `(query row, head)` pairs, row-major.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn attention(q: &HostTensor, k: &HostTensor, v: &HostTensor, out: &HostTensor, p: &AttentionParams, units: Range<usize>) -> Result<(), OpError> {
    let d = p.head_dim;
    let group = p.heads / p.kv_heads;
    let qv = q.f32s();
    let o = out.ptr as *mut f32;
    let end = p.q_position as usize + q.tensor.rows();
    let kv_rows = k.tensor.rows();
    let kv_stride = k.tensor.cols();
    let mut qh16 = vec![f16::ZERO; d];
    let mut qh32 = vec![0f32; d];
    let mut acc16 = vec![f16::ZERO; d];
    let mut acc32 = vec![0f32; d];
    let mut krow = vec![0f32; d];
    for unit in units {
        let (t, h) = (unit / p.heads, unit % p.heads);
        let kvh = h / group;
        let pos = p.q_position as usize + t;
        let qrow = &qv[t * q.tensor.cols() + h * d..][..d];
        let half_cache = k.tensor.dtype == DType::F16;
        if half_cache {
            for (dst, src) in qh16.iter_mut().zip(qrow) {
                *dst = f16::from_f32(*src);
            }
        } else {
            qh32.copy_from_slice(qrow);
        }
        let v_half = v.tensor.dtype == DType::F16;
        acc16.fill(f16::ZERO);
        acc32.fill(0.0);
        let (mut m, mut s_sum) = (f32::NEG_INFINITY, 0f32);
        for slot in 0..kv_rows {
            let Some(c) = slot_position(slot, end, p.ring) else { continue };
            if c > pos || p.window.is_some_and(|w| pos - c >= w as usize) {
                continue;
            }
            let offset = slot * kv_stride + kvh * d;
            let mut s = if half_cache {
                let kh = std::slice::from_raw_parts((k.ptr as *const f16).add(offset), d);
                super::simd::dot_f16(&qh16, kh)
            } else {
                let kf = std::slice::from_raw_parts((k.ptr as *const f32).add(offset), d);
                krow.copy_from_slice(kf);
                super::simd::dot_f32(&qh32, &krow)
            };
            s *= p.scale;
            if p.softcap != 0.0 {
                s = p.softcap * (s / p.softcap).tanh();
            }
            let (mut ms, mut vs) = (1f32, 1f32);
            if s > m {
                let old = m;
                m = s;
                ms = (old - m).exp();
                if v_half {
                    super::simd::scale_f16(&mut acc16, ms);
                } else {
                    acc32.iter_mut().for_each(|a| *a *= ms);
                }
            } else {
                vs = (s - m).exp();
            }
            if v_half {
                let vh = std::slice::from_raw_parts((v.ptr as *const f16).add(offset), d);
                super::simd::mad_f16(&mut acc16, vh, vs);
            } else {
                let vf = std::slice::from_raw_parts((v.ptr as *const f32).add(offset), d);
                acc32.iter_mut().zip(vf).for_each(|(a, x)| *a = x.mul_add(vs, *a));
            }
            s_sum = s_sum.mul_add(ms, vs);
        }
        if v_half {
            for (a, h16) in acc32.iter_mut().zip(&acc16) {
                *a = h16.to_f32();
            }
        }
        let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
        let dst = o.add(t * out.tensor.cols() + h * d);
        for (i, a) in acc32.iter().enumerate() {
            *dst.add(i) = a * inv;
        }
    }
    Ok(())
}
