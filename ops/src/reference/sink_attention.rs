//! Reference of attention with a learned sink (`SinkAttention`): f64
//! scores and softmax.

use super::{f32_bytes, HostMemory};
use crate::family::SinkAttentionParams;
use crate::tensor::Tensor;
use crate::OpError;

pub(super) fn sink_attention(
    mem: &HostMemory,
    ins: &[Tensor],
    p: &SinkAttentionParams,
) -> Result<Vec<u8>, OpError> {
    let (q, win, rows, sinks) = (&ins[0], &ins[1], &ins[2], &ins[3]);
    let (qv, wv, rv, sv) = (
        mem.to_f32(q)?,
        mem.to_f32(win)?,
        mem.to_f32(rows)?,
        mem.to_f32(sinks)?,
    );
    let selection = ins.get(4).map(|t| mem.to_i32(t));
    let (h, d) = (p.heads, p.head_dim);
    let mut out = vec![0f64; qv.len()];
    for i in 0..q.rows() {
        let t = p.q_position as usize + i;
        let lo = (t + 1).saturating_sub(p.window as usize);
        let mut keys: Vec<&[f32]> = (lo..=t)
            .map(|pos| {
                let s = pos % p.ring as usize;
                &wv[s * d..(s + 1) * d]
            })
            .collect();
        if p.ratio > 0 {
            let visible = (t + 1) / p.ratio as usize;
            let ids: Vec<usize> = match &selection {
                Some(sel) => sel[i * p.top_k..(i + 1) * p.top_k]
                    .iter()
                    .filter(|&&w| w >= 0)
                    .map(|&w| w as usize)
                    .collect(),
                None => (0..visible).collect(),
            };
            for w in ids {
                if w >= visible || w >= rows.rows() {
                    return Err(OpError::Param {
                        op: "sink_attention",
                        message: format!(
                            "query at {t} selects compressed row {w}, but only {visible} are visible ({} given)",
                            rows.rows()
                        ),
                    });
                }
                keys.push(&rv[w * d..(w + 1) * d]);
            }
        }
        for head in 0..h {
            let qh = &qv[(i * h + head) * d..(i * h + head + 1) * d];
            let scores: Vec<f64> = keys
                .iter()
                .map(|k| {
                    let dot: f64 = qh.iter().zip(*k).map(|(a, b)| *a as f64 * *b as f64).sum();
                    dot * p.scale as f64
                })
                .collect();
            let sink = sv[head] as f64;
            let mx = scores.iter().cloned().fold(sink, f64::max);
            let den = (sink - mx).exp() + scores.iter().map(|s| (s - mx).exp()).sum::<f64>();
            let o = &mut out[(i * h + head) * d..(i * h + head + 1) * d];
            for (k, s) in keys.iter().zip(&scores) {
                let pr = (s - mx).exp() / den;
                o.iter_mut().zip(*k).for_each(|(a, b)| *a += pr * *b as f64);
            }
            if let Some(r) = &p.out_rope {
                let mut angles = Vec::new();
                r.angles(&r.inv_freq(), t as i32, &mut angles);
                let nope = d - r.n_dims;
                for (m, &(c, s)) in angles.iter().enumerate() {
                    let j = nope + 2 * m;
                    let (a, b) = (o[j], o[j + 1]);
                    o[j] = a * c as f64 - b * s as f64;
                    o[j + 1] = a * s as f64 + b * c as f64;
                }
            }
        }
    }
    Ok(f32_bytes(out.into_iter().map(|v| v as f32).collect()))
}
