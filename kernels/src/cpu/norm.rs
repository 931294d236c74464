//! RMS norm, summing squares in f64 like llama.cpp's CPU backend.

use super::HostTensor;

/// `out = x * (1 / sqrt(mean(x^2) + eps)) * w` for rows `rows`.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn rms_norm(
    x: &HostTensor,
    w: &HostTensor,
    out: &HostTensor,
    eps: f32,
    rows: std::ops::Range<usize>,
) {
    let cols = x.tensor.cols();
    let (xv, wv) = (x.f32s(), w.f32s());
    let o = out.ptr as *mut f32;
    for r in rows {
        let row = &xv[r * cols..(r + 1) * cols];
        let sum: f64 = row.iter().map(|v| (v * v) as f64).sum();
        let mean = (sum / cols as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for c in 0..cols {
            *o.add(r * cols + c) = (row[c] * scale) * wv[c];
        }
    }
}
