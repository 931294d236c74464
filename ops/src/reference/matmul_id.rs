//! Reference of the matmul per expert over the rows routed to it
//! (`MatMulId`).

use super::{f32_bytes, to_f32, HostMemory};
use crate::tensor::Tensor;
use crate::OpError;

pub(super) fn matmul_id(
    mem: &HostMemory,
    x: &Tensor,
    w: &Tensor,
    ids: &Tensor,
) -> Result<Vec<u8>, OpError> {
    let xv = mem.to_f32(x)?;
    let idv = mem.to_i32(ids);
    let dims = w.shape.dims();
    let (experts, m, k) = (dims[0], dims[1], dims[2]);
    let (n, slots) = (ids.rows(), ids.cols());
    let wb = mem.bytes(w);
    let row_bytes = w.row_bytes();
    let mut out = Vec::with_capacity(n * slots * m);
    for i in 0..n {
        for s in 0..slots {
            let e = idv[i * slots + s];
            if e < 0 || e as usize >= experts {
                return Err(OpError::Param {
                    op: "matmul_id",
                    message: format!("expert id {e} outside 0..{experts}"),
                });
            }
            let xr = if x.rows() == n { i } else { i * slots + s };
            let xrow = &xv[xr * k..(xr + 1) * k];
            for r in 0..m {
                let at = (e as usize * m + r) * row_bytes;
                let wrow = to_f32(&wb[at..at + row_bytes], w.dtype, k)?;
                let v: f64 = wrow
                    .iter()
                    .zip(xrow)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum();
                out.push(v as f32);
            }
        }
    }
    Ok(f32_bytes(out))
}
