//! The same GPT-2-style model in plain Rust: no weft, no cache, every
//! position recomputed from the tokens, sums in f64. What the weft
//! recording is checked against.

use super::model::{Gpt2Values, LayerValues};

/// `y = W x + b` for `W [out, in]` row-major.
fn linear(w: &[f32], b: &[f32], x: &[f64]) -> Vec<f64> {
    b.iter()
        .enumerate()
        .map(|(o, bias)| {
            let row = &w[o * x.len()..(o + 1) * x.len()];
            row.iter().zip(x).map(|(a, v)| *a as f64 * v).sum::<f64>() + *bias as f64
        })
        .collect()
}

fn layer_norm(x: &[f64], w: &[f32], b: &[f32], eps: f32) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let inv = 1.0 / (var + eps as f64).sqrt();
    x.iter()
        .zip(w.iter().zip(b))
        .map(|(v, (g, c))| (v - mean) * inv * *g as f64 + *c as f64)
        .collect()
}

/// GELU, tanh form.
fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// Logits (`[tokens.len(), vocab]`) of every position of `tokens`.
pub fn forward(m: &Gpt2Values, tokens: &[u32]) -> Vec<f32> {
    let c = m.config;
    let d = c.hidden;
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .enumerate()
        .map(|(p, &t)| {
            (0..d)
                .map(|i| m.wte[t as usize * d + i] as f64 + m.wpe[p * d + i] as f64)
                .collect()
        })
        .collect();
    for l in &m.layers {
        block(l, c.heads, c.eps, &mut xs);
    }
    let mut out = Vec::with_capacity(tokens.len() * c.vocab);
    for x in &xs {
        let h = layer_norm(x, &m.lnf_w, &m.lnf_b, c.eps);
        let zero = vec![0f32; c.vocab];
        out.extend(linear(&m.wte, &zero, &h).into_iter().map(|v| v as f32));
    }
    out
}

fn block(l: &LayerValues, heads: usize, eps: f32, xs: &mut [Vec<f64>]) {
    let d = xs[0].len();
    let hd = d / heads;
    let hs: Vec<Vec<f64>> = xs
        .iter()
        .map(|x| layer_norm(x, &l.ln1_w, &l.ln1_b, eps))
        .collect();
    let q: Vec<Vec<f64>> = hs.iter().map(|h| linear(&l.wq, &l.bq, h)).collect();
    let k: Vec<Vec<f64>> = hs.iter().map(|h| linear(&l.wk, &l.bk, h)).collect();
    let v: Vec<Vec<f64>> = hs.iter().map(|h| linear(&l.wv, &l.bv, h)).collect();
    let scale = 1.0 / (hd as f64).sqrt();
    for (i, x) in xs.iter_mut().enumerate() {
        let mut a = vec![0f64; d];
        for h in 0..heads {
            let r = h * hd..(h + 1) * hd;
            let scores: Vec<f64> = (0..=i)
                .map(|j| {
                    q[i][r.clone()]
                        .iter()
                        .zip(&k[j][r.clone()])
                        .map(|(a, b)| a * b)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (j, p) in e.iter().enumerate() {
                for (o, val) in a[r.clone()].iter_mut().zip(&v[j][r.clone()]) {
                    *o += p / sum * val;
                }
            }
        }
        let o = linear(&l.wo, &l.bo, &a);
        x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
        let h = layer_norm(x, &l.ln2_w, &l.ln2_b, eps);
        let u: Vec<f64> = linear(&l.fc1, &l.fc1_b, &h).into_iter().map(gelu).collect();
        let y = linear(&l.fc2, &l.fc2_b, &u);
        x.iter_mut().zip(&y).for_each(|(x, y)| *x += y);
    }
}
