//! Hyper-connections on the CPU: the mixing coefficients (pre, post,
//! Sinkhorn comb), the collapse of the streams and the post-mix.

use super::HostTensor;
use weft_ops::HcMixParams;
use weft_ops::OpError;

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn hc_mix(
    ins: &[HostTensor],
    out: &HostTensor,
    p: &HcMixParams,
    rows: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let (m, scale, base) = (&ins[0], &ins[1], &ins[2]);
    let cols = m.tensor.cols();
    let (mv, s, b) = (m.f32s(), scale.f32s(), base.f32s());
    let streams = ins.get(3);
    let o = out.f32_rows_mut(rows.start, rows.len());
    let mut row = vec![0f32; cols];
    for (i, r) in rows.enumerate() {
        row.copy_from_slice(&mv[r * cols..(r + 1) * cols]);
        if let (Some(eps), Some(x)) = (p.norm_eps, streams) {
            let xc = x.tensor.cols();
            let xr = &x.f32s()[r * xc..(r + 1) * xc];
            let ms = xr.iter().map(|&v| (v * v) as f64).sum::<f64>() / xc as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            row.iter_mut().for_each(|v| *v = (*v as f64 * inv) as f32);
        }
        weft_ops::reference::hc_mix_row(&row, s, b, p, &mut o[i * cols..(i + 1) * cols]);
    }
    Ok(())
}

/// `out[r] = sum_k co[r][k] x[r][k]`, then its RMS norm with `weight`
/// when `norm_eps` is set.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn hc_collapse(
    ins: &[HostTensor],
    out: &HostTensor,
    hc: usize,
    norm_eps: Option<f32>,
    rows: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let (x, co) = (&ins[0], &ins[1]);
    let (xc, cc) = (x.tensor.cols(), co.tensor.cols());
    let d = xc / hc;
    let (xv, cv) = (x.f32s(), co.f32s());
    let weight = ins.get(2).map(|w| w.f32s());
    let o = out.f32_rows_mut(rows.start, rows.len());
    for (i, r) in rows.enumerate() {
        let dst = &mut o[i * d..(i + 1) * d];
        let c = &cv[r * cc..r * cc + hc];
        dst.fill(0.0);
        for (k, &w) in c.iter().enumerate() {
            let src = &xv[r * xc + k * d..r * xc + (k + 1) * d];
            dst.iter_mut().zip(src).for_each(|(a, b)| *a += w * b);
        }
        if let (Some(eps), Some(w)) = (norm_eps, weight) {
            let ms = dst.iter().map(|&v| (v * v) as f64).sum::<f64>() / d as f64;
            let scale = (1.0 / (ms + eps as f64).sqrt()) as f32;
            dst.iter_mut().zip(w).for_each(|(v, g)| *v = *v * scale * g);
        }
    }
    Ok(())
}

/// Stream `j` of `out[r]` = `post[j] f[r] + sum_a comb[a][j] x[r][a]`.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn hc_expand(
    x: &HostTensor,
    f: &HostTensor,
    co: &HostTensor,
    out: &HostTensor,
    hc: usize,
    rows: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let (xc, d, cc) = (x.tensor.cols(), f.tensor.cols(), co.tensor.cols());
    let (xv, fv, cv) = (x.f32s(), f.f32s(), co.f32s());
    let o = out.f32_rows_mut(rows.start, rows.len());
    for (i, r) in rows.enumerate() {
        let c = &cv[r * cc..(r + 1) * cc];
        let fr = &fv[r * d..(r + 1) * d];
        for j in 0..hc {
            let dst = &mut o[i * xc + j * d..i * xc + (j + 1) * d];
            let post = c[hc + j];
            dst.iter_mut().zip(fr).for_each(|(a, b)| *a = post * b);
            for a in 0..hc {
                let w = c[2 * hc + a * hc + j];
                let src = &xv[r * xc + a * d..r * xc + (a + 1) * d];
                dst.iter_mut().zip(src).for_each(|(o, s)| *o += w * s);
            }
        }
    }
    Ok(())
}
