//! Dispatch of the family-module ops ([`weft_ops::OpFamily`]) on CUDA. Their kernels live beside the
//! other families, one file pair per family with the CPU's names:
//! `tail_rope` (partial interleaved RoPE), `hyper` (hyper-connection mix,
//! collapse, expand), `compress` (KV compressor and indexer top-k),
//! `sink_attention`, `moe` (routing, expert weights, clamped SwiGLU,
//! combination) and `matmul_id` (the indexed expert matmul over every
//! weight format the public DeepSeek-V4 files use).
//!
//! Every family says which kernels it loads, whether it runs a node, and
//! launches it; the two that need device scratch or step scalars
//! (`compress`, `sink_attention`) say how much and which.

use super::{compress, hyper, matmul_id, moe, sink_attention, tail_rope};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::{Op, OpError, OpFamily as Family, OpNode};

/// The kernels of every family module.
pub(super) fn kernels() -> Vec<&'static str> {
    [
        tail_rope::KERNELS,
        hyper::KERNELS,
        compress::KERNELS,
        sink_attention::KERNELS,
        moe::KERNELS,
        matmul_id::KERNELS,
    ]
    .concat()
}

/// The family of an op of a family module ([`Op::family`]).
fn family(op: &Op) -> Option<Family> {
    op.family()
}

/// Whether `op` belongs to a family module (dispatched here).
pub(super) fn owns(op: &Op) -> bool {
    family(op).is_some()
}

/// Does CUDA run this family-module node?
pub(super) fn supports(node: &OpNode) -> Result<(), OpError> {
    match family(&node.op) {
        Some(Family::TailRope) => tail_rope::supports(node),
        Some(Family::HyperConnection) => hyper::supports(node),
        Some(Family::Compression) => compress::supports(node),
        Some(Family::SinkAttention) => sink_attention::supports(node),
        Some(Family::Routing) => moe::supports(node),
        Some(Family::ExpertMatMul) => matmul_id::supports(node),
        None => Err(super::launch::unsupported(
            node.op.name(),
            "the family dispatch".into(),
        )),
    }
}

/// Bytes of device scratch one launch needs.
pub(super) fn scratch_bytes(k: &CudaKernels, node: &OpNode) -> usize {
    match family(&node.op) {
        Some(Family::ExpertMatMul) => matmul_id::scratch_bytes(k, node),
        Some(Family::Compression) => compress::scratch_bytes(node),
        Some(Family::SinkAttention) => sink_attention::scratch_bytes(node),
        _ => 0,
    }
}

/// Values the kernels read from device memory per step (see
/// [`CudaKernels::step_scalars`]).
pub(super) fn step_scalars(node: &OpNode) -> Vec<u32> {
    match family(&node.op) {
        Some(Family::Compression) => compress::step_scalars(node),
        Some(Family::SinkAttention) => sink_attention::step_scalars(node),
        _ => Vec::new(),
    }
}

/// Enqueues a family-module node's kernels (see [`CudaKernels::launch`]).
///
/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch(
    k: &CudaKernels,
    s: &CudaStream,
    node: &OpNode,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    scratch: u64,
    step: u64,
) -> Result<(), OpError> {
    match family(&node.op) {
        Some(Family::TailRope) => tail_rope::launch(k, s, node, ins, outs),
        Some(Family::HyperConnection) => hyper::launch(k, s, node, ins, outs),
        Some(Family::Compression) => compress::launch(k, s, node, ins, outs, scratch, step),
        Some(Family::SinkAttention) => sink_attention::launch(k, s, node, ins, outs, scratch, step),
        Some(Family::Routing) => moe::launch(k, s, node, ins, outs),
        Some(Family::ExpertMatMul) => matmul_id::launch(k, s, node, ins, outs, scratch),
        None => Err(super::launch::unsupported(
            node.op.name(),
            "the family dispatch".into(),
        )),
    }
}
