//! Matrix multiplication `x @ w^T`, split over weight rows.

use super::{HostTensor, WorkSplit};
use std::ops::Range;
use weft_ops::{DType, OpError, Tensor};

pub(super) fn supports(w: &Tensor) -> Result<(), OpError> {
    match w.dtype {
        DType::F32
        | DType::F16
        | DType::BF16
        | DType::Q4_0
        | DType::Q4_1
        | DType::Q5_0
        | DType::Q8_0
        | DType::Q4_K
        | DType::Q6_K => Ok(()),
        other => Err(OpError::Unsupported {
            op: "matmul",
            what: format!("{other} weights on the CPU"),
        }),
    }
}

/// Weight rows per piece: enough pieces to balance threads, few enough to
/// keep each piece streaming contiguous weight rows.
pub(super) fn split(x: &Tensor, w: &Tensor, threads: usize) -> WorkSplit {
    let m = w.rows();
    let target = (threads * 8).max(1);
    let mut per = m.div_ceil(target).max(1);
    if x.rows() > 1 {
        per = per.max(16);
    }
    per = per.next_multiple_of(4).min(m.max(1));
    WorkSplit::new(m, per)
}

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn matmul(
    x: &HostTensor,
    w: &HostTensor,
    out: &HostTensor,
    rows: Range<usize>,
) -> Result<(), OpError> {
    super::quant::matmul_rows(x, w, out, rows)
}
