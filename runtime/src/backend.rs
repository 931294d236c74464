//! The seam between the device-independent commit path and the devices.
//!
//! A session records and validates nodes (`session.rs`); its commit
//! (`commit.rs`) widens the ranges, looks up a step plan, fuses, schedules
//! and checks, then hands the scheduled command buffers to the executor's
//! [`Backend`]: the CPU's thread pool (`cpu/`), CUDA graphs (`cuda/`) or
//! Metal command buffers (`metal/`). Each backend answers the questions the
//! commit path asks about its kernels and turns command buffers into work
//! in flight, or replays a kept plan; it also owns the device's memory
//! (allocation, uploads, read-back) for the executor.

use crate::config::ExecutorConfig;
use crate::executor::Device;
use crate::memory::{HostBytes, Storage};
use crate::plan::StepPlan;
use crate::session::GraphSession;
use crate::submission::InFlight;
use crate::trace::{DeviceSpan, TraceState};
use crate::RuntimeError;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_graph::{BufferId, Node, Schedule};
use weft_ops::{OpError, OpNode};

/// What a backend adds to a step plan it can replay: its graphs' keys, the
/// storage they point into, and the buffers they use (empty on the CPU).
#[derive(Default)]
pub(crate) struct PlanParts {
    pub keys: Vec<u64>,
    pub keep_alive: Vec<Vec<Arc<crate::memory::Storage>>>,
    pub buffers: Vec<(BufferId, Arc<crate::memory::Storage>)>,
}

/// One device's side of an executor: its memory and its side of a commit.
pub(crate) trait Backend: Send + Sync {
    /// A zeroed buffer of `len` bytes in the device's memory.
    fn alloc_storage(&self, len: usize, name: &str) -> Result<Storage, RuntimeError>;

    /// Read-only host bytes (a memory-mapped file) as a buffer: wrapped
    /// without a copy where the device reads host memory, else uploaded.
    fn wrap_bytes(&self, bytes: Arc<dyn HostBytes>, name: &str) -> Result<Storage, RuntimeError>;

    /// Waits for everything submitted to the device (host jobs are waited
    /// for by the executor); a failed device is an error.
    fn wait_all(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// Whether bytes can be read while work submitted later still runs.
    fn reads_beside_work(&self) -> bool {
        true
    }

    /// `len` bytes at `offset` of `storage` copied from device memory, as
    /// they are now; `None` when the storage is host-readable.
    fn read_device(
        &self,
        _storage: &Storage,
        _offset: usize,
        _len: usize,
    ) -> Option<Result<Vec<u8>, RuntimeError>> {
        None
    }

    /// `data` written to device memory at `offset` of `storage`; `None`
    /// when the storage is host-writable.
    fn write_device(
        &self,
        _storage: &Storage,
        _offset: u64,
        _data: &[u8],
    ) -> Option<Result<(), RuntimeError>> {
        None
    }

    /// Graph figures: `(captures, replays, eager launches)` (CUDA).
    fn graph_stats(&self) -> Option<(u64, u64, u64)> {
        None
    }

    /// Device time of the command buffers waited for so far (CUDA).
    fn device_busy(&self) -> Option<Duration> {
        None
    }

    /// The device's name, where it has one of its own.
    fn device_name(&self) -> Option<String> {
        None
    }

    /// The device tracks of what `trace` kept (timed device work), on the
    /// executor's clock from `epoch`.
    fn device_spans(&self, _trace: &mut TraceState, _epoch: Instant) -> Vec<DeviceSpan> {
        Vec::new()
    }

    /// Whether the device's kernels run `node` (fusion asks this of the
    /// nodes it would make).
    fn supports(&self, node: &OpNode) -> Result<(), OpError>;

    /// Whether a recorded node is accepted: [`Backend::supports`], and the
    /// nodes the backend carries out itself.
    fn accepts(&self, node: &OpNode) -> Result<(), OpError> {
        self.supports(node)
    }

    /// Whether recorded sessions are scheduled on position-independent
    /// (widened) ranges and reuse step plans.
    fn plans_steps(&self) -> bool;

    /// Whether a kept plan can still be replayed here.
    fn plan_usable(&self, _plan: &StepPlan) -> bool {
        true
    }

    /// Submits the command buffers of `s`, taking each node from
    /// `payloads`; `submit_start` is when submission began and when the
    /// schedule was ready (for traces). Returns the work in flight and,
    /// when the submission can be replayed, the backend's part of its plan.
    fn submit(
        &self,
        session: &mut GraphSession<'_>,
        s: &Schedule,
        payloads: &mut [Option<OpNode>],
        timed: bool,
        submit_start: (Instant, Instant),
    ) -> Result<(InFlight, Option<PlanParts>), RuntimeError>;

    /// Runs a kept plan with this recording's payloads (its merges applied).
    fn replay(
        &self,
        session: &mut GraphSession<'_>,
        plan: &StepPlan,
        payloads: Vec<OpNode>,
    ) -> Result<InFlight, RuntimeError>;

    /// Checking mode: the backend's part of `plan` is what a fresh
    /// preparation of the fresh fusion (`nodes`, `payloads`) and schedule
    /// makes.
    fn check_plan(
        &self,
        _session: &mut GraphSession<'_>,
        _plan: &StepPlan,
        _nodes: &[Node],
        _payloads: Vec<OpNode>,
        _fresh: &Schedule,
    ) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// The backend of `device`; the caller checked that the device is usable
/// ([`Device::unavailable_reason`]).
pub(crate) fn for_device(
    device: Device,
    config: &ExecutorConfig,
) -> Result<Arc<dyn Backend>, RuntimeError> {
    let _ = config;
    match device {
        Device::Cpu => Ok(Arc::new(crate::cpu::CpuBackend)),
        #[cfg(feature = "cuda")]
        Device::Cuda(i) => Ok(Arc::new(crate::cuda::CudaBackend::new(
            i,
            &config.cuda,
            config.numerics,
        )?)),
        #[cfg(all(feature = "metal", target_os = "macos"))]
        Device::Metal => Ok(Arc::new(crate::metal::MetalBackend::new()?)),
        #[allow(unreachable_patterns)]
        other => Err(RuntimeError::Usage(format!(
            "cannot use {other}: this build has no backend for it"
        ))),
    }
}

impl Device {
    /// Why this device cannot be used here, if it cannot (`None`: usable).
    pub fn unavailable_reason(self) -> Option<String> {
        match self {
            Device::Cpu => None,
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => crate::cuda::unavailable_reason(),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Some("weft was built without the `cuda` feature".into()),
            #[cfg(all(feature = "metal", target_os = "macos"))]
            Device::Metal => crate::metal::unavailable_reason(),
            #[cfg(all(feature = "metal", not(target_os = "macos")))]
            Device::Metal => Some("Metal runs only on macOS".into()),
            #[cfg(not(feature = "metal"))]
            Device::Metal => Some("weft was built without the `metal` feature".into()),
        }
    }
}
