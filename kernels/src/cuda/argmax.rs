//! Argmax per row on CUDA (ties: lowest index).

use super::launch::{check_aligned, check_arity, launch as enqueue, Arg};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::OpError;

pub(super) const KERNELS: &[&str] = &["argmax_f32"];

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch(
    kernels: &CudaKernels,
    stream: &CudaStream,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    const OP: &str = "argmax";
    check_arity(OP, ins, outs, 1)?;
    check_aligned(OP, &ins[0], 4)?;
    check_aligned(OP, &outs[0], 4)?;
    let rows = ins[0].tensor.rows();
    enqueue(
        stream,
        kernels.fns.get(OP, "argmax_f32")?,
        (rows as u32, 1, 1),
        1024,
        0,
        &[
            Arg::Ptr(ins[0].ptr),
            Arg::Ptr(outs[0].ptr),
            Arg::I32(rows as i32),
            Arg::I32(ins[0].tensor.cols() as i32),
        ],
        OP,
    )
}
