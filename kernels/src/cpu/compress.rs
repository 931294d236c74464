//! The DeepSeek-V4 KV compressor's gated pooling and the lightning
//! indexer's scores and top-k selection, on the CPU.

use super::HostTensor;
use std::cell::RefCell;
use weft_ops::OpError;
use weft_ops::{CompressParams, IndexerParams};

/// Pooled rows `rows` (of `0..p.rows`), written at `p.first_row + r` of
/// the output table: pooled, RMS-normalised, rotated at `w * ratio`.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn compress(
    ins: &[HostTensor],
    out: &HostTensor,
    p: &CompressParams,
    rows: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let (kv, gate, ape, norm) = (&ins[0], &ins[1], &ins[2], &ins[3]);
    let (width, dc) = (kv.tensor.cols(), out.tensor.cols());
    let (kvv, gv, av, nv) = (kv.f32s(), gate.f32s(), ape.f32s(), norm.f32s());
    let o = out.f32_rows_mut(p.first_row as usize + rows.start, rows.len());
    let freqs = p.rope.inv_freq();
    let nope = dc - p.rope.n_dims;
    let mut angles = Vec::with_capacity(freqs.len());
    let mut logits: Vec<f32> = Vec::with_capacity(2 * p.ratio as usize);
    for (i, r) in rows.enumerate() {
        let w = p.first_row + r as u32;
        let slots = weft_ops::reference::compress_slots(p, w, dc);
        let row = &mut o[i * dc..(i + 1) * dc];
        for (e, dst) in row.iter_mut().enumerate() {
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
                let wt = (l - mx).exp();
                num += wt * kvv[s * width + half + e];
                den += wt;
            }
            *dst = num / den;
        }
        let ms = row.iter().map(|v| (v * v) as f64).sum::<f64>() / dc as f64;
        let scale = (1.0 / (ms + p.eps as f64).sqrt()) as f32;
        row.iter_mut()
            .zip(nv)
            .for_each(|(v, g)| *v = *v * scale * g);
        p.rope.angles(&freqs, (w * p.ratio) as i32, &mut angles);
        for (k, &(c, s)) in angles.iter().enumerate() {
            let j = nope + 2 * k;
            let (a, b) = (row[j], row[j + 1]);
            row[j] = a * c - b * s;
            row[j + 1] = a * s + b * c;
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
