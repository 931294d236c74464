//! Elementwise kernels: add, mul, scale, silu(gate) * up.

use super::{HostTensor, WorkSplit};
use weft_ops::{OpError, Tensor};

pub(super) fn split(x: &Tensor, threads: usize) -> WorkSplit {
    WorkSplit::new(x.rows(), super::rows_per_item(x.rows(), threads))
}

/// `out = f(a, b)` over rows `rows`; `b` is either `a`'s shape or one row.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn binary(
    a: &HostTensor,
    b: &HostTensor,
    out: &HostTensor,
    rows: std::ops::Range<usize>,
    f: impl Fn(f32, f32) -> f32,
) -> Result<(), OpError> {
    let cols = a.tensor.cols();
    let broadcast = b.tensor.rows() == 1;
    // `out` may alias `a` (an in-place residual add): only raw pointers here.
    let (ap, bp, op) = (
        a.ptr as *const f32,
        b.ptr as *const f32,
        out.ptr as *mut f32,
    );
    for r in rows {
        let brow = if broadcast { 0 } else { r * cols };
        for c in 0..cols {
            *op.add(r * cols + c) = f(*ap.add(r * cols + c), *bp.add(brow + c));
        }
    }
    Ok(())
}

/// `out = a * factor`.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn scale(
    a: &HostTensor,
    out: &HostTensor,
    factor: f32,
    rows: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let cols = a.tensor.cols();
    let (ap, op) = (a.ptr as *const f32, out.ptr as *mut f32);
    for i in rows.start * cols..rows.end * cols {
        *op.add(i) = *ap.add(i) * factor;
    }
    Ok(())
}

/// `out = silu(gate) * up`, with the same exp as llama.cpp's CPU backend.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn silu_mul(
    gate: &HostTensor,
    up: &HostTensor,
    out: &HostTensor,
    rows: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let cols = gate.tensor.cols();
    let (g, u) = (gate.f32s(), up.f32s());
    let o = out.f32_rows_mut(rows.start, rows.len());
    let span = rows.start * cols..rows.end * cols;
    super::simd::silu_mul(&g[span.clone()], &u[span], o);
    Ok(())
}
