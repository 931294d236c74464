//! The Metal side of the backend seam: shared memory for the executor, and
//! submission: each scheduled command buffer becomes one Metal command
//! buffer (one concurrent compute encoder, a memory barrier between
//! levels), committed without waiting. Metal keeps no step plans.

use super::{prepare, MetalBackend};
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
use weft_kernels::Kernels;
use weft_ops::{OpError, OpNode};

impl Backend for MetalBackend {
    fn alloc_storage(&self, len: usize, name: &str) -> Result<Storage, RuntimeError> {
        Ok(Storage::metal_storage(self.alloc(len, name)?))
    }

    /// Weights are copied into shared memory once.
    fn wrap_bytes(&self, bytes: Arc<dyn HostBytes>, name: &str) -> Result<Storage, RuntimeError> {
        Ok(Storage::metal_storage(
            self.upload(bytes.host_bytes(), name)?,
        ))
    }

    fn wait_all(&self) -> Result<(), RuntimeError> {
        self.synchronize();
        Ok(())
    }

    /// Reads wait for everything.
    fn reads_beside_work(&self) -> bool {
        false
    }

    fn device_name(&self) -> Option<String> {
        Some(self.name())
    }

    fn supports(&self, node: &OpNode) -> Result<(), OpError> {
        Kernels::supports(&self.kernels, node)
    }

    fn plans_steps(&self) -> bool {
        false
    }

    fn submit(
        &self,
        session: &mut GraphSession<'_>,
        s: &Schedule,
        payloads: &mut [Option<OpNode>],
        _timed: bool,
        _submit_start: (Instant, Instant),
    ) -> Result<(InFlight, Option<PlanParts>), RuntimeError> {
        let mut works = Vec::with_capacity(s.command_buffers.len());
        for cb in &s.command_buffers {
            let faults: Vec<bool> = cb
                .order
                .iter()
                .map(|&i| {
                    let label = session.nodes[i].label.to_string();
                    session.take_fault(&label)
                })
                .collect();
            let prepared = prepare(session.exec, &session.nodes, cb, payloads, &faults)?;
            let (work, barriers) = self.enqueue(prepared);
            works.push(work);
            LiveCounters::add(&session.exec.counters.dispatches, cb.order.len() as u64);
            LiveCounters::add(&session.exec.counters.barriers, barriers);
        }
        let counters = Arc::clone(&session.exec.counters);
        LiveCounters::add(&counters.commits, 1);
        LiveCounters::add(&counters.command_buffers, works.len() as u64);
        session.end_scopes();
        let mut inflight = InFlight::new(Vec::new(), counters, None);
        inflight.metal = works;
        Ok((inflight, None))
    }

    fn replay(
        &self,
        _session: &mut GraphSession<'_>,
        _plan: &StepPlan,
        _payloads: Vec<OpNode>,
    ) -> Result<InFlight, RuntimeError> {
        Err(RuntimeError::Usage(
            "the Metal backend keeps no step plans to replay".into(),
        ))
    }
}
