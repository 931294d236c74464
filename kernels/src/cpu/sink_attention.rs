//! DeepSeek-V4 attention on the CPU: one shared K=V head, a window ring
//! plus compressed rows (all visible ones or the indexer's selection), and
//! a per-head sink logit in the softmax denominator. One work unit is one
//! (query, head) pair.

use super::family::i32s;
use super::HostTensor;
use std::cell::RefCell;
use weft_ops::SinkAttentionParams;
use weft_ops::{DType, OpError};

thread_local! {
    /// Per-thread scratch: key row pointers' scores and converted f16 rows.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Row `r` of an f32 or f16 matrix of `d` columns, as f32 (f16 rows are
/// converted into `buf`).
unsafe fn row<'a>(t: &HostTensor, r: usize, d: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
    match t.tensor.dtype {
        DType::F16 => {
            let src = std::slice::from_raw_parts((t.ptr as *const half::f16).add(r * d), d);
            buf.clear();
            buf.extend(src.iter().map(|v| v.to_f32()));
            buf
        }
        _ => std::slice::from_raw_parts((t.ptr as *const f32).add(r * d), d),
    }
}

/// The key/value rows query `i` sees: `(tensor index, row)`, window first.
fn key_rows(
    p: &SinkAttentionParams,
    i: usize,
    n_rows: usize,
    selection: Option<&[i32]>,
    keys: &mut Vec<(u8, usize)>,
) -> Result<(), OpError> {
    keys.clear();
    let t = p.q_position as usize + i;
    let lo = (t + 1).saturating_sub(p.window as usize);
    keys.extend((lo..=t).map(|pos| (0u8, pos % p.ring as usize)));
    if p.ratio == 0 {
        return Ok(());
    }
    let visible = (t + 1) / p.ratio as usize;
    let check = |w: usize| {
        if w >= visible || w >= n_rows {
            return Err(OpError::Param {
                op: "sink_attention",
                message: format!(
                    "query at {t} uses compressed row {w}, but {visible} are visible and {n_rows} given"
                ),
            });
        }
        Ok((1u8, w))
    };
    match selection {
        Some(sel) => {
            for &w in &sel[i * p.top_k..(i + 1) * p.top_k] {
                if w >= 0 {
                    keys.push(check(w as usize)?);
                }
            }
        }
        None => {
            for w in 0..visible {
                keys.push(check(w)?);
            }
        }
    }
    Ok(())
}

thread_local! {
    static KEYS: RefCell<Vec<(u8, usize)>> = const { RefCell::new(Vec::new()) };
}

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn sink_attention(
    ins: &[HostTensor],
    out: &HostTensor,
    p: &SinkAttentionParams,
    units: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let (q, win, rows, sinks) = (&ins[0], &ins[1], &ins[2], &ins[3]);
    let selection = ins.get(4).map(|t| i32s(t));
    let (h, d) = (p.heads, p.head_dim);
    let (qv, sv) = (q.f32s(), sinks.f32s());
    let o = out.ptr as *mut f32;
    let n_rows = rows.tensor.rows();
    let out_rope = p.out_rope.map(|r| (r, r.inv_freq()));
    let mut angles = Vec::new();
    KEYS.with(|keys| {
        SCRATCH.with(|scratch| {
            let mut keys = keys.borrow_mut();
            let (scores, buf) = &mut *scratch.borrow_mut();
            let mut current = usize::MAX;
            for u in units {
                let (i, head) = (u / h, u % h);
                if i != current {
                    key_rows(p, i, n_rows, selection, &mut keys)?;
                    current = i;
                }
                let qh = &qv[(i * h + head) * d..(i * h + head + 1) * d];
                scores.clear();
                let sink = sv[head];
                let mut mx = sink;
                for &(src, r) in keys.iter() {
                    let k = row(if src == 0 { win } else { rows }, r, d, buf);
                    let dot: f32 = qh.iter().zip(k).map(|(a, b)| a * b).sum();
                    let s = dot * p.scale;
                    mx = mx.max(s);
                    scores.push(s);
                }
                let mut den = (sink - mx).exp();
                for s in scores.iter_mut() {
                    *s = (*s - mx).exp();
                    den += *s;
                }
                let dst = std::slice::from_raw_parts_mut(o.add((i * h + head) * d), d);
                dst.fill(0.0);
                for (&(src, r), &e) in keys.iter().zip(scores.iter()) {
                    let v = row(if src == 0 { win } else { rows }, r, d, buf);
                    let w = e / den;
                    dst.iter_mut().zip(v).for_each(|(a, b)| *a += w * b);
                }
                if let Some((rope, freqs)) = &out_rope {
                    let t = p.q_position as i32 + i as i32;
                    rope.angles(freqs, t, &mut angles);
                    let nope = d - rope.n_dims;
                    for (m, &(c, s)) in angles.iter().enumerate() {
                        let j = nope + 2 * m;
                        let (a, b) = (dst[j], dst[j + 1]);
                        dst[j] = a * c - b * s;
                        dst[j + 1] = a * s + b * c;
                    }
                }
            }
            Ok(())
        })
    })
}
