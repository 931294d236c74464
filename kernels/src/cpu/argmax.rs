//! Argmax per row (ties: lowest index).

use super::HostTensor;

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn argmax(x: &HostTensor, out: &HostTensor, rows: std::ops::Range<usize>) {
    let cols = x.tensor.cols();
    let xv = x.f32s();
    let o = out.ptr as *mut i32;
    for r in rows {
        let row = &xv[r * cols..(r + 1) * cols];
        let mut best = 0usize;
        for (i, v) in row.iter().enumerate() {
            if *v > row[best] {
                best = i;
            }
        }
        *o.add(r) = best as i32;
    }
}
