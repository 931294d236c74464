//! RMS norm and LayerNorm on CUDA (f64 sums reproduced exactly, see norm.cu).

use super::launch::{check_aligned, check_arity, launch as enqueue, row_stage, Arg};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::OpError;

pub(super) const KERNELS: &[&str] = &[
    "rms_norm",
    "layer_norm",
    "test_seq_sum",
    "test_bounded_mean",
];

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn rms_norm(
    kernels: &CudaKernels,
    stream: &CudaStream,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    eps: f32,
) -> Result<(), OpError> {
    const OP: &str = "rms_norm";
    check_arity(OP, ins, outs, 2)?;
    for t in ins.iter().chain(outs) {
        check_aligned(OP, t, 4)?;
    }
    let (x, w, out) = (&ins[0], &ins[1], &outs[0]);
    let rows = x.tensor.rows();
    let (stage_bytes, staged) = row_stage(x.tensor.cols());
    enqueue(
        stream,
        kernels.fns.get(OP, "rms_norm")?,
        (rows as u32, 1, 1),
        32,
        stage_bytes,
        &[
            Arg::Ptr(x.ptr),
            Arg::Ptr(w.ptr),
            Arg::Ptr(out.ptr),
            Arg::I32(rows as i32),
            Arg::I32(x.tensor.cols() as i32),
            Arg::F32(eps),
            Arg::I32(staged),
            Arg::I32(super::launch::F64_SUM_BOUNDED),
        ],
        OP,
    )
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn layer_norm(
    kernels: &CudaKernels,
    stream: &CudaStream,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    eps: f32,
) -> Result<(), OpError> {
    const OP: &str = "layer_norm";
    check_arity(OP, ins, outs, 3)?;
    for t in ins.iter().chain(outs) {
        check_aligned(OP, t, 4)?;
    }
    let (x, out) = (&ins[0], &outs[0]);
    let rows = x.tensor.rows();
    let (stage_bytes, staged) = row_stage(x.tensor.cols());
    enqueue(
        stream,
        kernels.fns.get(OP, "layer_norm")?,
        (rows as u32, 1, 1),
        32,
        stage_bytes,
        &[
            Arg::Ptr(x.ptr),
            Arg::Ptr(ins[1].ptr),
            Arg::Ptr(ins[2].ptr),
            Arg::Ptr(out.ptr),
            Arg::I32(rows as i32),
            Arg::I32(x.tensor.cols() as i32),
            Arg::F32(eps),
            Arg::I32(staged),
            Arg::I32(super::launch::F64_SUM_BOUNDED),
        ],
        OP,
    )
}
