//! Matrix multiplication `x @ w^T` for every weight format.

use super::{f32_bytes, to_f32, HostMemory};
use crate::dtype::DType;
use crate::tensor::Tensor;
use crate::OpError;

pub(super) fn matmul(mem: &HostMemory, x: &Tensor, w: &Tensor) -> Result<Vec<u8>, OpError> {
    let (xb, wb) = (mem.bytes(x), mem.bytes(w));
    let (xr, wr, k) = (x.row_bytes(), w.row_bytes(), x.cols());
    let mut out = Vec::with_capacity(x.rows() * w.rows());
    for t in 0..x.rows() {
        let xrow = &xb[t * xr..(t + 1) * xr];
        let xf = if x.dtype == DType::F32 {
            Some(to_f32(xrow, DType::F32, k)?)
        } else {
            None
        };
        for r in 0..w.rows() {
            let wrow = &wb[r * wr..(r + 1) * wr];
            let v = match &xf {
                // f32 activations: dequantize the weight row, sum in f64.
                Some(xf) => {
                    let wf = to_f32(wrow, w.dtype, k)?;
                    wf.iter()
                        .zip(xf)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>() as f32
                }
                // Activations already in the weight's activation format: the
                // integer-exact block dot product.
                None => crate::quant::vec_dot_reference(w.dtype, wrow, x.dtype, xrow)?,
            };
            out.push(v);
        }
    }
    Ok(f32_bytes(out))
}
