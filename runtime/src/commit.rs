//! The commit path of a session, the same for every device: widen the
//! ranges, look up a kept step plan, fuse, schedule, check, and hand the
//! command buffers to the executor's backend (`backend.rs`).

use crate::counters::LiveCounters;
use crate::cpu::threadpool::Job;
use crate::plan::StepPlan;
use crate::session::{GraphSession, NodeTiming, SessionMode};
use crate::submission::InFlight;
use crate::trace::host_slice;
use crate::RuntimeError;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;
use weft_graph::cut::cut;
use weft_graph::reorder::{schedule, schedule_by, Strategy};
use weft_graph::{baseline, checker, BufferId, Label, Node, Schedule};
use weft_ops::OpNode;

impl GraphSession<'_> {
    /// Schedules, checks and submits everything recorded; returns at once.
    pub fn commit(self) -> Result<InFlight, RuntimeError> {
        let strategy = match self.mode {
            SessionMode::Recorded if self.exec.config.reorder => Some(Strategy::Reorder),
            SessionMode::Recorded => Some(Strategy::RecordedOrder),
            SessionMode::Eager => None,
        };
        self.submit(strategy, false).map(|(inflight, _)| inflight)
    }

    /// Commits and waits.
    pub fn finish(self) -> Result<(), RuntimeError> {
        self.commit()?.wait()
    }

    /// Schedules with the reorder pass, runs, waits; returns
    /// `(reordered nodes, barriers)` like hf2q's API.
    pub fn finish_with_reorder(self) -> Result<(usize, usize), RuntimeError> {
        if self.mode != SessionMode::Recorded {
            return Err(RuntimeError::Usage("finish_with_reorder() needs a session from begin_recorded(); begin() runs in recorded order".into()));
        }
        let (inflight, s) = self.submit(Some(Strategy::Reorder), false)?;
        inflight.wait()?;
        Ok((s.reordered(), s.barriers()))
    }

    /// Runs with per-node timing (the schedule is the same as `commit`'s:
    /// timing never changes it) and returns each node's time.
    pub fn finish_with_timing(self) -> Result<Vec<NodeTiming>, RuntimeError> {
        let strategy = match self.mode {
            SessionMode::Recorded if self.exec.config.reorder => Some(Strategy::Reorder),
            SessionMode::Recorded => Some(Strategy::RecordedOrder),
            SessionMode::Eager => None,
        };
        let (inflight, _) = self.submit(strategy, true)?;
        inflight.wait_timed()
    }

    /// The recording and its schedule, without running anything (for dumps).
    pub fn into_schedule(mut self) -> Result<(Vec<Node>, Schedule), RuntimeError> {
        self.exec.last_recording_len = self.nodes.len();
        let dead = self.exec.pools.take_ended();
        self.run_fusion(&dead, false);
        let s = self.schedule(match self.mode {
            SessionMode::Recorded if self.exec.config.reorder => Some(Strategy::Reorder),
            SessionMode::Recorded => Some(Strategy::RecordedOrder),
            SessionMode::Eager => None,
        })?;
        self.end_scopes();
        Ok((std::mem::take(&mut self.nodes), s))
    }

    /// The schedule of what was recorded under `strategy` (`None`: eager).
    pub fn schedule(&self, strategy: Option<Strategy>) -> Result<Schedule, RuntimeError> {
        schedule_nodes(&self.nodes, &self.fences, &self.exec.config, strategy)
    }

    /// The fusion pass (recorded sessions, unless switched off): merges
    /// node pairs the device has fused ops for. Returns the merges.
    /// `dead`: pool buffers of scopes this session ended.
    /// `widen`: the recording's ranges were widened (CUDA); fused nodes get
    /// widened ranges too.
    fn run_fusion(
        &mut self,
        dead: &HashSet<BufferId>,
        widen: bool,
    ) -> Vec<Vec<crate::fusion::Merge>> {
        if self.mode != SessionMode::Recorded || !self.exec.config.fuse {
            return Vec::new();
        }
        let backend = std::sync::Arc::clone(&self.exec.backend);
        let supports = |n: &OpNode| backend.supports(n).is_ok();
        let check = self.exec.config.diagnostics.check_schedules;
        crate::fusion::fuse(
            &mut self.nodes,
            &mut self.payloads,
            dead,
            &supports,
            check,
            widen,
        )
    }

    /// [`Self::submit_timed`], its host time counted as recording (from
    /// `begin`) and submitting.
    fn submit(
        self,
        strategy: Option<Strategy>,
        timed: bool,
    ) -> Result<(InFlight, Schedule), RuntimeError> {
        let start = Instant::now();
        let counters = Arc::clone(&self.exec.counters);
        LiveCounters::add(
            &counters.record_ns,
            (start - self.started).as_nanos() as u64,
        );
        let result = self.submit_timed(strategy, timed, start);
        LiveCounters::add_since(&counters.submit_ns, start);
        result
    }

    fn submit_timed(
        mut self,
        strategy: Option<Strategy>,
        timed: bool,
        submit_start: Instant,
    ) -> Result<(InFlight, Schedule), RuntimeError> {
        let timed = timed || self.exec.trace.is_some();
        self.exec.last_recording_len = self.nodes.len();
        let backend = Arc::clone(&self.exec.backend);
        let dead = self.exec.pools.take_ended();
        // Recorded steps are scheduled on position-independent ranges where
        // the backend reuses plans (fusion, schedule, and on CUDA graphs),
        // so timed, traced and planned runs share one schedule.
        let widened = self.mode == SessionMode::Recorded && backend.plans_steps();
        let plannable = self.widen_for_plans(widened, timed);
        let mut snapshot = None;
        if plannable {
            if let Some(plan) = self.take_plan(&dead, strategy, |p| backend.plan_usable(p)) {
                return self.reuse_plan(plan, |session, plan| {
                    if session.exec.config.diagnostics.check_schedules {
                        let supports = |n: &OpNode| backend.supports(n).is_ok();
                        let (nodes, payloads, fresh) =
                            session.check_plan_core(plan, &dead, strategy, &supports)?;
                        backend.check_plan(session, plan, &nodes, payloads, &fresh)?;
                    }
                    let payloads = session.replayed_payloads(plan)?;
                    backend.replay(session, plan, payloads)
                });
            }
            snapshot = Some(self.snapshot());
        }
        let (merges, s, mut payloads) = self.fuse_and_schedule(&dead, widened, strategy)?;
        let submit_start = (submit_start, Instant::now());
        let (inflight, parts) =
            backend.submit(&mut self, &s, &mut payloads, timed, submit_start)?;
        if let (Some(snapshot), Some(parts)) = (snapshot, parts) {
            let plan = StepPlan {
                keys: parts.keys,
                keep_alive: parts.keep_alive,
                buffers: parts.buffers,
                ..self.new_plan(snapshot, dead, strategy, merges, &s)
            };
            self.keep_plan(plan);
        }
        Ok((inflight, s))
    }

    /// Widens the recording's ranges when `widened`; says whether the
    /// submission may use and make step plans (not timed: traces and
    /// profiles time other graphs on CUDA; not with fault injection, which
    /// goes by label).
    fn widen_for_plans(&mut self, widened: bool, timed: bool) -> bool {
        if widened {
            for (n, p) in self.nodes.iter_mut().zip(&self.payloads) {
                crate::widen::widen(n, p);
            }
        }
        !timed && widened && self.exec.config.diagnostics.fault.is_none()
    }

    /// Takes the most recent plan this recording matches (and `usable`
    /// accepts) out of the executor's list.
    fn take_plan(
        &mut self,
        dead: &HashSet<BufferId>,
        strategy: Option<Strategy>,
        usable: impl Fn(&StepPlan) -> bool,
    ) -> Option<StepPlan> {
        let found = self.exec.step_plans.iter().position(|plan| {
            plan.matches(
                self.exec,
                &self.nodes,
                &self.payloads,
                &self.fences,
                dead,
                strategy,
            ) && usable(plan)
        })?;
        Some(self.exec.step_plans.remove(found))
    }

    /// Runs `plan` through `run` and keeps it as the most recent plan; a
    /// plan that failed is dropped (the structure's next step takes the
    /// normal path).
    fn reuse_plan(
        &mut self,
        plan: StepPlan,
        run: impl FnOnce(&mut Self, &StepPlan) -> Result<InFlight, RuntimeError>,
    ) -> Result<(InFlight, Schedule), RuntimeError> {
        let inflight = run(self, &plan)?;
        let schedule = plan.schedule.clone();
        self.exec.step_plans.insert(0, plan);
        Ok((inflight, schedule))
    }

    /// Fusion, then the schedule (with `WEFT_GRAPH_DIAG` lines), and the
    /// payloads in slots for the backend to take: the normal path of every
    /// submission.
    #[allow(clippy::type_complexity)]
    fn fuse_and_schedule(
        &mut self,
        dead: &HashSet<BufferId>,
        widened: bool,
        strategy: Option<Strategy>,
    ) -> Result<
        (
            Vec<Vec<crate::fusion::Merge>>,
            Schedule,
            Vec<Option<OpNode>>,
        ),
        RuntimeError,
    > {
        let merges = self.run_fusion(dead, widened);
        let s = self.schedule(strategy)?;
        if self.exec.config.diagnostics.graph_diag {
            print_diag(&s);
        }
        let payloads = std::mem::take(&mut self.payloads)
            .into_iter()
            .map(Some)
            .collect();
        Ok((merges, s, payloads))
    }

    /// The recording as a plan compares it: nodes, payloads, fences.
    fn snapshot(&self) -> (Vec<Node>, Vec<OpNode>, Vec<bool>) {
        (
            self.nodes.clone(),
            self.payloads.clone(),
            self.fences.clone(),
        )
    }

    /// The plan of this submission: the recording as it was before fusion
    /// (`snapshot`), what fusion and scheduling made of it, and the fused
    /// nodes' labels; CUDA adds its graphs' keys.
    fn new_plan(
        &self,
        (nodes, payloads, fences): (Vec<Node>, Vec<OpNode>, Vec<bool>),
        dead: HashSet<BufferId>,
        strategy: Option<Strategy>,
        merges: Vec<Vec<crate::fusion::Merge>>,
        schedule: &Schedule,
    ) -> StepPlan {
        StepPlan {
            nodes,
            payloads,
            fences,
            dead,
            config: self.exec.config.clone(),
            strategy,
            merges,
            schedule: schedule.clone(),
            labels: node_labels(&self.nodes),
            keys: Vec::new(),
            keep_alive: Vec::new(),
            buffers: Vec::new(),
        }
    }

    /// Keeps `plan` as the most recent (the list is bounded).
    fn keep_plan(&mut self, plan: StepPlan) {
        self.exec.step_plans.truncate(crate::plan::MAX_PLANS - 1);
        self.exec.step_plans.insert(0, plan);
    }

    /// This recording's payloads with a plan's merges applied.
    fn replayed_payloads(&mut self, plan: &StepPlan) -> Result<Vec<OpNode>, RuntimeError> {
        if self.exec.config.diagnostics.graph_diag {
            print_diag(&plan.schedule);
        }
        crate::fusion::replay(std::mem::take(&mut self.payloads), &plan.merges).ok_or_else(|| {
            RuntimeError::Usage("a step plan's fusion does not apply to an equal recording".into())
        })
    }

    /// Checking mode (tests, debug builds): the plan must be exactly what
    /// fusion and the reorder pass make of this recording (the same merges
    /// and schedule, and the merges' replay equal to a fresh fusion).
    /// Returns the fresh fused nodes, payloads and schedule.
    fn check_plan_core(
        &self,
        plan: &StepPlan,
        dead: &HashSet<BufferId>,
        strategy: Option<Strategy>,
        supports: &dyn Fn(&OpNode) -> bool,
    ) -> Result<(Vec<Node>, Vec<OpNode>, Schedule), RuntimeError> {
        let (mut nodes, mut payloads) = (self.nodes.clone(), self.payloads.clone());
        let merges = if self.exec.config.fuse {
            crate::fusion::fuse(&mut nodes, &mut payloads, dead, supports, true, true)
        } else {
            Vec::new()
        };
        let fresh = schedule_nodes(&nodes, &self.fences, &self.exec.config, strategy)?;
        if merges != plan.merges || fresh != plan.schedule {
            return Err(plan_differs("fusion and schedule"));
        }
        if crate::fusion::replay(self.payloads.clone(), &plan.merges).as_ref() != Some(&payloads) {
            return Err(plan_differs("fusion (replayed merges)"));
        }
        Ok((nodes, payloads, fresh))
    }

    /// While tracing: host slices for recording and submission, and the
    /// jobs kept for the trace.
    pub(crate) fn note_trace(
        &mut self,
        jobs: &[Arc<Job>],
        s: &Schedule,
        (submit_start, scheduled): (Instant, Instant),
    ) -> Option<(crate::trace::HostSink, Instant)> {
        use crate::trace::host_span;
        let epoch = self.exec.epoch;
        let state = self.exec.trace.as_mut()?;
        let record = serde_json::json!({"nodes": self.nodes.len()});
        host_span(
            &state.host,
            epoch,
            self.started,
            submit_start,
            "record",
            "record",
            record,
        );
        let schedule = serde_json::json!({"nodes after fusion": self.nodes.len(), "barriers": s.barriers(), "reordered": s.reordered()});
        host_span(
            &state.host,
            epoch,
            submit_start,
            scheduled,
            "fuse + schedule",
            "schedule",
            schedule,
        );
        let submit = serde_json::json!({"command_buffers": s.command_buffers.len()});
        host_slice(&state.host, epoch, scheduled, "submit", "submit", submit);
        for job in jobs {
            state.jobs.push((state.next_cb, Arc::clone(job)));
            state.next_cb += 1;
        }
        Some((Arc::clone(&state.host), epoch))
    }
}

/// Labels and layers of `nodes`, by index.
pub(crate) fn node_labels(nodes: &[Node]) -> Vec<(Label, Option<u32>)> {
    nodes.iter().map(|n| (n.label.clone(), n.layer)).collect()
}

pub(crate) fn plan_differs(what: &str) -> RuntimeError {
    RuntimeError::Usage(format!(
        "a reused step plan differs from a fresh {what} of the step"
    ))
}

/// The schedule of `nodes` under `strategy` (`None`: recorded order with
/// `fences`), checked when the configuration says so.
fn schedule_nodes(
    nodes: &[Node],
    fences: &[bool],
    config: &crate::config::ExecutorConfig,
    strategy: Option<Strategy>,
) -> Result<Schedule, RuntimeError> {
    let cuts = cut(nodes, &config.cut);
    let s = match strategy {
        Some(st) => schedule(nodes, &cuts, st),
        None => schedule_by(nodes, &cuts, |slice, range| {
            baseline::recorded_order_levels_fenced(slice, &fences[range])
        }),
    };
    if config.diagnostics.check_schedules {
        checker::check(nodes, &s)?;
    }
    Ok(s)
}

/// `WEFT_GRAPH_DIAG=1`: one line per command buffer on stderr (a closed
/// or full stderr loses the line; it never fails the step).
fn print_diag(s: &Schedule) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    for cb in &s.command_buffers {
        let st = &cb.stats;
        let layers = match (st.first_layer, st.last_layer) {
            (Some(a), Some(b)) => format!("{a}..{b}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            err,
            "[graph] layers={layers} nodes={} levels={} barriers={} reordered={}",
            st.nodes, st.levels, st.barriers, st.reordered
        );
    }
}
