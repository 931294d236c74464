//! The seam between the device-independent commit path and the devices.
//!
//! A session records and validates nodes (`session.rs`); its commit
//! (`commit.rs`) widens the ranges, looks up a step plan, fuses, schedules
//! and checks, then hands the scheduled command buffers to the executor's
//! [`Backend`]: the CPU's thread pool (`cpu/`), CUDA graphs (`cuda/`) or
//! Metal command buffers (`metal/`). Each backend answers the questions the
//! commit path asks about its kernels and turns command buffers into work
//! in flight, or replays a kept plan.

use crate::plan::StepPlan;
use crate::session::GraphSession;
use crate::submission::InFlight;
use crate::RuntimeError;
use std::sync::Arc;
use std::time::Instant;
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

/// One device's side of a commit.
pub(crate) trait Backend: Send + Sync {
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
