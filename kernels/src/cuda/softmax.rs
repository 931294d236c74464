//! Row softmax on CUDA (glibc expf, exact f64 sum; see softmax.cu).

use super::launch::{check_aligned, check_arity, launch as enqueue, row_stage, Arg};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::OpError;

pub(super) const KERNELS: &[&str] = &["softmax_f32"];

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch(
    kernels: &CudaKernels,
    stream: &CudaStream,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    scale: f32,
) -> Result<(), OpError> {
    const OP: &str = "softmax";
    check_arity(OP, ins, outs, 1)?;
    check_aligned(OP, &ins[0], 4)?;
    check_aligned(OP, &outs[0], 4)?;
    let rows = ins[0].tensor.rows();
    let (stage_bytes, staged) = row_stage(ins[0].tensor.cols());
    enqueue(
        stream,
        kernels.fns.get(OP, "softmax_f32")?,
        (rows as u32, 1, 1),
        32,
        stage_bytes,
        &[
            Arg::Ptr(ins[0].ptr),
            Arg::Ptr(outs[0].ptr),
            Arg::I32(rows as i32),
            Arg::I32(ins[0].tensor.cols() as i32),
            Arg::F32(scale),
            Arg::I32(staged),
            Arg::I32(super::launch::F64_SUM_BOUNDED),
        ],
        OP,
    )
}
