//! Hyper-connections on the CPU: the mixing coefficients (pre, post,
//! Sinkhorn comb), the collapse of the streams and the post-mix.

use super::HostTensor;
use weft_ops::dsv4::HcMixParams;
use weft_ops::OpError;

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn hc_mix(
    m: &HostTensor,
    scale: &HostTensor,
    base: &HostTensor,
    out: &HostTensor,
    p: &HcMixParams,
    rows: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let cols = m.tensor.cols();
    let (mv, s, b) = (m.f32s(), scale.f32s(), base.f32s());
    let o = out.f32_rows_mut(rows.start, rows.len());
    for (i, r) in rows.enumerate() {
        weft_ops::reference::hc_mix_row(
            &mv[r * cols..(r + 1) * cols],
            s,
            b,
            p,
            &mut o[i * cols..(i + 1) * cols],
        );
    }
    Ok(())
}

/// `out[r] = sum_k co[r][k] x[r][k]`.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn hc_collapse(
    x: &HostTensor,
    co: &HostTensor,
    out: &HostTensor,
    hc: usize,
    rows: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let (xc, cc) = (x.tensor.cols(), co.tensor.cols());
    let d = xc / hc;
    let (xv, cv) = (x.f32s(), co.f32s());
    let o = out.f32_rows_mut(rows.start, rows.len());
    for (i, r) in rows.enumerate() {
        let dst = &mut o[i * d..(i + 1) * d];
        let c = &cv[r * cc..r * cc + hc];
        dst.fill(0.0);
        for (k, &w) in c.iter().enumerate() {
            let src = &xv[r * xc + k * d..r * xc + (k + 1) * d];
            dst.iter_mut().zip(src).for_each(|(a, b)| *a += w * b);
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
