//! In-flight work and submission chains.
//!
//! `commit()` hands back an [`InFlight`] at once; a [`SubmissionChain`] holds
//! several and `drain()` waits on every one of them, in order, always, and
//! reports the first failure (by the label of the node that failed).

use crate::counters::LiveCounters;
use crate::cpu::threadpool::Job;
use crate::session::NodeTiming;
use crate::trace::{host_slice, HostSink};
use crate::RuntimeError;
use std::sync::Arc;
use std::time::Instant;

/// Command buffers of one commit, submitted and possibly still running.
#[must_use = "in-flight work must be waited on (or pushed into a SubmissionChain)"]
pub struct InFlight {
    pub(crate) jobs: Vec<Arc<Job>>,
    /// Device work (CUDA executors).
    #[cfg(feature = "cuda")]
    pub(crate) cuda: Vec<Arc<crate::cuda::CudaWork>>,
    /// Device work (Metal executors).
    #[cfg(all(feature = "metal", target_os = "macos"))]
    pub(crate) metal: Vec<Arc<crate::metal::MetalWork>>,
    pub(crate) counters: Arc<LiveCounters>,
    /// Where to note the drain when tracing.
    pub(crate) trace: Option<(HostSink, Instant)>,
}

impl InFlight {
    /// Host jobs in flight (no device work yet: a device backend adds its
    /// own).
    pub(crate) fn new(
        jobs: Vec<Arc<Job>>,
        counters: Arc<LiveCounters>,
        trace: Option<(HostSink, Instant)>,
    ) -> InFlight {
        InFlight {
            jobs,
            #[cfg(feature = "cuda")]
            cuda: Vec::new(),
            #[cfg(all(feature = "metal", target_os = "macos"))]
            metal: Vec::new(),
            counters,
            trace,
        }
    }

    /// Waits, and returns each node's measured time (a timed submission).
    pub(crate) fn wait_timed(self) -> Result<Vec<NodeTiming>, RuntimeError> {
        let jobs = self.jobs.clone();
        #[cfg(feature = "cuda")]
        let works = self.cuda.clone();
        self.wait()?;
        #[allow(unused_mut)]
        let mut timings = crate::cpu::collect_timings(&jobs);
        #[cfg(feature = "cuda")]
        timings.extend(crate::cuda::node_timings(&works));
        Ok(timings)
    }

    /// Waits for every command buffer of the commit; the first failure wins.
    pub fn wait(self) -> Result<(), RuntimeError> {
        LiveCounters::add(&self.counters.waits, 1);
        let start = Instant::now();
        let result = self.wait_jobs();
        LiveCounters::add_since(&self.counters.wait_ns, start);
        if let Some((sink, epoch)) = &self.trace {
            #[allow(unused_mut)]
            let mut command_buffers = self.jobs.len();
            #[cfg(feature = "cuda")]
            {
                command_buffers += self.cuda.len();
            }
            let args =
                serde_json::json!({"command_buffers": command_buffers, "ok": result.is_ok()});
            host_slice(sink, *epoch, start, "drain", "drain", args);
        }
        result
    }

    fn wait_jobs(&self) -> Result<(), RuntimeError> {
        let mut first = None;
        for job in &self.jobs {
            if let Err(e) = job.wait() {
                first.get_or_insert(e);
            }
        }
        #[cfg(feature = "cuda")]
        for work in &self.cuda {
            if let Err(e) = work.wait() {
                first.get_or_insert(e);
            }
        }
        #[cfg(all(feature = "metal", target_os = "macos"))]
        for work in &self.metal {
            if let Err(e) = work.wait() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// True once everything has run (successfully or not).
    pub fn is_done(&self) -> bool {
        #[cfg(feature = "cuda")]
        if !self.cuda.iter().all(|w| w.is_done()) {
            return false;
        }
        #[cfg(all(feature = "metal", target_os = "macos"))]
        if !self.metal.iter().all(|w| w.is_done()) {
            return false;
        }
        self.jobs.iter().all(|j| j.is_done())
    }

    /// Number of command buffers in this commit.
    pub fn command_buffers(&self) -> usize {
        let device = 0;
        #[cfg(feature = "cuda")]
        let device = device + self.cuda.len();
        #[cfg(all(feature = "metal", target_os = "macos"))]
        let device = device + self.metal.len();
        self.jobs.len() + device
    }
}

/// Handles of submitted work, drained together.
#[derive(Default)]
pub struct SubmissionChain {
    handles: Vec<InFlight>,
}

impl SubmissionChain {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds submitted work to the chain.
    pub fn push(&mut self, handle: InFlight) {
        self.handles.push(handle);
    }

    /// Number of commits waiting to be drained.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Waits on every handle in order, even after a failure, and returns the
    /// first failure.
    pub fn drain(&mut self) -> Result<(), RuntimeError> {
        let mut first = None;
        for h in self.handles.drain(..) {
            if let Err(e) = h.wait() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Drains after an encoding error: both errors are reported if draining fails too.
    pub fn drain_after(&mut self, encode_error: RuntimeError) -> RuntimeError {
        match self.drain() {
            Ok(()) => encode_error,
            Err(second) => RuntimeError::Both {
                first: Box::new(encode_error),
                second: Box::new(second),
            },
        }
    }
}

impl Drop for SubmissionChain {
    /// Dropping a chain still waits for its work: memory the work touches must
    /// outlive it, and an unobserved failure is better late than lost.
    fn drop(&mut self) {
        let _ = self.drain();
    }
}
