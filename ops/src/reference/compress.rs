//! Reference of the KV compressor (`Compress`) and the indexer's top-k
//! (`IndexerTopK`).

use super::{f32_bytes, HostMemory};
use crate::family::{CompressParams, IndexerParams};
use crate::tensor::Tensor;
use crate::OpError;

/// The (logit, value) slots row `w`, channel `e` pools: the previous
/// window's tokens through the first half (overlap only, `w > 0`), then the
/// own window's tokens (second half with overlap).
pub fn compress_slots(p: &CompressParams, w: u32, dc: usize) -> Vec<(u32, usize, usize)> {
    // (position, column offset of the half, ape row)
    let c = p.ratio;
    let mut slots = Vec::with_capacity(2 * c as usize);
    if p.overlap && w > 0 {
        slots.extend((0..c).map(|j| ((w - 1) * c + j, 0, j as usize)));
    }
    let half = if p.overlap { dc } else { 0 };
    slots.extend((0..c).map(|j| (w * c + j, half, j as usize)));
    slots
}

pub(super) fn compress(
    mem: &HostMemory,
    kv: &Tensor,
    gate: &Tensor,
    ape: &Tensor,
    norm: &Tensor,
    out: &Tensor,
    p: &CompressParams,
) -> Result<Vec<u8>, OpError> {
    let (kvv, gv, av) = (mem.to_f32(kv)?, mem.to_f32(gate)?, mem.to_f32(ape)?);
    let nv = mem.to_f32(norm)?;
    let (width, dc) = (kv.cols(), out.cols());
    let freqs = p.rope.inv_freq();
    let nope = dc - p.rope.n_dims;
    let mut angles = Vec::new();
    // The rows not pooled keep their values.
    let mut res = mem.to_f32(out)?;
    for r in 0..p.rows {
        let w = p.first_row + r;
        let slots = compress_slots(p, w, dc);
        let mut pooled = vec![0f64; dc];
        for (e, pooled_e) in pooled.iter_mut().enumerate() {
            let logits: Vec<f64> = slots
                .iter()
                .map(|&(pos, half, j)| {
                    let s = (pos % p.ring) as usize;
                    gv[s * width + half + e] as f64 + av[j * width + half + e] as f64
                })
                .collect();
            let mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let (mut num, mut den) = (0.0, 0.0);
            for (l, &(pos, half, _)) in logits.iter().zip(&slots) {
                let s = (pos % p.ring) as usize;
                let e_l = (l - mx).exp();
                num += e_l * kvv[s * width + half + e] as f64;
                den += e_l;
            }
            *pooled_e = num / den;
        }
        let ms = pooled.iter().map(|v| v * v).sum::<f64>() / dc as f64;
        let scale = 1.0 / (ms + p.eps as f64).sqrt();
        let mut row: Vec<f64> = pooled
            .iter()
            .zip(&nv)
            .map(|(v, g)| v * scale * *g as f64)
            .collect();
        p.rope.angles(&freqs, (w * p.ratio) as i32, &mut angles);
        for (i, &(c, s)) in angles.iter().enumerate() {
            let j = nope + 2 * i;
            let (a, b) = (row[j], row[j + 1]);
            row[j] = a * c as f64 - b * s as f64;
            row[j + 1] = a * s as f64 + b * c as f64;
        }
        let at = w as usize * dc;
        for (dst, &v) in res[at..at + dc].iter_mut().zip(&row) {
            *dst = v as f32;
        }
    }
    Ok(f32_bytes(res))
}

/// The rows a query at `t` keeps: every visible row (ascending) when there
/// are at most `top_k`, else the `top_k` best by `scores` (ties: lower row),
/// ascending; `-1` pads to `top_k`.
pub fn select_top_k(scores: &[f64], top_k: usize) -> Vec<i32> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    if scores.len() > top_k {
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        order.truncate(top_k);
        order.sort_unstable();
    }
    let mut out: Vec<i32> = order.into_iter().map(|w| w as i32).collect();
    out.resize(top_k, -1);
    out
}

pub(super) fn indexer_topk(
    mem: &HostMemory,
    q: &Tensor,
    w: &Tensor,
    keys: &Tensor,
    p: &IndexerParams,
) -> Result<Vec<u8>, OpError> {
    let (qv, wv, kv) = (mem.to_f32(q)?, mem.to_f32(w)?, mem.to_f32(keys)?);
    let (h, d) = (p.heads, p.head_dim);
    let mut out: Vec<i32> = Vec::with_capacity(q.rows() * p.top_k);
    for i in 0..q.rows() {
        let t = p.q_position as usize + i;
        let visible = ((t + 1) / p.ratio as usize).min(keys.rows());
        let qi = &qv[i * h * d..(i + 1) * h * d];
        let scores: Vec<f64> = (0..visible)
            .map(|r| {
                let k = &kv[r * d..(r + 1) * d];
                (0..h)
                    .map(|hh| {
                        let dot: f64 = qi[hh * d..(hh + 1) * d]
                            .iter()
                            .zip(k)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum();
                        wv[i * h + hh] as f64 * dot.max(0.0)
                    })
                    .sum()
            })
            .collect();
        out.extend(select_top_k(&scores, p.top_k));
    }
    Ok(bytemuck::cast_slice(&out).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::TailRopeParams;
    use crate::reference::route_top_k;

    #[test]
    fn top_k_ties_go_to_the_lower_row_and_output_is_ascending() {
        let scores = [1.0, 3.0, 2.0, 3.0, 0.5, 3.0];
        assert_eq!(select_top_k(&scores, 2), vec![1, 3]);
        assert_eq!(select_top_k(&scores, 4), vec![1, 2, 3, 5]);
        assert_eq!(select_top_k(&scores[..2], 4), vec![0, 1, -1, -1]);
        assert_eq!(
            route_top_k(&[0.0, 1.0, 1.0, -1.0], &[0.0; 4], 2),
            vec![1, 2]
        );
    }

    #[test]
    fn the_first_overlapping_row_pools_only_its_own_window() {
        let p = CompressParams {
            ratio: 4,
            overlap: true,
            first_row: 0,
            rows: 1,
            ring: 16,
            eps: 1e-6,
            rope: TailRopeParams {
                head_dim: 8,
                n_dims: 4,
                base: 10000.0,
                yarn: None,
                inverse: false,
            },
        };
        let slots = compress_slots(&p, 0, 8);
        assert_eq!(slots, vec![(0, 8, 0), (1, 8, 1), (2, 8, 2), (3, 8, 3)]);
        let slots = compress_slots(&p, 2, 8);
        assert_eq!(slots.len(), 8);
        assert_eq!(slots[0], (4, 0, 0));
        assert_eq!(slots[7], (11, 8, 3));
    }
}
