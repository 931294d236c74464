//! Row softmax.

use super::HostTensor;

/// `out = softmax(x * scale)` per row.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn softmax(
    x: &HostTensor,
    out: &HostTensor,
    scale: f32,
    rows: std::ops::Range<usize>,
) {
    let cols = x.tensor.cols();
    let xv = x.f32s();
    let o = out.f32_rows_mut(rows.start, rows.len());
    for (i, r) in rows.enumerate() {
        let row = &xv[r * cols..(r + 1) * cols];
        let dst = &mut o[i * cols..(i + 1) * cols];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(v * scale));
        let mut sum = 0f64;
        for (d, v) in dst.iter_mut().zip(row) {
            *d = (v * scale - max).exp();
            sum += *d as f64;
        }
        let inv = (1.0 / sum) as f32;
        dst.iter_mut().for_each(|d| *d *= inv);
    }
}
