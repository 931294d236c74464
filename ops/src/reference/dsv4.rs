//! Reference semantics of the DeepSeek-V4 ops (parameters documented in
//! [`crate::dsv4`]): f32 values, f64 sums and softmaxes.

use super::{f32_bytes, to_f32, HostMemory};
use crate::dsv4::{
    CompressParams, HcMixParams, IndexerParams, MoeRouteParams, MoeSelect, MoeWeightsParams,
    SinkAttentionParams, TailRopeParams,
};
use crate::op::{Op, OpNode};
use crate::tensor::Tensor;
use crate::OpError;

/// Runs a DeepSeek-V4 op; returns the bytes of its output.
pub(super) fn run(node: &OpNode, mem: &HostMemory) -> Result<Vec<u8>, OpError> {
    let ins = &node.inputs;
    let out = &node.outputs[0];
    match &node.op {
        Op::TailRope(p) => tail_rope(mem, &ins[0], &ins[1], p),
        Op::HcMix(p) => hc_mix(mem, ins, p),
        Op::HcCollapse { hc, norm_eps } => hc_collapse(mem, ins, *hc, *norm_eps),
        Op::HcExpand { hc } => hc_expand(mem, &ins[0], &ins[1], &ins[2], *hc),
        Op::Compress(p) => compress(mem, &ins[0], &ins[1], &ins[2], &ins[3], out, p),
        Op::IndexerTopK(p) => indexer_topk(mem, &ins[0], &ins[1], &ins[2], p),
        Op::SinkAttention(p) => sink_attention(mem, ins, p),
        Op::MatMulId => matmul_id(mem, &ins[0], &ins[1], &ins[2]),
        Op::MoeRoute(p) => moe_route(mem, ins, p),
        Op::MoeWeights(p) => moe_weights(mem, &ins[0], &ins[1], p),
        Op::SwigluClamp { limit } => {
            let (g, u) = (mem.to_f32(&ins[0])?, mem.to_f32(&ins[1])?);
            Ok(f32_bytes(
                g.iter()
                    .zip(&u)
                    .map(|(&g, &u)| swiglu_clamp(g, u, *limit))
                    .collect(),
            ))
        }
        Op::MoeCombine => moe_combine(mem, ins),
        other => Err(OpError::Unsupported {
            op: other.name(),
            what: "the DeepSeek-V4 reference".into(),
        }),
    }
}

/// `silu(min(g, limit)) * clamp(u, -limit, limit)`, in f64.
pub fn swiglu_clamp(g: f32, u: f32, limit: f32) -> f32 {
    let g = g.min(limit) as f64;
    let u = u.clamp(-limit, limit) as f64;
    (g / (1.0 + (-g).exp()) * u) as f32
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `sqrt(softplus(x))`, the router score.
pub fn sqrt_softplus(x: f32) -> f64 {
    let x = x as f64;
    let sp = if x > 30.0 { x } else { x.exp().ln_1p() };
    sp.sqrt()
}

fn tail_rope(
    mem: &HostMemory,
    x: &Tensor,
    pos: &Tensor,
    p: &TailRopeParams,
) -> Result<Vec<u8>, OpError> {
    let mut v = mem.to_f32(x)?;
    let positions = mem.to_i32(pos);
    let freqs = p.inv_freq();
    let nope = p.head_dim - p.n_dims;
    let mut angles = Vec::new();
    for (row, &position) in v.chunks_mut(x.cols()).zip(&positions) {
        p.angles(&freqs, position, &mut angles);
        for head in row.chunks_mut(p.head_dim) {
            for (i, &(c, s)) in angles.iter().enumerate() {
                let j = nope + 2 * i;
                let (a, b) = (head[j] as f64, head[j + 1] as f64);
                let (c, s) = (c as f64, s as f64);
                head[j] = (a * c - b * s) as f32;
                head[j + 1] = (a * s + b * c) as f32;
            }
        }
    }
    Ok(f32_bytes(v))
}

/// One row of hyper-connection coefficients (see [`HcMixParams`]).
pub fn hc_mix_row(m: &[f32], scale: &[f32], base: &[f32], p: &HcMixParams, out: &mut [f32]) {
    let (hc, eps) = (p.hc, p.eps as f64);
    let lin = |j: usize, s: f32| m[j] as f64 * s as f64 + base[j] as f64;
    for (k, o) in out[..hc].iter_mut().enumerate() {
        *o = (sigmoid(lin(k, scale[0])) + eps) as f32;
    }
    if m.len() == hc {
        return;
    }
    for (k, o) in out[hc..2 * hc].iter_mut().enumerate() {
        *o = (2.0 * sigmoid(lin(hc + k, scale[1]))) as f32;
    }
    let mut c = vec![0f64; hc * hc];
    for a in 0..hc {
        let row: Vec<f64> = (0..hc)
            .map(|b| lin(2 * hc + a * hc + b, scale[2]))
            .collect();
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - mx).exp()).sum();
        for b in 0..hc {
            c[a * hc + b] = (row[b] - mx).exp() / sum + eps;
        }
    }
    let columns = |c: &mut [f64]| {
        for b in 0..hc {
            let sum: f64 = (0..hc).map(|a| c[a * hc + b]).sum::<f64>() + eps;
            (0..hc).for_each(|a| c[a * hc + b] /= sum);
        }
    };
    columns(&mut c);
    for _ in 1..p.iters {
        for row in c.chunks_mut(hc) {
            let sum: f64 = row.iter().sum::<f64>() + eps;
            row.iter_mut().for_each(|v| *v /= sum);
        }
        columns(&mut c);
    }
    for (o, v) in out[2 * hc..].iter_mut().zip(&c) {
        *o = *v as f32;
    }
}

fn hc_mix(mem: &HostMemory, ins: &[Tensor], p: &HcMixParams) -> Result<Vec<u8>, OpError> {
    let (m, scale, base) = (&ins[0], &ins[1], &ins[2]);
    let (mut mv, s, b) = (mem.to_f32(m)?, mem.to_f32(scale)?, mem.to_f32(base)?);
    if let (Some(eps), Some(x)) = (p.norm_eps, ins.get(3)) {
        let xv = mem.to_f32(x)?;
        for (row, xr) in mv.chunks_mut(m.cols()).zip(xv.chunks(x.cols())) {
            let inv = inv_rms(xr, eps);
            row.iter_mut().for_each(|v| *v = (*v as f64 * inv) as f32);
        }
    }
    let mut out = vec![0f32; mv.len()];
    for (row, o) in mv.chunks(m.cols()).zip(out.chunks_mut(m.cols())) {
        hc_mix_row(row, &s, &b, p, o);
    }
    Ok(f32_bytes(out))
}

/// `1 / sqrt(mean(x^2) + eps)` in f64.
fn inv_rms(x: &[f32], eps: f32) -> f64 {
    let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    1.0 / (ms + eps as f64).sqrt()
}

fn hc_collapse(
    mem: &HostMemory,
    ins: &[Tensor],
    hc: usize,
    norm_eps: Option<f32>,
) -> Result<Vec<u8>, OpError> {
    let (x, co) = (&ins[0], &ins[1]);
    let (xv, cv) = (mem.to_f32(x)?, mem.to_f32(co)?);
    let weight = ins.get(2).map(|w| mem.to_f32(w)).transpose()?;
    let d = x.cols() / hc;
    let mut out = Vec::with_capacity(x.rows() * d);
    for (row, c) in xv.chunks(x.cols()).zip(cv.chunks(co.cols())) {
        let y: Vec<f64> = (0..d)
            .map(|i| (0..hc).map(|k| c[k] as f64 * row[k * d + i] as f64).sum())
            .collect();
        match (norm_eps, &weight) {
            (Some(eps), Some(w)) => {
                let ms = y.iter().map(|v| v * v).sum::<f64>() / d as f64;
                let inv = 1.0 / (ms + eps as f64).sqrt();
                out.extend(y.iter().zip(w).map(|(v, g)| (v * inv * *g as f64) as f32));
            }
            _ => out.extend(y.iter().map(|&v| v as f32)),
        }
    }
    Ok(f32_bytes(out))
}

fn hc_expand(
    mem: &HostMemory,
    x: &Tensor,
    f: &Tensor,
    co: &Tensor,
    hc: usize,
) -> Result<Vec<u8>, OpError> {
    let (xv, fv, cv) = (mem.to_f32(x)?, mem.to_f32(f)?, mem.to_f32(co)?);
    let d = f.cols();
    let mut out = Vec::with_capacity(xv.len());
    for ((row, fr), c) in xv
        .chunks(x.cols())
        .zip(fv.chunks(d))
        .zip(cv.chunks(co.cols()))
    {
        for j in 0..hc {
            for i in 0..d {
                let mut v = c[hc + j] as f64 * fr[i] as f64;
                for a in 0..hc {
                    v += c[2 * hc + a * hc + j] as f64 * row[a * d + i] as f64;
                }
                out.push(v as f32);
            }
        }
    }
    Ok(f32_bytes(out))
}

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

fn compress(
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

fn indexer_topk(
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

fn sink_attention(
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

fn matmul_id(mem: &HostMemory, x: &Tensor, w: &Tensor, ids: &Tensor) -> Result<Vec<u8>, OpError> {
    let xv = mem.to_f32(x)?;
    let idv = mem.to_i32(ids);
    let dims = w.shape.dims();
    let (experts, m, k) = (dims[0], dims[1], dims[2]);
    let (n, slots) = (ids.rows(), ids.cols());
    let wb = mem.bytes(w);
    let row_bytes = w.row_bytes();
    let mut out = Vec::with_capacity(n * slots * m);
    for i in 0..n {
        for s in 0..slots {
            let e = idv[i * slots + s];
            if e < 0 || e as usize >= experts {
                return Err(OpError::Param {
                    op: "matmul_id",
                    message: format!("expert id {e} outside 0..{experts}"),
                });
            }
            let xr = if x.rows() == n { i } else { i * slots + s };
            let xrow = &xv[xr * k..(xr + 1) * k];
            for r in 0..m {
                let at = (e as usize * m + r) * row_bytes;
                let wrow = to_f32(&wb[at..at + row_bytes], w.dtype, k)?;
                let v: f64 = wrow
                    .iter()
                    .zip(xrow)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum();
                out.push(v as f32);
            }
        }
    }
    Ok(f32_bytes(out))
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

fn moe_route(mem: &HostMemory, ins: &[Tensor], p: &MoeRouteParams) -> Result<Vec<u8>, OpError> {
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

fn moe_weights(
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

fn moe_combine(mem: &HostMemory, ins: &[Tensor]) -> Result<Vec<u8>, OpError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsv4::YarnScaling;

    #[test]
    fn inverse_rope_undoes_rope() {
        let mut p = TailRopeParams {
            head_dim: 8,
            n_dims: 4,
            base: 160000.0,
            yarn: Some(YarnScaling {
                factor: 16.0,
                orig_ctx: 65536,
                beta_fast: 32.0,
                beta_slow: 1.0,
            }),
            inverse: false,
        };
        let mut mem = HostMemory::default();
        let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.37 - 2.0).collect();
        let xt = mem.f32_tensor(&[2, 8], &x).unwrap();
        let pos = mem
            .tensor(crate::DType::I32, &[2], bytemuck::cast_slice(&[5i32, 300]))
            .unwrap();
        let y: Vec<f32> = bytemuck::pod_collect_to_vec(&tail_rope(&mem, &xt, &pos, &p).unwrap());
        // The first head_dim - n_dims values pass through.
        assert_eq!(&y[..4], &x[..4]);
        assert_ne!(&y[4..8], &x[4..8]);
        let yt = mem.f32_tensor(&[2, 8], &y).unwrap();
        p.inverse = true;
        let back: Vec<f32> = bytemuck::pod_collect_to_vec(&tail_rope(&mem, &yt, &pos, &p).unwrap());
        for (a, b) in back.iter().zip(&x) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn sinkhorn_ends_on_a_column_step() {
        let p = HcMixParams {
            hc: 4,
            iters: 20,
            eps: 1e-6,
            norm_eps: None,
        };
        let m: Vec<f32> = (0..24).map(|i| ((i * 7) % 11) as f32 * 0.5 - 2.0).collect();
        let mut out = vec![0f32; 24];
        hc_mix_row(&m, &[1.0, 1.0, 3.0], &[0.0; 24], &p, &mut out);
        for k in 0..4 {
            assert!(out[k] > 0.0 && out[k] < 1.0 + 1e-6, "pre");
            assert!(out[4 + k] > 0.0 && out[4 + k] < 2.0, "post in (0, 2)");
        }
        // Columns sum to 1 (up to eps) after the last step; rows nearly.
        for b in 0..4 {
            let col: f32 = (0..4).map(|a| out[8 + a * 4 + b]).sum();
            assert!((col - 1.0).abs() < 1e-5, "column {b} sums to {col}");
        }
        for a in 0..4 {
            let row: f32 = out[8 + a * 4..8 + a * 4 + 4].iter().sum();
            assert!((row - 1.0).abs() < 1e-2, "row {a} sums to {row}");
        }
    }

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
