//! Causal grouped-query attention over a (possibly ring-shaped, windowed) cache.

use super::{f32_bytes, HostMemory};
use crate::op::AttentionParams;
use crate::tensor::Tensor;
use crate::OpError;

/// Position held by cache row `slot`, or `None` if empty, when positions
/// `0..end` have been written.
pub fn slot_position(slot: usize, end: usize, ring: Option<u32>) -> Option<usize> {
    match ring {
        None => (slot < end).then_some(slot),
        Some(r) => {
            let r = r as usize;
            if slot >= r || slot >= end {
                return None;
            }
            // Latest p < end with p % r == slot.
            Some(slot + (end - 1 - slot) / r * r)
        }
    }
}

/// True when a query at `q` may attend to cached position `c`.
pub fn visible(q: usize, c: usize, window: Option<u32>) -> bool {
    c <= q && window.is_none_or(|w| q - c < w as usize)
}

pub(super) fn attention(
    mem: &HostMemory,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    p: &AttentionParams,
) -> Result<Vec<u8>, OpError> {
    let (qv, kv, vv) = (mem.to_f32(q)?, mem.to_f32(k)?, mem.to_f32(v)?);
    let (d, group) = (p.head_dim, p.heads / p.kv_heads);
    let kv_cols = k.cols();
    let end = p.q_position as usize + q.rows();
    let mut out = vec![0f64; qv.len()];
    for t in 0..q.rows() {
        let pos = p.q_position as usize + t;
        for h in 0..p.heads {
            let kvh = h / group;
            let qh = &qv[t * q.cols() + h * d..][..d];
            let mut scores: Vec<(usize, f64)> = Vec::new();
            for slot in 0..k.rows() {
                let Some(c) = slot_position(slot, end, p.ring) else {
                    continue;
                };
                if !visible(pos, c, p.window) {
                    continue;
                }
                let kr = &kv[slot * kv_cols + kvh * d..][..d];
                let mut s = qh
                    .iter()
                    .zip(kr)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    * p.scale as f64;
                if p.softcap > 0.0 {
                    s = p.softcap as f64 * (s / p.softcap as f64).tanh();
                }
                scores.push((slot, s));
            }
            let max = scores.iter().fold(f64::NEG_INFINITY, |m, s| m.max(s.1));
            let sum: f64 = scores.iter().map(|s| (s.1 - max).exp()).sum();
            let o = &mut out[t * q.cols() + h * d..][..d];
            for (slot, s) in scores {
                let w = (s - max).exp() / sum;
                let vr = &vv[slot * kv_cols + kvh * d..][..d];
                for (oi, vi) in o.iter_mut().zip(vr) {
                    *oi += w * *vi as f64;
                }
            }
        }
    }
    Ok(f32_bytes(out.into_iter().map(|v| v as f32).collect()))
}
