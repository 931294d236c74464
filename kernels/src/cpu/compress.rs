//! The DeepSeek-V4 KV compressor's gated pooling and the lightning
//! indexer's scores and top-k selection, on the CPU.

use super::HostTensor;
use std::cell::RefCell;
use weft_ops::dsv4::{CompressParams, IndexerParams};
use weft_ops::OpError;

/// Output rows `rows` of the pooled compressor rows.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn compress(
    kv: &HostTensor,
    gate: &HostTensor,
    ape: &HostTensor,
    out: &HostTensor,
    p: &CompressParams,
    rows: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let (width, dc) = (kv.tensor.cols(), out.tensor.cols());
    let (kvv, gv, av) = (kv.f32s(), gate.f32s(), ape.f32s());
    let o = out.f32_rows_mut(rows.start, rows.len());
    let mut logits: Vec<f32> = Vec::with_capacity(2 * p.ratio as usize);
    for (i, r) in rows.enumerate() {
        let slots = weft_ops::reference::compress_slots(p, p.first_row + r as u32, dc);
        for e in 0..dc {
            logits.clear();
            let mut mx = f32::NEG_INFINITY;
            for &(pos, half, j) in &slots {
                let s = (pos % p.ring) as usize;
                let l = gv[s * width + half + e] + av[j * width + half + e];
                mx = mx.max(l);
                logits.push(l);
            }
            let (mut num, mut den) = (0f32, 0f32);
            for (l, &(pos, half, _)) in logits.iter().zip(&slots) {
                let s = (pos % p.ring) as usize;
                let w = (l - mx).exp();
                num += w * kvv[s * width + half + e];
                den += w;
            }
            o[i * dc + e] = num / den;
        }
    }
    Ok(())
}

thread_local! {
    static SCORES: RefCell<Vec<(f32, u32)>> = const { RefCell::new(Vec::new()) };
}

/// Query rows `rows`: scores over the visible rows, then the top-k.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn indexer_topk(
    q: &HostTensor,
    weights: &HostTensor,
    keys: &HostTensor,
    out: &HostTensor,
    p: &IndexerParams,
    rows: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let (h, d, k) = (p.heads, p.head_dim, p.top_k);
    let (qv, wv, kv) = (q.f32s(), weights.f32s(), keys.f32s());
    let o = out.ptr as *mut i32;
    SCORES.with(|scores| {
        let mut scores = scores.borrow_mut();
        for i in rows {
            let t = p.q_position as usize + i;
            let visible = ((t + 1) / p.ratio as usize).min(keys.tensor.rows());
            let qi = &qv[i * h * d..(i + 1) * h * d];
            let wi = &wv[i * h..(i + 1) * h];
            scores.clear();
            for r in 0..visible {
                let key = &kv[r * d..(r + 1) * d];
                let mut total = 0f64;
                for (hh, &w) in wi.iter().enumerate() {
                    let dot: f32 = qi[hh * d..(hh + 1) * d]
                        .iter()
                        .zip(key)
                        .map(|(a, b)| a * b)
                        .sum();
                    total += w as f64 * dot.max(0.0) as f64;
                }
                scores.push((total as f32, r as u32));
            }
            // Higher score first; ties: lower row first (a total order, so
            // the selection is deterministic).
            let better = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
            if scores.len() > k {
                scores.select_nth_unstable_by(k - 1, better);
                scores.truncate(k);
            }
            scores.sort_unstable_by_key(|s| s.1);
            let dst = std::slice::from_raw_parts_mut(o.add(i * k), k);
            dst.fill(-1);
            for (slot, s) in dst.iter_mut().zip(scores.iter()) {
                *slot = s.1 as i32;
            }
        }
    });
    Ok(())
}
