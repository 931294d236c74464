//! Reference of the hyper-connection ops (`HcMix`, `HcCollapse`,
//! `HcExpand`): f64 sums, Sinkhorn iterations in f64.

use super::{f32_bytes, HostMemory};
use crate::family::HcMixParams;
use crate::tensor::Tensor;
use crate::OpError;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
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

pub(super) fn hc_mix(
    mem: &HostMemory,
    ins: &[Tensor],
    p: &HcMixParams,
) -> Result<Vec<u8>, OpError> {
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
pub(super) fn inv_rms(x: &[f32], eps: f32) -> f64 {
    let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    1.0 / (ms + eps as f64).sqrt()
}

pub(super) fn hc_collapse(
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

pub(super) fn hc_expand(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
