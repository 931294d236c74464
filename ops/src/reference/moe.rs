//! Reference of expert routing, gating and combination (`MoeRoute`,
//! `MoeWeights`, `SwigluClamp`, `MoeCombine`).

use super::{f32_bytes, HostMemory};
use crate::family::{MoeRouteParams, MoeSelect, MoeWeightsParams};
use crate::tensor::Tensor;
use crate::OpError;

/// `silu(min(g, limit)) * clamp(u, -limit, limit)`, in f64.
pub fn swiglu_clamp(g: f32, u: f32, limit: f32) -> f32 {
    let g = g.min(limit) as f64;
    let u = u.clamp(-limit, limit) as f64;
    (g / (1.0 + (-g).exp()) * u) as f32
}

/// `sqrt(softplus(x))`, the router score.
pub fn sqrt_softplus(x: f32) -> f64 {
    let x = x as f64;
    let sp = if x > 30.0 { x } else { x.exp().ln_1p() };
    sp.sqrt()
}

/// The experts of one token: top-k of `score + bias` (ties: lower id), in
/// descending order.
pub fn route_top_k(logits: &[f32], bias: &[f32], k: usize) -> Vec<i32> {
    let biased: Vec<f64> = logits
        .iter()
        .zip(bias)
        .map(|(&l, &b)| sqrt_softplus(l) + b as f64)
        .collect();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| biased[b].total_cmp(&biased[a]).then(a.cmp(&b)));
    order.into_iter().take(k).map(|e| e as i32).collect()
}

pub(super) fn moe_route(
    mem: &HostMemory,
    ins: &[Tensor],
    p: &MoeRouteParams,
) -> Result<Vec<u8>, OpError> {
    let logits = mem.to_f32(&ins[0])?;
    let e = ins[0].cols();
    let mut out = Vec::with_capacity(ins[0].rows() * p.k);
    match p.select {
        MoeSelect::TopK => {
            let bias = mem.to_f32(&ins[1])?;
            for row in logits.chunks(e) {
                out.extend(route_top_k(row, &bias, p.k));
            }
        }
        MoeSelect::Hash => {
            let (table, tokens) = (mem.to_i32(&ins[1]), mem.to_i32(&ins[2]));
            for &t in &tokens {
                let at = usize::try_from(t).ok().filter(|&t| t < ins[1].rows());
                let Some(t) = at else {
                    return Err(OpError::Param {
                        op: "moe_route",
                        message: format!(
                            "token {t} outside the hash table of {} rows",
                            ins[1].rows()
                        ),
                    });
                };
                out.extend_from_slice(&table[t * p.k..(t + 1) * p.k]);
            }
        }
    }
    Ok(bytemuck::cast_slice(&out).to_vec())
}

pub(super) fn moe_weights(
    mem: &HostMemory,
    logits: &Tensor,
    ids: &Tensor,
    p: &MoeWeightsParams,
) -> Result<Vec<u8>, OpError> {
    let (lv, iv) = (mem.to_f32(logits)?, mem.to_i32(ids));
    let (e, k) = (logits.cols(), ids.cols());
    let mut out = Vec::with_capacity(iv.len());
    for (row, sel) in lv.chunks(e).zip(iv.chunks(k)) {
        let mut scores = Vec::with_capacity(k);
        for &id in sel {
            let s = usize::try_from(id)
                .ok()
                .filter(|&i| i < e)
                .ok_or_else(|| OpError::Param {
                    op: "moe_weights",
                    message: format!("expert id {id} outside 0..{e}"),
                })?;
            scores.push(sqrt_softplus(row[s]));
        }
        let total: f64 = scores.iter().sum();
        for s in scores {
            let w = if p.normalize { s / total } else { s };
            out.push((w * p.scale as f64) as f32);
        }
    }
    Ok(f32_bytes(out))
}

pub(super) fn moe_combine(mem: &HostMemory, ins: &[Tensor]) -> Result<Vec<u8>, OpError> {
    let (y, w) = (&ins[0], &ins[1]);
    let (yv, wv) = (mem.to_f32(y)?, mem.to_f32(w)?);
    let shared = ins.get(2).map(|t| mem.to_f32(t)).transpose()?;
    let k = w.cols();
    let d = y.cols() / k;
    let mut out = Vec::with_capacity(y.rows() * d);
    for (r, (row, wr)) in yv.chunks(y.cols()).zip(wv.chunks(k)).enumerate() {
        for i in 0..d {
            let mut v: f64 = (0..k).map(|j| wr[j] as f64 * row[j * d + i] as f64).sum();
            if let Some(s) = &shared {
                v += s[r * d + i] as f64;
            }
            out.push(v as f32);
        }
    }
    Ok(f32_bytes(out))
}
