//! Argmax per row on CUDA (ties: lowest index).

use super::launch::{check_aligned, check_arity, launch as enqueue, Arg};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::OpError;

pub(super) const KERNELS: &[&str] = &["argmax_f32", "argmax_f32_cluster"];

/// Rows of at least this many values take the eight-block cluster kernel
/// (argmax.cu): one SM alone streams a vocabulary-sized row at a fraction
/// of what eight do.
const CLUSTER_MIN_COLS: usize = 4096;
/// Blocks per row of the cluster kernel (argmax.cu's ARGMAX_CLUSTER).
const CLUSTER_BLOCKS: usize = 8;

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
    let (rows, cols) = (ins[0].tensor.rows(), ins[0].tensor.cols());
    let (name, grid, threads) = if cols >= CLUSTER_MIN_COLS && super::launch::sm90() {
        ("argmax_f32_cluster", rows * CLUSTER_BLOCKS, 256)
    } else {
        ("argmax_f32", rows, 1024)
    };
    enqueue(
        stream,
        kernels.fns.get(OP, name)?,
        (grid as u32, 1, 1),
        threads,
        0,
        &[
            Arg::Ptr(ins[0].ptr),
            Arg::Ptr(outs[0].ptr),
            Arg::I32(rows as i32),
            Arg::I32(cols as i32),
        ],
        OP,
    )
}
