//! The CPU backend: each scheduled command buffer becomes a job of the
//! executor's persistent thread pool ([`threadpool`]), its tensors resolved
//! to host pointers every step (so a kept plan replays with nothing but this
//! step's payloads).

mod submit;
pub(crate) mod threadpool;

pub(crate) use submit::collect_timings;

use crate::backend::{Backend, PlanParts};
use crate::counters::LiveCounters;
use crate::memory::{HostBytes, Storage};
use crate::plan::StepPlan;
use crate::session::GraphSession;
use crate::submission::InFlight;
use crate::RuntimeError;
use std::sync::Arc;
use std::time::Instant;
use weft_graph::Schedule;
use weft_kernels::{CpuKernels, Kernels};
use weft_ops::{OpError, OpNode};

/// The host CPU.
pub(crate) struct CpuBackend;

impl Backend for CpuBackend {
    fn alloc_storage(&self, len: usize, name: &str) -> Result<Storage, RuntimeError> {
        Storage::owned(len, name)
    }

    fn wrap_bytes(&self, bytes: Arc<dyn HostBytes>, _name: &str) -> Result<Storage, RuntimeError> {
        Ok(Storage::borrowed(bytes))
    }

    fn supports(&self, node: &OpNode) -> Result<(), OpError> {
        CpuKernels.supports(node)
    }

    fn plans_steps(&self) -> bool {
        true
    }

    fn submit(
        &self,
        session: &mut GraphSession<'_>,
        s: &Schedule,
        payloads: &mut [Option<OpNode>],
        timed: bool,
        submit_start: (Instant, Instant),
    ) -> Result<(InFlight, Option<PlanParts>), RuntimeError> {
        let jobs = session.prepare_jobs(s, payloads, timed, None)?;
        let inflight = session.finish_cpu(jobs, s, Some(submit_start));
        Ok((inflight, Some(PlanParts::default())))
    }

    fn replay(
        &self,
        session: &mut GraphSession<'_>,
        plan: &StepPlan,
        payloads: Vec<OpNode>,
    ) -> Result<InFlight, RuntimeError> {
        let mut payloads: Vec<Option<OpNode>> = payloads.into_iter().map(Some).collect();
        let jobs =
            session.prepare_jobs(&plan.schedule, &mut payloads, false, Some(&plan.labels))?;
        LiveCounters::add(&session.exec.counters.planned_commits, 1);
        Ok(session.finish_cpu(jobs, &plan.schedule, None))
    }
}
