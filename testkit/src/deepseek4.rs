//! A plain DeepSeek-V4 forward pass in f64, written straight from the
//! fixtures' `FORMAT.md` (section 3): no graph, no cache, every position
//! computed from the whole prompt. It pins the maths down so the recorded
//! forward pass (`weft_models::deepseek4`) has something obviously correct to be tested
//! against, and it reports what `reference.json` records (per-layer
//! streams, hyper-connection coefficients, routing, indexer choices).
//!
//! Conventions worth repeating (FORMAT.md section 5): Sinkhorn starts with a
//! row softmax and one column normalisation; the comb mixes `C^T X`; post is
//! `2 sigmoid`; RoPE turns the *last* r dims in interleaved pairs, with the
//! angle `p * f` rounded to f32 as PyTorch computes it; compressed rows are
//! rotated at the window start and visible from the token that completes
//! them; the sink joins the softmax denominator only.

use std::collections::HashMap;
use weft_models::deepseek4::{Dsv4Config, LayerKind};
use weft_models::gguf::GgufFile;
use weft_models::ModelError;
use weft_ops::DType;
use weft_ops::TailRopeParams;

/// Hyper-connection coefficients of one token at one site.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HcCoeffs {
    /// `sigmoid(.) + eps` per stream.
    pub pre: Vec<f64>,
    /// `2 sigmoid(.)` per stream.
    pub post: Vec<f64>,
    /// `comb[a][b]`: weight of old stream `a` in new stream `b`.
    pub comb: Vec<Vec<f64>>,
}

/// What one layer did at the last position (`reference.json`'s
/// `debug_last_position`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerDebug {
    pub hc_attn: HcCoeffs,
    pub hc_ffn: HcCoeffs,
    pub router_logits: Vec<f64>,
    /// Selected experts, ascending.
    pub experts: Vec<usize>,
    /// Their weights (routed scaling included), aligned with `experts`.
    pub expert_weights: Vec<f64>,
    /// CSA layers: the rows the indexer kept, ascending.
    pub indexer_selected: Vec<usize>,
    /// CSA layers: the score of every visible row.
    pub indexer_scores: Vec<f64>,
}

/// One layer's outputs: the streams leaving it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerTrace {
    /// Streams at the last position, `hc x D` stream-major.
    pub streams_last: Vec<f64>,
    /// RMS over all `hc x D` values, per position.
    pub rms_per_position: Vec<f64>,
    pub debug: LayerDebug,
}

/// Outputs of one reference forward pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RefOutput {
    /// Logits `[S, V]`, row-major.
    pub logits: Vec<f64>,
    pub layers: Vec<LayerTrace>,
    /// L2 norm of the final normalised hidden state, per position.
    pub final_hidden_norm: Vec<f64>,
    /// L2 norm of the collapsed head vector, per position.
    pub hc_head_out_norm: Vec<f64>,
}

/// The weights of a file as f64, and the config.
pub struct RefModel {
    pub config: Dsv4Config,
    floats: HashMap<String, Vec<f64>>,
    ints: HashMap<String, Vec<i32>>,
}

/// `y[o] = sum_i w[o * cols + i] x[i]`.
fn matvec(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms(x: &[f64], w: Option<&[f64]>, eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps).sqrt();
    match w {
        Some(w) => x.iter().zip(w).map(|(v, g)| v * r * g).collect(),
        None => x.iter().map(|v| v * r).collect(),
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f64) -> f64 {
    if x > 30.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Rotates the last `r` dims of every head of `v` at `pos`.
fn rope(v: &mut [f64], p: &TailRopeParams, freqs: &[f32], pos: usize) {
    let nope = p.head_dim - p.n_dims;
    for head in v.chunks_exact_mut(p.head_dim) {
        for (i, &f) in freqs.iter().enumerate() {
            let theta = (pos as f32 * f) as f64;
            let (s, c) = theta.sin_cos();
            let s = if p.inverse { -s } else { s };
            let j = nope + 2 * i;
            let (a, b) = (head[j], head[j + 1]);
            head[j] = a * c - b * s;
            head[j + 1] = a * s + b * c;
        }
    }
}

/// Softmax-weighted sum of `values` under `logits` (max-subtracted).
fn pool(logits: &[f64], values: &[f64]) -> f64 {
    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let (mut num, mut den) = (0.0, 0.0);
    for (l, v) in logits.iter().zip(values) {
        let e = (l - m).exp();
        num += e * v;
        den += e;
    }
    num / den
}

impl RefModel {
    /// Reads every tensor of `file` (F32, F16, BF16, quantized: as f64; I32 as ints).
    pub fn load(file: &GgufFile) -> Result<RefModel, ModelError> {
        let config = Dsv4Config::from_gguf(file)?;
        let mut floats = HashMap::new();
        let mut ints = HashMap::new();
        for info in file.tensors() {
            let data = file.tensor_data(info);
            let n = info.n_elements() as usize;
            if info.dtype == DType::I32 {
                ints.insert(info.name.clone(), bytemuck::pod_collect_to_vec(data));
                continue;
            }
            let values = weft_ops::reference::to_f32(data, info.dtype, n)
                .map_err(|e| ModelError::Shape(format!("tensor `{}`: {e}", info.name)))?;
            floats.insert(
                info.name.clone(),
                values.into_iter().map(f64::from).collect(),
            );
        }
        Ok(RefModel {
            config,
            floats,
            ints,
        })
    }

    fn w(&self, name: &str) -> Result<&[f64], ModelError> {
        self.floats
            .get(name)
            .map(Vec::as_slice)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    fn lw(&self, l: usize, name: &str) -> Result<&[f64], ModelError> {
        self.w(&format!("blk.{l}.{name}"))
    }

    /// The forward pass over `tokens` (positions `0..S`).
    pub fn forward(&self, tokens: &[u32]) -> Result<RefOutput, ModelError> {
        let c = &self.config;
        let (d, hc) = (c.hidden, c.hc);
        let embd = self.w("token_embd.weight")?;
        let mut x: Vec<Vec<f64>> = Vec::with_capacity(tokens.len());
        for &t in tokens {
            let t = t as usize;
            if t >= c.vocab {
                return Err(ModelError::Input(format!(
                    "token id {t} is outside the vocabulary of {}",
                    c.vocab
                )));
            }
            let e = &embd[t * d..(t + 1) * d];
            x.push((0..hc).flat_map(|_| e.iter().copied()).collect());
        }
        let mut out = RefOutput::default();
        for l in 0..c.layers {
            let mut debug = LayerDebug::default();
            let site = self.hc_site(l, "hc_attn", &x)?;
            let attn_norm = self.lw(l, "attn_norm.weight")?;
            let h: Vec<Vec<f64>> = site
                .iter()
                .map(|(xin, _)| rms(xin, Some(attn_norm), c.rms_eps as f64))
                .collect();
            let f = self.attention(l, &h, &mut debug)?;
            for (t, (_, co)) in site.iter().enumerate() {
                x[t] = hc_post(&x[t], &f[t], co, d);
            }
            debug.hc_attn = site.last().map(|s| s.1.clone()).unwrap_or_default();
            let site = self.hc_site(l, "hc_ffn", &x)?;
            for (t, (xin, co)) in site.iter().enumerate() {
                let h = rms(xin, Some(self.lw(l, "ffn_norm.weight")?), c.rms_eps as f64);
                let last = t + 1 == tokens.len();
                let f = self.moe(l, &h, tokens[t], last.then_some(&mut debug))?;
                x[t] = hc_post(&x[t], &f, co, d);
            }
            debug.hc_ffn = site.last().map(|s| s.1.clone()).unwrap_or_default();
            out.layers.push(LayerTrace {
                streams_last: x.last().cloned().unwrap_or_default(),
                rms_per_position: x.iter().map(|s| rms_of(s)).collect(),
                debug,
            });
        }
        self.head(&x, &mut out)?;
        Ok(out)
    }

    /// Pre-mix of one site for every token: the collapsed input and the coefficients.
    fn hc_site(
        &self,
        l: usize,
        site: &str,
        x: &[Vec<f64>],
    ) -> Result<Vec<(Vec<f64>, HcCoeffs)>, ModelError> {
        let c = &self.config;
        let fnw = self.lw(l, &format!("{site}_fn.weight"))?;
        let scale = self.lw(l, &format!("{site}_scale.weight"))?;
        let base = self.lw(l, &format!("{site}_base.weight"))?;
        Ok(x.iter()
            .map(|streams| {
                let m = matvec(fnw, &rms(streams, None, c.rms_eps as f64));
                let co = hc_coeffs(&m, scale, base, c.hc, c.sinkhorn_iters, c.hc_eps as f64);
                (collapse(streams, &co.pre, c.hidden), co)
            })
            .collect())
    }

    fn attention(
        &self,
        l: usize,
        h: &[Vec<f64>],
        debug: &mut LayerDebug,
    ) -> Result<Vec<Vec<f64>>, ModelError> {
        let c = &self.config;
        let eps = c.rms_eps as f64;
        let (nh, hd) = (c.heads, c.head_dim);
        let rope_p = c.rope(l, hd, false);
        let freqs = rope_p.inv_freq();
        let mut qr = Vec::with_capacity(h.len());
        let mut q = Vec::with_capacity(h.len());
        let mut kv = Vec::with_capacity(h.len());
        for (t, ht) in h.iter().enumerate() {
            let qa = matvec(self.lw(l, "attn_q_a.weight")?, ht);
            let r = rms(&qa, Some(self.lw(l, "attn_q_a_norm.weight")?), eps);
            let mut qt: Vec<f64> = matvec(self.lw(l, "attn_q_b.weight")?, &r)
                .chunks_exact(hd)
                .flat_map(|head| rms(head, None, eps))
                .collect();
            rope(&mut qt, &rope_p, &freqs, t);
            let mut k = rms(
                &matvec(self.lw(l, "attn_kv.weight")?, ht),
                Some(self.lw(l, "attn_kv_a_norm.weight")?),
                eps,
            );
            rope(&mut k, &rope_p, &freqs, t);
            qr.push(r);
            q.push(qt);
            kv.push(k);
        }
        let ratio = c.ratio(l) as usize;
        let rows = if ratio != 0 {
            self.compress(l, "attn_compressor", h, hd)?
        } else {
            Vec::new()
        };
        let selection = if c.kind(l) == LayerKind::Csa {
            Some(self.indexer(l, h, &qr, debug)?)
        } else {
            None
        };
        let sinks = self.lw(l, "attn_sinks.weight")?;
        let inv = c.rope(l, hd, true);
        let out_a = self.lw(l, "attn_output_a.weight")?;
        let out_b = self.lw(l, "attn_output_b.weight")?;
        let group_in = nh * hd / c.out_groups;
        let mut outs = Vec::with_capacity(h.len());
        for t in 0..h.len() {
            let lo = (t + 1).saturating_sub(c.window as usize);
            let mut keys: Vec<&[f64]> = (lo..=t).map(|p| kv[p].as_slice()).collect();
            if let Some(visible) = (t + 1).checked_div(ratio) {
                match &selection {
                    Some(sel) => keys.extend(sel[t].iter().map(|&w| rows[w].as_slice())),
                    None => keys.extend(rows[..visible].iter().map(Vec::as_slice)),
                }
            }
            let mut o = vec![0.0; nh * hd];
            for head in 0..nh {
                let qh = &q[t][head * hd..(head + 1) * hd];
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|k| {
                        qh.iter().zip(*k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(sinks[head], f64::max);
                let den =
                    (sinks[head] - m).exp() + scores.iter().map(|s| (s - m).exp()).sum::<f64>();
                for (k, s) in keys.iter().zip(&scores) {
                    let p = (s - m).exp() / den;
                    for (oi, ki) in o[head * hd..(head + 1) * hd].iter_mut().zip(*k) {
                        *oi += p * ki;
                    }
                }
            }
            rope(&mut o, &inv, &freqs, t);
            let u: Vec<f64> = (0..c.out_groups)
                .flat_map(|g| {
                    let a = &out_a[g * c.out_rank * group_in..(g + 1) * c.out_rank * group_in];
                    matvec(a, &o[g * group_in..(g + 1) * group_in])
                })
                .collect();
            outs.push(matvec(out_b, &u));
        }
        Ok(outs)
    }

    /// The rows of compressor `name` (`attn_compressor` or
    /// `indexer_compressor`) of width `dc` over the whole sequence.
    fn compress(
        &self,
        l: usize,
        name: &str,
        h: &[Vec<f64>],
        dc: usize,
    ) -> Result<Vec<Vec<f64>>, ModelError> {
        let c = &self.config;
        let ratio = c.ratio(l) as usize;
        let overlap = ratio == 4;
        let cw = dc * (1 + overlap as usize);
        let kvw = self.lw(l, &format!("{name}_kv.weight"))?;
        let gw = self.lw(l, &format!("{name}_gate.weight"))?;
        let ape = self.lw(l, &format!("{name}_ape.weight"))?;
        let norm = self.lw(l, &format!("{name}_norm.weight"))?;
        let kappa: Vec<Vec<f64>> = h.iter().map(|x| matvec(kvw, x)).collect();
        let gamma: Vec<Vec<f64>> = h.iter().map(|x| matvec(gw, x)).collect();
        let p = c.rope(l, dc, false);
        let freqs = p.inv_freq();
        let mut rows = Vec::new();
        for w in 0..h.len() / ratio {
            let mut pooled = vec![0.0; dc];
            for (e, out) in pooled.iter_mut().enumerate() {
                let (mut logits, mut values) = (Vec::new(), Vec::new());
                if overlap && w > 0 {
                    for j in 0..ratio {
                        let t = (w - 1) * ratio + j;
                        logits.push(gamma[t][e] + ape[j * cw + e]);
                        values.push(kappa[t][e]);
                    }
                }
                let half = if overlap { dc } else { 0 };
                for j in 0..ratio {
                    let t = w * ratio + j;
                    logits.push(gamma[t][half + e] + ape[j * cw + half + e]);
                    values.push(kappa[t][half + e]);
                }
                *out = pool(&logits, &values);
            }
            let mut row = rms(&pooled, Some(norm), c.rms_eps as f64);
            rope(&mut row, &p, &freqs, w * ratio);
            rows.push(row);
        }
        Ok(rows)
    }

    /// The indexer's choice of compressed rows for every query.
    fn indexer(
        &self,
        l: usize,
        h: &[Vec<f64>],
        qr: &[Vec<f64>],
        debug: &mut LayerDebug,
    ) -> Result<Vec<Vec<usize>>, ModelError> {
        let c = &self.config;
        let (ih, id) = (c.indexer_heads, c.indexer_dim);
        let keys = self.compress(l, "indexer_compressor", h, id)?;
        let qb = self.lw(l, "indexer.attn_q_b.weight")?;
        let proj = self.lw(l, "indexer.proj.weight")?;
        let p = c.rope(l, id, false);
        let freqs = p.inv_freq();
        let wscale = 1.0 / ((id as f64).sqrt() * (ih as f64).sqrt());
        let mut out = Vec::with_capacity(h.len());
        for t in 0..h.len() {
            let mut qi = matvec(qb, &qr[t]);
            rope(&mut qi, &p, &freqs, t);
            let omega: Vec<f64> = matvec(proj, &h[t]).iter().map(|v| v * wscale).collect();
            let visible = (t + 1) / 4;
            let scores: Vec<f64> = keys[..visible]
                .iter()
                .map(|k| {
                    (0..ih)
                        .map(|hh| {
                            let qh = &qi[hh * id..(hh + 1) * id];
                            let dot: f64 = qh.iter().zip(k).map(|(a, b)| a * b).sum();
                            omega[hh] * dot.max(0.0)
                        })
                        .sum()
                })
                .collect();
            let mut order: Vec<usize> = (0..visible).collect();
            order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            order.truncate(c.indexer_top_k);
            order.sort_unstable();
            if t + 1 == h.len() {
                debug.indexer_selected = order.clone();
                debug.indexer_scores = scores;
            }
            out.push(order);
        }
        Ok(out)
    }

    fn moe(
        &self,
        l: usize,
        x: &[f64],
        token: u32,
        debug: Option<&mut LayerDebug>,
    ) -> Result<Vec<f64>, ModelError> {
        let c = &self.config;
        let (dm, ff, k) = (c.hidden, c.expert_ff, c.experts_used);
        let logits = matvec(self.lw(l, "ffn_gate_inp.weight")?, x);
        let scores: Vec<f64> = logits.iter().map(|&v| softplus(v).sqrt()).collect();
        let experts: Vec<usize> = if c.is_hash_layer(l) {
            let table = self
                .ints
                .get(&format!("blk.{l}.ffn_gate_tid2eid.weight"))
                .ok_or_else(|| {
                    ModelError::MissingTensor(format!("blk.{l}.ffn_gate_tid2eid.weight"))
                })?;
            let row = table
                .get(token as usize * k..(token as usize + 1) * k)
                .ok_or_else(|| ModelError::Input(format!("token {token} has no hash route")))?;
            row.iter().map(|&e| e as usize).collect()
        } else {
            let bias = self.lw(l, "exp_probs_b.bias")?;
            let mut order: Vec<usize> = (0..c.experts).collect();
            let biased = |e: usize| scores[e] + bias[e];
            order.sort_by(|&a, &b| biased(b).total_cmp(&biased(a)).then(a.cmp(&b)));
            order.truncate(k);
            order
        };
        let total: f64 = experts.iter().map(|&e| scores[e]).sum();
        let weights: Vec<f64> = experts
            .iter()
            .map(|&e| {
                let s = if c.weights_norm {
                    scores[e] / total
                } else {
                    scores[e]
                };
                s * c.routed_scale as f64
            })
            .collect();
        let gate = self.lw(l, "ffn_gate_exps.weight")?;
        let up = self.lw(l, "ffn_up_exps.weight")?;
        let down = self.lw(l, "ffn_down_exps.weight")?;
        let clamp = c.clamp_exp[l] as f64;
        let mut y = vec![0.0; dm];
        for (&e, &wt) in experts.iter().zip(&weights) {
            let m = dm * ff;
            let ye = swiglu(
                &gate[e * m..(e + 1) * m],
                &up[e * m..(e + 1) * m],
                &down[e * m..(e + 1) * m],
                x,
                clamp,
            );
            y.iter_mut().zip(&ye).for_each(|(a, b)| *a += wt * b);
        }
        let shared = swiglu(
            self.lw(l, "ffn_gate_shexp.weight")?,
            self.lw(l, "ffn_up_shexp.weight")?,
            self.lw(l, "ffn_down_shexp.weight")?,
            x,
            c.clamp_shexp[l] as f64,
        );
        y.iter_mut().zip(&shared).for_each(|(a, b)| *a += b);
        if let Some(debug) = debug {
            let mut pairs: Vec<(usize, f64)> = experts.into_iter().zip(weights).collect();
            pairs.sort_by_key(|p| p.0);
            debug.router_logits = logits;
            debug.experts = pairs.iter().map(|p| p.0).collect();
            debug.expert_weights = pairs.iter().map(|p| p.1).collect();
        }
        Ok(y)
    }

    fn head(&self, x: &[Vec<f64>], out: &mut RefOutput) -> Result<(), ModelError> {
        let c = &self.config;
        let fnw = self.w("output_hc_fn.weight")?;
        let scale = self.w("output_hc_scale.weight")?;
        let base = self.w("output_hc_base.weight")?;
        let norm = self.w("output_norm.weight")?;
        let output = self.w("output.weight")?;
        for streams in x {
            let m = matvec(fnw, &rms(streams, None, c.rms_eps as f64));
            let pre: Vec<f64> = (0..c.hc)
                .map(|k| sigmoid(m[k] * scale[0] + base[k]) + c.hc_eps as f64)
                .collect();
            let y = collapse(streams, &pre, c.hidden);
            let z = rms(&y, Some(norm), c.rms_eps as f64);
            out.hc_head_out_norm.push(l2(&y));
            out.final_hidden_norm.push(l2(&z));
            out.logits.extend(matvec(output, &z));
        }
        Ok(())
    }
}

/// `down . (silu(min(gate x, L)) * clamp(up x, -L, L))`.
fn swiglu(gate: &[f64], up: &[f64], down: &[f64], x: &[f64], limit: f64) -> Vec<f64> {
    let g = matvec(gate, x);
    let u = matvec(up, x);
    let a: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| {
            let g = g.min(limit);
            let u = u.clamp(-limit, limit);
            g * sigmoid(g) * u
        })
        .collect();
    matvec(down, &a)
}

/// Pre, post and the Sinkhorn-normalised comb from the mixer output `m`.
pub fn hc_coeffs(m: &[f64], s: &[f64], b: &[f64], hc: usize, iters: usize, eps: f64) -> HcCoeffs {
    let pre = (0..hc).map(|k| sigmoid(m[k] * s[0] + b[k]) + eps).collect();
    let post = (0..hc)
        .map(|k| 2.0 * sigmoid(m[hc + k] * s[1] + b[hc + k]))
        .collect();
    let mut comb: Vec<Vec<f64>> = (0..hc)
        .map(|a| {
            let row: Vec<f64> = (0..hc)
                .map(|j| m[2 * hc + a * hc + j] * s[2] + b[2 * hc + a * hc + j])
                .collect();
            let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = row.iter().map(|v| (v - mx).exp()).sum();
            row.iter().map(|v| (v - mx).exp() / sum + eps).collect()
        })
        .collect();
    let normalize_columns = |comb: &mut Vec<Vec<f64>>| {
        for j in 0..hc {
            let sum: f64 = comb.iter().map(|r| r[j]).sum::<f64>() + eps;
            comb.iter_mut().for_each(|r| r[j] /= sum);
        }
    };
    normalize_columns(&mut comb);
    for _ in 1..iters {
        for row in comb.iter_mut() {
            let sum: f64 = row.iter().sum::<f64>() + eps;
            row.iter_mut().for_each(|v| *v /= sum);
        }
        normalize_columns(&mut comb);
    }
    HcCoeffs { pre, post, comb }
}

/// `sum_k pre[k] X[k]`.
fn collapse(streams: &[f64], pre: &[f64], d: usize) -> Vec<f64> {
    let mut y = vec![0.0; d];
    for (k, p) in pre.iter().enumerate() {
        y.iter_mut()
            .zip(&streams[k * d..(k + 1) * d])
            .for_each(|(a, b)| *a += p * b);
    }
    y
}

/// `X'[j] = post[j] f + sum_a C[a][j] X[a]`.
fn hc_post(streams: &[f64], f: &[f64], co: &HcCoeffs, d: usize) -> Vec<f64> {
    let hc = co.pre.len();
    let mut out = vec![0.0; hc * d];
    for j in 0..hc {
        let dst = &mut out[j * d..(j + 1) * d];
        for (i, v) in dst.iter_mut().enumerate() {
            let mut acc = co.post[j] * f[i];
            for a in 0..hc {
                acc += co.comb[a][j] * streams[a * d + i];
            }
            *v = acc;
        }
    }
    out
}

fn rms_of(x: &[f64]) -> f64 {
    (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64).sqrt()
}

fn l2(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum::<f64>().sqrt()
}
