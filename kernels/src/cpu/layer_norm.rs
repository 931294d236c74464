//! LayerNorm with weight and bias: `out = (x - mean) * (1 / sqrt(var + eps)) * w + b`.
//!
//! The sums run in f64 in index order (like ggml's `ggml_compute_forward_norm_f32`
//! keeps a double for the mean); the scale is computed in f32.

use super::HostTensor;
use std::ops::Range;

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn layer_norm(
    x: &HostTensor,
    w: &HostTensor,
    b: &HostTensor,
    out: &HostTensor,
    eps: f32,
    rows: Range<usize>,
) {
    let cols = x.tensor.cols();
    let (xv, wv, bv) = (x.f32s(), w.f32s(), b.f32s());
    let o = out.f32_rows_mut(rows.start, rows.len());
    let first = rows.start;
    for r in rows {
        let row = &xv[r * cols..(r + 1) * cols];
        let sum: f64 = row.iter().map(|v| *v as f64).sum();
        let mean = (sum / cols as f64) as f32;
        let sq: f64 = row
            .iter()
            .map(|v| {
                let d = (v - mean) as f64;
                d * d
            })
            .sum();
        let var = (sq / cols as f64) as f32;
        let scale = 1.0 / (var + eps).sqrt();
        let dst = &mut o[(r - first) * cols..(r - first + 1) * cols];
        for (c, y) in dst.iter_mut().enumerate() {
            *y = ((row[c] - mean) * scale).mul_add(wv[c], bv[c]);
        }
    }
}
