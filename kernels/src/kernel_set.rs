//! The [`Kernels`] trait: what a runtime backend asks a backend's kernels
//! about a node (does it run here, how much scratch does it need) and how
//! it runs one, the same three questions on every device. Each backend's
//! kernels implement it with their own resolved tensors and launch target.

use weft_ops::{OpError, OpNode};

/// One backend's kernel set.
pub trait Kernels: Send + Sync {
    /// A tensor resolved to the backend's memory.
    type Tensor;
    /// Where one launch goes: a CPU work item, a CUDA stream with its
    /// scratch and step scalars, a Metal encoder with its arena.
    type Target<'a>;

    /// Whether `node` runs on this backend (asked once per recorded node).
    fn supports(&self, node: &OpNode) -> Result<(), OpError>;

    /// Device scratch a launch of `node` needs, in bytes.
    fn scratch_bytes(&self, _node: &OpNode) -> usize {
        0
    }

    /// How many nodes of `node`'s [`OpNode::shared_launch_key`] one launch
    /// of this backend takes (the launch pass groups them); 1, the
    /// default: `node` is launched alone.
    fn shared_launch_limit(&self, _node: &OpNode) -> usize {
        1
    }

    /// Whether `node`, followed on its stream by `next` alone, is launched
    /// early (the launch pass marks it; [`Kernels::launch`] sees the mark
    /// in its target). The default: never.
    fn launches_early(&self, _node: &OpNode, _next: &OpNode) -> bool {
        false
    }

    /// Runs (or enqueues) `node` on `target`.
    ///
    /// # Safety
    /// `ins` and `outs` point at live memory holding `node`'s tensors, as
    /// do the target's scratch and step values; nothing else writes what
    /// the node reads, or touches what it writes, until the launch has
    /// completed.
    unsafe fn launch(
        &self,
        target: &mut Self::Target<'_>,
        node: &OpNode,
        ins: &[Self::Tensor],
        outs: &[Self::Tensor],
    ) -> Result<(), OpError>;
}

/// The CPU kernels.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuKernels;

/// One piece of a CPU node's work.
pub struct CpuItem<'a> {
    /// How the node's work is split over items.
    pub split: &'a crate::cpu::WorkSplit,
    /// The piece to run.
    pub item: usize,
}

impl Kernels for CpuKernels {
    type Tensor = crate::cpu::HostTensor;
    type Target<'a> = CpuItem<'a>;

    fn supports(&self, node: &OpNode) -> Result<(), OpError> {
        crate::cpu::supports(node)
    }

    unsafe fn launch(
        &self,
        target: &mut CpuItem<'_>,
        node: &OpNode,
        ins: &[Self::Tensor],
        outs: &[Self::Tensor],
    ) -> Result<(), OpError> {
        // SAFETY: the caller's guarantees are run_item's.
        unsafe { crate::cpu::run_item(node, ins, outs, target.split, target.item) }
    }
}

/// Where a CUDA launch goes.
#[cfg(feature = "cuda")]
pub struct CudaTarget<'a> {
    pub stream: &'a std::sync::Arc<cudarc::driver::CudaStream>,
    /// Device address of the node's scratch.
    pub scratch: u64,
    /// Device address of the node's step scalars.
    pub step: u64,
    /// Launch before the wait on the kernel ahead (the launch pass's mark,
    /// [`Kernels::launches_early`]).
    pub early: bool,
}

#[cfg(feature = "cuda")]
impl Kernels for crate::cuda::CudaKernels {
    type Tensor = crate::cuda::DeviceTensor;
    type Target<'a> = CudaTarget<'a>;

    fn supports(&self, node: &OpNode) -> Result<(), OpError> {
        crate::cuda::CudaKernels::supports(self, node)
    }

    fn scratch_bytes(&self, node: &OpNode) -> usize {
        crate::cuda::CudaKernels::scratch_bytes(self, node)
    }

    fn shared_launch_limit(&self, node: &OpNode) -> usize {
        crate::cuda::CudaKernels::shared_launch_limit(self, node)
    }

    fn launches_early(&self, node: &OpNode, next: &OpNode) -> bool {
        crate::cuda::CudaKernels::launches_early(self, node, next)
    }

    unsafe fn launch(
        &self,
        t: &mut CudaTarget<'_>,
        node: &OpNode,
        ins: &[Self::Tensor],
        outs: &[Self::Tensor],
    ) -> Result<(), OpError> {
        // SAFETY: the caller's guarantees are launch_early's.
        unsafe { self.launch_early(t.stream, node, ins, outs, t.scratch, t.step, t.early) }
    }
}

/// Where a Metal node is encoded.
#[cfg(all(feature = "metal", target_os = "macos"))]
pub struct MetalTarget<'a> {
    pub enc: &'a mut crate::metal::mlx_native::CommandEncoder,
    pub arena: &'a mut crate::metal::Arena,
    pub aux: &'a crate::metal::NodeAux,
}

#[cfg(all(feature = "metal", target_os = "macos"))]
impl Kernels for crate::metal::MetalKernels {
    type Tensor = crate::metal::MetalTensor;
    type Target<'a> = MetalTarget<'a>;

    fn supports(&self, node: &OpNode) -> Result<(), OpError> {
        crate::metal::supports(node)
    }

    unsafe fn launch(
        &self,
        t: &mut MetalTarget<'_>,
        node: &OpNode,
        ins: &[Self::Tensor],
        outs: &[Self::Tensor],
    ) -> Result<(), OpError> {
        self.encode(t.enc, t.arena, node, ins, outs, t.aux)
    }
}
