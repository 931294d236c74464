//! Matrix multiplication `x @ w^T`, split over weight rows.

use super::{HostTensor, WorkSplit};
use std::ops::Range;
use weft_ops::{DType, OpError, Tensor};

pub(super) fn supports(w: &Tensor) -> Result<(), OpError> {
    match w.dtype {
        DType::F32 | DType::F16 | DType::BF16 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q8_0 | DType::Q4_K | DType::Q6_K => Ok(()),
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
pub(super) unsafe fn matmul(x: &HostTensor, w: &HostTensor, out: &HostTensor, rows: Range<usize>) -> Result<(), OpError> {
    let (xt, wt) = (x.tensor, w.tensor);
    let (xr, wr, k, m) = (xt.row_bytes(), wt.row_bytes(), xt.cols(), wt.rows());
    let (xb, wb) = (x.bytes(), w.bytes());
    let o = out.ptr as *mut f32;
    let mut wf = vec![0f32; k];
    for r in rows {
        let wrow = &wb[r * wr..(r + 1) * wr];
        if xt.dtype == DType::F32 {
            dequantize(wrow, wt.dtype, &mut wf)?;
        }
        for t in 0..xt.rows() {
            let xrow = &xb[t * xr..(t + 1) * xr];
            let v = if xt.dtype == DType::F32 {
                super::simd::dot_f32(std::slice::from_raw_parts(xrow.as_ptr() as *const f32, k), &wf)
            } else {
                match (wt.dtype, xt.dtype) {
                    (DType::Q4_1, DType::Q8_1) => super::exact_dot::q4_1_q8_1(wrow, xrow),
                    (DType::Q8_0, DType::Q8_0) => super::exact_dot::q8_0_q8_0(wrow, xrow),
                    (DType::Q5_0, DType::Q8_0) => super::exact_dot::q5_0_q8_0(wrow, xrow),
                    _ => weft_ops::quant::vec_dot_reference(wt.dtype, wrow, xt.dtype, xrow)?,
                }
            };
            *o.add(t * m + r) = v;
        }
    }
    Ok(())
}

fn dequantize(src: &[u8], dtype: DType, dst: &mut [f32]) -> Result<(), OpError> {
    match dtype {
        DType::F32 => dst.copy_from_slice(bytemuck::cast_slice(src)),
        _ => weft_ops::quant::dequantize_row(dtype, src, dst)?,
    }
    Ok(())
}
