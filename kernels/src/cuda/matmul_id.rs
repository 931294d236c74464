//! TODO(dsv4-cuda): kernels of this family are being written.

use super::launch::unsupported;
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::{OpError, OpNode};

pub(super) const KERNELS: &[&str] = &[];

pub(super) fn supports(node: &OpNode) -> Result<(), OpError> {
    Err(unsupported(node.op.name(), "this op".into()))
}

pub(super) fn scratch_bytes(_node: &OpNode) -> usize {
    0
}

pub(super) fn step_scalars(_node: &OpNode) -> Vec<u32> {
    Vec::new()
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch(
    _k: &CudaKernels,
    _s: &CudaStream,
    node: &OpNode,
    _ins: &[DeviceTensor],
    _outs: &[DeviceTensor],
    _scratch: u64,
    _step: u64,
) -> Result<(), OpError> {
    Err(unsupported(node.op.name(), "this op".into()))
}
