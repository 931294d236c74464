//! Recording sessions: the [`Recorder`] model code records into, and the
//! path from a recording to submitted command buffers.

use crate::counters::LiveCounters;
use crate::executor::GraphExecutor;
use crate::plan::StepPlan;
use crate::pool::PoolScope;
use crate::submission::InFlight;
use crate::threadpool::{Job, Level, PreparedNode};
use crate::trace::host_slice;
use crate::RuntimeError;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;
use weft_graph::cut::cut;
use weft_graph::reorder::{schedule, schedule_by, Strategy};
use weft_graph::{baseline, checker, BufferId, ByteRange, Label, Node, Schedule};
use weft_kernels::cpu::{self, HostTensor};
use weft_ops::{DType, OpError, OpNode, Recorder, Tensor};

/// How a session turns its recording into levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionMode {
    /// Recorded order; a barrier only where needed (and where asked for).
    Eager,
    /// Levels from the reorder pass (unless the executor's `reorder` is off).
    Recorded,
}

/// The buffers a CUDA command buffer points into, by id.
#[cfg(feature = "cuda")]
type UsedBuffers = Vec<(BufferId, Arc<crate::memory::Storage>)>;

/// Measured time of one node (from `finish_with_timing`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct NodeTiming {
    pub op: &'static str,
    pub label: String,
    pub layer: Option<u32>,
    pub command_buffer: usize,
    pub level: u32,
    /// From the first piece's start to the last piece's end.
    pub micros: f64,
}

/// An open recording. Dropping it unfinished discards what it recorded.
pub struct GraphSession<'e> {
    exec: &'e mut GraphExecutor,
    mode: SessionMode,
    nodes: Vec<Node>,
    payloads: Vec<OpNode>,
    fences: Vec<bool>,
    layer: Option<u32>,
    fence_next: bool,
    scope_depth: usize,
    /// When recording began, and open pool scopes (for traces).
    started: Instant,
    open_scopes: Vec<(PoolScope, Instant)>,
}

impl<'e> GraphSession<'e> {
    pub(crate) fn new(exec: &'e mut GraphExecutor, mode: SessionMode) -> Self {
        let scope_depth = exec.pools.depth();
        // Only scopes this session ends count as dead for its fusion pass.
        exec.pools.take_ended();
        // Steps repeat: room for as many nodes as the last recording had.
        let room = exec.last_recording_len;
        Self {
            exec,
            mode,
            nodes: Vec::with_capacity(room),
            payloads: Vec::with_capacity(room),
            fences: Vec::with_capacity(room),
            layer: None,
            fence_next: false,
            scope_depth,
            started: Instant::now(),
            open_scopes: Vec::new(),
        }
    }

    pub fn mode(&self) -> SessionMode {
        self.mode
    }

    /// The layer the next nodes belong to (for command-buffer cuts and dumps).
    pub fn set_layer(&mut self, layer: Option<u32>) {
        self.layer = layer;
    }

    /// Nodes recorded so far.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The executor behind this session.
    pub fn executor(&mut self) -> &mut GraphExecutor {
        self.exec
    }

    /// An explicit barrier. Eager sessions honour it (a barrier before any
    /// node is a no-op); recorded sessions derive barriers from ranges and
    /// ignore it.
    pub fn barrier(&mut self) {
        if self.mode == SessionMode::Eager && !self.nodes.is_empty() {
            self.fence_next = true;
        }
    }

    /// Marks `t` as a named intermediate. When the executor collects taps
    /// (diagnostics: tensor dumps, reference comparisons), a copy into a
    /// buffer of its own is recorded and handed back by
    /// [`GraphExecutor::take_taps`] after the step; otherwise nothing happens.
    /// `name` is only formatted when taps are collected.
    pub fn tap(&mut self, name: impl std::fmt::Display, t: Tensor) -> Result<(), RuntimeError> {
        if self.exec.taps.is_none() {
            return Ok(());
        }
        let name = name.to_string();
        let copy = self
            .exec
            .alloc_tensor(DType::F32, t.shape.dims(), &format!("tap.{name}"))?;
        let node = OpNode::new(weft_ops::Op::Copy, vec![t], vec![copy]);
        let (reads, writes) = node.ranges();
        self.record_with_ranges(
            node,
            format!("tap.{name}").into(),
            Some(reads),
            Some(writes),
        )?;
        if let Some(taps) = self.exec.taps.as_mut() {
            taps.push((name.to_string(), copy));
        }
        Ok(())
    }

    /// Opens a pool scope; tensors allocated until the matching
    /// [`end_pool_scope`](Self::end_pool_scope) are recycled when it ends.
    pub fn begin_pool_scope(&mut self, kind: PoolScope) {
        self.exec.pools.begin(kind);
        self.open_scopes.push((kind, Instant::now()));
    }

    /// Ends the innermost scope opened in this session.
    pub fn end_pool_scope(&mut self) -> Result<PoolScope, RuntimeError> {
        if self.exec.pools.depth() <= self.scope_depth {
            return Err(RuntimeError::Usage(
                "end_pool_scope without a matching begin_pool_scope in this session".into(),
            ));
        }
        let kind = self
            .exec
            .pools
            .end_explicit()
            .ok_or_else(|| RuntimeError::Usage("no pool scope is open".into()))?;
        if let (Some((k, start)), Some(state)) = (self.open_scopes.pop(), &self.exec.trace) {
            let args = serde_json::json!({"bytes_in_use": self.exec.pools.stats.in_use});
            host_slice(
                &state.host,
                self.exec.epoch,
                start,
                &format!("pool scope {k:?}"),
                "pool",
                args,
            );
        }
        Ok(kind)
    }

    /// Records `node` with explicit ranges. `None` means "unknown": refused
    /// in a recorded session (naming the op and label); in an eager session
    /// the node gets a barrier before and after it.
    pub fn record_with_ranges(
        &mut self,
        node: OpNode,
        label: Label,
        reads: Option<Vec<ByteRange>>,
        writes: Option<Vec<ByteRange>>,
    ) -> Result<(), RuntimeError> {
        node.validate()?;
        self.record_validated(node, label, reads, writes)
    }

    /// `record_with_ranges` for a node that already passed `validate`.
    fn record_validated(
        &mut self,
        node: OpNode,
        label: Label,
        reads: Option<Vec<ByteRange>>,
        writes: Option<Vec<ByteRange>>,
    ) -> Result<(), RuntimeError> {
        let unknown = reads.is_none() || writes.is_none();
        let (reads, writes) = match (self.mode, unknown) {
            (SessionMode::Recorded, _) | (SessionMode::Eager, false) => (reads, writes),
            (SessionMode::Eager, true) => {
                let (r, w) = node.ranges();
                (Some(r), Some(w))
            }
        };
        let graph_node = Node::checked(node.op.name(), label, self.layer, reads, writes)?;
        self.check_memory(&node, &graph_node)?;
        self.supports(&node)?;
        self.fences.push(self.fence_next || unknown);
        self.fence_next = unknown;
        self.nodes.push(graph_node);
        self.payloads.push(node);
        Ok(())
    }

    /// Does the executor's device implement `node`?
    fn supports(&self, node: &OpNode) -> Result<(), RuntimeError> {
        #[cfg(feature = "cuda")]
        if let Some(cuda) = &self.exec.cuda {
            if matches!(node.op, weft_ops::Op::Write { .. }) {
                return Ok(());
            }
            return Ok(cuda.kernels.supports(node)?);
        }
        #[cfg(all(feature = "metal", target_os = "macos"))]
        if let Some(metal) = &self.exec.metal {
            return Ok(metal.kernels.supports(node)?);
        }
        Ok(cpu::supports(node)?)
    }

    /// Every tensor lies inside a live buffer; nothing writes read-only memory;
    /// declared ranges cover the tensors (so kernels cannot touch undeclared bytes).
    fn check_memory(&self, node: &OpNode, graph_node: &Node) -> Result<(), RuntimeError> {
        for t in node.inputs.iter().chain(&node.outputs) {
            let e = self.exec.entry(t.buffer)?;
            if t.offset + t.bytes() > e.storage.len() as u64 {
                return Err(OpError::Record(format!(
                    "`{}` ({}): tensor {t:?} runs past the end of buffer `{}` ({} bytes)",
                    node.op.name(),
                    graph_node.label,
                    e.name,
                    e.storage.len()
                ))
                .into());
            }
        }
        for w in &graph_node.writes {
            let e = self.exec.entry(w.buffer)?;
            if !e.storage.writable() {
                return Err(OpError::Record(format!(
                    "`{}` ({}) writes read-only buffer `{}`",
                    node.op.name(),
                    graph_node.label,
                    e.name
                ))
                .into());
            }
        }
        let covered = |t: &Tensor, ranges: &[ByteRange]| {
            let r = t.range();
            ranges
                .iter()
                .any(|x| x.buffer == r.buffer && x.start <= r.start && r.end <= x.end)
        };
        let inputs_ok = node.inputs.iter().all(|t| covered(t, &graph_node.reads));
        if !inputs_ok && self.mode == SessionMode::Recorded && node.op.attention_params().is_none()
        {
            return Err(OpError::Record(format!(
                "`{}` ({}): declared reads do not cover its inputs",
                node.op.name(),
                graph_node.label
            ))
            .into());
        }
        Ok(())
    }

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
        let jobs = inflight.jobs.clone();
        #[cfg(feature = "cuda")]
        let works = inflight.cuda.clone();
        inflight.wait()?;
        #[allow(unused_mut)]
        let mut timings = collect_timings(&jobs);
        #[cfg(feature = "cuda")]
        for (cb, w) in works.iter().enumerate() {
            timings.extend(
                w.node_spans(cb as u64, 0.0)
                    .into_iter()
                    .map(|t| NodeTiming {
                        op: t.op,
                        label: t.label,
                        layer: t.layer,
                        command_buffer: cb,
                        level: t.level,
                        micros: t.dur_us,
                    }),
            );
        }
        Ok(timings)
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
        let exec: &GraphExecutor = self.exec;
        let supports = |n: &OpNode| {
            #[cfg(feature = "cuda")]
            if let Some(cuda) = &exec.cuda {
                return cuda.kernels.supports(n).is_ok();
            }
            #[cfg(all(feature = "metal", target_os = "macos"))]
            if let Some(metal) = &exec.metal {
                return metal.kernels.supports(n).is_ok();
            }
            let _ = exec;
            cpu::supports(n).is_ok()
        };
        let check = exec.config.check_schedules;
        crate::fusion::fuse(
            &mut self.nodes,
            &mut self.payloads,
            dead,
            &supports,
            check,
            widen,
        )
    }

    fn end_scopes(&mut self) {
        while self.exec.pools.depth() > self.scope_depth {
            self.exec.pools.end();
        }
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
        #[cfg(feature = "cuda")]
        if let Some(cuda) = self.exec.cuda.clone() {
            return self.submit_cuda(&cuda, strategy, timed, submit_start);
        }
        #[cfg(all(feature = "metal", target_os = "macos"))]
        let metal = self.exec.metal.is_some();
        #[cfg(not(all(feature = "metal", target_os = "macos")))]
        let metal = false;
        let dead = self.exec.pools.take_ended();
        // Recorded CPU steps are scheduled on position-independent ranges
        // too, and reuse a recent step's plan (fusion and schedule).
        let widened = self.mode == SessionMode::Recorded && !metal;
        let plannable = self.widen_for_plans(widened, timed);
        let mut snapshot = None;
        if plannable {
            if let Some(plan) = self.take_plan(&dead, strategy, |_| true) {
                return self.reuse_plan(plan, |session, plan| {
                    if session.exec.config.check_schedules {
                        let supports = |n: &OpNode| cpu::supports(n).is_ok();
                        session.check_plan_core(plan, &dead, strategy, &supports)?;
                    }
                    session.replay_plan_cpu(plan)
                });
            }
            snapshot = Some(self.snapshot());
        }
        let (merges, s, mut payloads) = self.fuse_and_schedule(&dead, widened, strategy)?;
        let submit_start = (submit_start, Instant::now());
        #[cfg(all(feature = "metal", target_os = "macos"))]
        if let Some(metal) = self.exec.metal.clone() {
            return self.submit_metal(&metal, s, &mut payloads);
        }
        let jobs = self.prepare_jobs(&s, &mut payloads, timed, None)?;
        if let Some(snapshot) = snapshot {
            let plan = self.new_plan(snapshot, dead, strategy, merges, &s);
            self.keep_plan(plan);
        }
        let inflight = self.finish_cpu(jobs, &s, Some(submit_start));
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
        !timed && widened && self.exec.config.fault.is_none()
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
        if self.exec.config.graph_diag {
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
        if self.exec.config.graph_diag {
            print_diag(&plan.schedule);
        }
        crate::fusion::replay(std::mem::take(&mut self.payloads), &plan.merges).ok_or_else(|| {
            RuntimeError::Usage("a step plan's fusion does not apply to an equal recording".into())
        })
    }

    /// CPU jobs for every command buffer of `s`.
    fn prepare_jobs(
        &mut self,
        s: &Schedule,
        payloads: &mut [Option<OpNode>],
        timed: bool,
        labels: Option<&[(Label, Option<u32>)]>,
    ) -> Result<Vec<Arc<Job>>, RuntimeError> {
        let failed = Arc::new(AtomicBool::new(false));
        s.command_buffers
            .iter()
            .map(|cb| {
                Ok(Arc::new(
                    self.prepare_job(cb, payloads, &failed, timed, labels)?,
                ))
            })
            .collect()
    }

    /// Runs a plan's schedule on the CPU with this recording's payloads.
    fn replay_plan_cpu(&mut self, plan: &StepPlan) -> Result<InFlight, RuntimeError> {
        let payloads = self.replayed_payloads(plan)?;
        let mut payloads: Vec<Option<OpNode>> = payloads.into_iter().map(Some).collect();
        let jobs = self.prepare_jobs(&plan.schedule, &mut payloads, false, Some(&plan.labels))?;
        LiveCounters::add(&self.exec.counters.planned_commits, 1);
        Ok(self.finish_cpu(jobs, &plan.schedule, None))
    }

    /// Submits CPU jobs: counters, the worker pool, pool scopes, the trace.
    fn finish_cpu(
        &mut self,
        jobs: Vec<Arc<Job>>,
        s: &Schedule,
        submit_start: Option<(Instant, Instant)>,
    ) -> InFlight {
        let counters = Arc::clone(&self.exec.counters);
        LiveCounters::add(&counters.commits, 1);
        LiveCounters::add(&counters.command_buffers, jobs.len() as u64);
        for job in &jobs {
            self.exec.pool.submit(Arc::clone(job));
        }
        self.exec.last_jobs = jobs.clone();
        self.end_scopes();
        let trace = submit_start.and_then(|at| self.note_trace(&jobs, s, at));
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

    /// The CUDA path of `submit`: each command buffer becomes a graph
    /// launch. A recording of the structure the last one had reuses its
    /// plan (fusion, schedule, graphs; see `plan`).
    #[cfg(feature = "cuda")]
    fn submit_cuda(
        mut self,
        cuda: &Arc<crate::cuda::CudaBackend>,
        strategy: Option<Strategy>,
        timed: bool,
        submit_start: Instant,
    ) -> Result<(InFlight, Schedule), RuntimeError> {
        let dead = self.exec.pools.take_ended();
        // CUDA schedules of recorded sessions use position-independent
        // ranges, so timed, traced and planned runs share one schedule.
        let widened = self.mode == SessionMode::Recorded;
        let plannable = self.widen_for_plans(widened, timed);
        let mut snapshot = None;
        if plannable {
            let graphs = |plan: &StepPlan| plan.keys.iter().all(|&k| cuda.has_graph(k));
            if let Some(plan) = self.take_plan(&dead, strategy, graphs) {
                return self.reuse_plan(plan, |session, plan| {
                    if session.exec.config.check_schedules {
                        session.check_plan(cuda, plan, &dead, strategy)?;
                    }
                    session.replay_plan(cuda, plan)
                });
            }
            snapshot = Some(self.snapshot());
        }
        let (merges, s, mut payloads) = self.fuse_and_schedule(&dead, widened, strategy)?;
        let submit_start = (submit_start, Instant::now());
        let mut works = Vec::with_capacity(s.command_buffers.len());
        let mut keys = Vec::with_capacity(s.command_buffers.len());
        let mut keep_alive = Vec::with_capacity(s.command_buffers.len());
        let mut buffers = BTreeMap::new();
        for cb in &s.command_buffers {
            let (mut prepared, used) = self.prepare_cuda(cb, &mut payloads, None)?;
            prepared.timed = timed;
            keep_alive.push(prepared.keep_alive.clone());
            buffers.extend(used);
            let (work, key) = cuda.submit(prepared);
            works.push(work);
            keys.push(key);
            self.count_command_buffer(cb);
        }
        let keys: Option<Vec<u64>> = keys.into_iter().collect();
        if let (Some(snapshot), Some(keys)) = (snapshot, keys) {
            let plan = StepPlan {
                keys,
                keep_alive,
                buffers: buffers.into_iter().collect(),
                ..self.new_plan(snapshot, dead, strategy, merges, &s)
            };
            self.keep_plan(plan);
        }
        Ok((self.finish_cuda(works, &s, Some(submit_start)), s))
    }

    /// Replays a plan's graphs with this recording's step values.
    #[cfg(feature = "cuda")]
    fn replay_plan(
        &mut self,
        cuda: &Arc<crate::cuda::CudaBackend>,
        plan: &StepPlan,
    ) -> Result<InFlight, RuntimeError> {
        let payloads = self.replayed_payloads(plan)?;
        let mut works = Vec::with_capacity(plan.keys.len());
        let mut values = Vec::new();
        for (k, cb) in plan.schedule.command_buffers.iter().enumerate() {
            values.clear();
            let mut writes = Vec::new();
            for (at, &i) in cb.order.iter().enumerate() {
                let node = &payloads[i];
                values.extend(cuda.kernels.step_scalars(node));
                if let weft_ops::Op::Write { data } = &node.op {
                    writes.push((at, &data[..]));
                }
            }
            let work = cuda
                .replay(plan.keys[k], &values, &writes, plan.keep_alive[k].clone())
                .ok_or_else(|| RuntimeError::Usage("a step plan's graph was dropped".into()))?;
            works.push(work);
            self.count_command_buffer(cb);
        }
        LiveCounters::add(&self.exec.counters.planned_commits, 1);
        Ok(self.finish_cuda(works, &plan.schedule, None))
    }

    /// Checking mode (tests, debug builds): the plan must be exactly what
    /// fusion, the reorder pass and graph preparation make of this
    /// recording: the same merges and schedule, the merges' replay equal to
    /// a fresh fusion, and the same graph per command buffer.
    #[cfg(feature = "cuda")]
    fn check_plan(
        &mut self,
        cuda: &Arc<crate::cuda::CudaBackend>,
        plan: &StepPlan,
        dead: &HashSet<BufferId>,
        strategy: Option<Strategy>,
    ) -> Result<(), RuntimeError> {
        let supports = |n: &OpNode| cuda.kernels.supports(n).is_ok();
        let (nodes, payloads, fresh) = self.check_plan_core(plan, dead, strategy, &supports)?;
        // The graphs: prepare the fresh command buffers and compare keys.
        let labels = node_labels(&nodes);
        let mut fresh_payloads: Vec<Option<OpNode>> = payloads.into_iter().map(Some).collect();
        let mut keys = Vec::with_capacity(fresh.command_buffers.len());
        for cb in &fresh.command_buffers {
            let (prepared, _) = self.prepare_cuda(cb, &mut fresh_payloads, Some(&labels))?;
            keys.push(cuda.key_of(&prepared));
        }
        if keys != plan.keys {
            return Err(plan_differs("graph preparation"));
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn count_command_buffer(&self, cb: &weft_graph::CommandBufferSchedule) {
        let c = &self.exec.counters;
        LiveCounters::add(&c.dispatches, cb.nodes.len() as u64);
        LiveCounters::add(&c.barriers, cb.level_count().saturating_sub(1) as u64);
    }

    /// Counters, pool scopes and the trace after a CUDA submission.
    #[cfg(feature = "cuda")]
    fn finish_cuda(
        &mut self,
        works: Vec<Arc<crate::cuda::CudaWork>>,
        s: &Schedule,
        submit_start: Option<(Instant, Instant)>,
    ) -> InFlight {
        let counters = Arc::clone(&self.exec.counters);
        LiveCounters::add(&counters.commits, 1);
        LiveCounters::add(&counters.command_buffers, works.len() as u64);
        self.end_scopes();
        // The host track (record, fuse + schedule, submit, drain); the
        // device's streams come from the timed works when the trace is taken.
        let trace = submit_start.and_then(|at| self.note_trace(&[], s, at));
        if let Some(state) = self.exec.trace.as_mut() {
            let first = state.next_cb;
            for (k, w) in works.iter().enumerate() {
                state.cuda.push((first + k as u64, Arc::clone(w)));
            }
            state.next_cb += works.len() as u64;
        }
        InFlight {
            jobs: Vec::new(),
            cuda: works,
            #[cfg(all(feature = "metal", target_os = "macos"))]
            metal: Vec::new(),
            counters,
            trace,
        }
    }

    /// The Metal path of `submit`: each command buffer becomes one Metal
    /// command buffer (one concurrent compute encoder, a memory barrier
    /// between levels), committed without waiting.
    #[cfg(all(feature = "metal", target_os = "macos"))]
    fn submit_metal(
        mut self,
        metal: &Arc<crate::metal::MetalBackend>,
        s: Schedule,
        payloads: &mut [Option<OpNode>],
    ) -> Result<(InFlight, Schedule), RuntimeError> {
        use crate::counters::LiveCounters;
        let mut works = Vec::with_capacity(s.command_buffers.len());
        for cb in &s.command_buffers {
            let faults: Vec<bool> = cb
                .order
                .iter()
                .map(|&i| {
                    let label = self.nodes[i].label.to_string();
                    self.take_fault(&label)
                })
                .collect();
            let prepared = crate::metal::prepare(self.exec, &self.nodes, cb, payloads, &faults)?;
            let (work, barriers) = metal.submit(prepared);
            works.push(work);
            LiveCounters::add(&self.exec.counters.dispatches, cb.order.len() as u64);
            LiveCounters::add(&self.exec.counters.barriers, barriers);
        }
        let counters = Arc::clone(&self.exec.counters);
        LiveCounters::add(&counters.commits, 1);
        LiveCounters::add(&counters.command_buffers, works.len() as u64);
        self.end_scopes();
        let inflight = InFlight {
            jobs: Vec::new(),
            #[cfg(feature = "cuda")]
            cuda: Vec::new(),
            metal: works,
            counters,
            trace: None,
        };
        Ok((inflight, s))
    }

    #[cfg(feature = "cuda")]
    /// `labels`: the nodes' labels and layers by index, when they are not
    /// this session's (as in [`prepare_job`](Self::prepare_job)).
    fn prepare_cuda(
        &mut self,
        cb: &weft_graph::CommandBufferSchedule,
        payloads: &mut [Option<OpNode>],
        labels: Option<&[(Label, Option<u32>)]>,
    ) -> Result<(crate::cuda::CudaCommandBuffer, UsedBuffers), RuntimeError> {
        use weft_kernels::cuda::DeviceTensor;
        let mut keep = BTreeMap::new();
        let mut nodes = Vec::with_capacity(cb.order.len());
        // Buffers some node of this command buffer, or of any before it,
        // writes: every other input (the weights) is constant while it runs
        // (DeviceTensor::constant).
        for &i in &cb.order {
            for t in payloads[i].iter().flat_map(|n| &n.outputs) {
                if let Some(Some(e)) = self.exec.buffers.get_mut(t.buffer.0 as usize) {
                    e.written = true;
                }
            }
        }
        for &i in &cb.order {
            let node = payloads[i]
                .take()
                .ok_or_else(|| RuntimeError::Usage(format!("node {i} scheduled twice")))?;
            let mut resolve = |t: &Tensor| -> Result<DeviceTensor, RuntimeError> {
                let e = self.exec.entry(t.buffer)?;
                keep.entry(t.buffer)
                    .or_insert_with(|| Arc::clone(&e.storage));
                let base = e.storage.device_ptr().ok_or_else(|| {
                    RuntimeError::Usage(format!(
                        "buffer `{}` is host memory on a CUDA executor",
                        e.name
                    ))
                })?;
                Ok(DeviceTensor {
                    ptr: base + t.offset,
                    tensor: *t,
                    constant: !e.written,
                })
            };
            let mut ins = node
                .inputs
                .iter()
                .map(&mut resolve)
                .collect::<Result<Vec<_>, _>>()?;
            let outs = node
                .outputs
                .iter()
                .map(&mut resolve)
                .collect::<Result<Vec<_>, _>>()?;
            // Decode replays: attention sees the whole cache; the visible
            // extent comes from the step scalars.
            if let Some(p) = node.op.attention_params() {
                if p.kv_capacity as usize > ins[1].tensor.rows() {
                    for t in &mut ins[1..3] {
                        let dims = [p.kv_capacity as usize, t.tensor.cols()];
                        t.tensor = Tensor::new(
                            t.tensor.buffer,
                            t.tensor.offset,
                            t.tensor.dtype,
                            weft_ops::Shape::new(&dims),
                        )?;
                    }
                }
            }
            let (label, layer) = self.label_of(i, labels);
            let label = label.to_string();
            let fail = self.take_fault(&label);
            nodes.push(crate::cuda::CudaNode {
                node,
                ins,
                outs,
                label,
                layer,
                fail,
            });
        }
        let levels = (0..cb.level_count())
            .map(|l| cb.level_starts[l]..cb.level_starts[l + 1])
            .collect();
        let used: Vec<_> = keep.into_iter().collect();
        let cb = crate::cuda::CudaCommandBuffer {
            nodes,
            levels,
            keep_alive: used.iter().map(|(_, s)| Arc::clone(s)).collect(),
            timed: false,
        };
        Ok((cb, used))
    }

    /// While tracing: host slices for recording and submission, and the
    /// jobs kept for the trace.
    fn note_trace(
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

    fn prepare_job(
        &mut self,
        cb: &weft_graph::CommandBufferSchedule,
        payloads: &mut [Option<OpNode>],
        failed: &Arc<AtomicBool>,
        timed: bool,
        labels: Option<&[(Label, Option<u32>)]>,
    ) -> Result<Job, RuntimeError> {
        let threads = self.exec.threads();
        let mut keep = BTreeMap::new();
        let mut prepared = Vec::with_capacity(cb.order.len());
        for &i in &cb.order {
            let node = payloads[i]
                .take()
                .ok_or_else(|| RuntimeError::Usage(format!("node {i} scheduled twice")))?;
            let mut resolve = |t: &Tensor| -> Result<HostTensor, RuntimeError> {
                let e = self.exec.entry(t.buffer)?;
                keep.entry(t.buffer)
                    .or_insert_with(|| Arc::clone(&e.storage));
                let base = e.storage.host_ptr().ok_or_else(|| {
                    RuntimeError::Usage(format!(
                        "buffer `{}` is device memory on a CPU executor",
                        e.name
                    ))
                })?;
                // SAFETY: the offset was checked against the buffer's length when recorded.
                let ptr = unsafe { base.add(t.offset as usize) };
                Ok(HostTensor { ptr, tensor: *t })
            };
            let ins = node
                .inputs
                .iter()
                .map(&mut resolve)
                .collect::<Result<Vec<_>, _>>()?;
            let outs = node
                .outputs
                .iter()
                .map(&mut resolve)
                .collect::<Result<Vec<_>, _>>()?;
            let split = cpu::work_split_for(&node, threads, self.exec.config.numerics);
            let (label, layer) = self.label_of(i, labels);
            let fail = self.take_fault(&label);
            prepared.push(PreparedNode {
                node,
                ins,
                outs,
                split,
                label,
                layer,
                fail,
            });
        }
        let levels = (0..cb.level_count())
            .map(|l| Level::new(cb.level_starts[l]..cb.level_starts[l + 1], &prepared))
            .collect();
        Ok(Job::new(
            prepared,
            levels,
            keep.into_values().collect(),
            Arc::clone(failed),
            timed,
            self.exec.epoch,
        ))
    }

    /// Node `i`'s label and layer: from `labels` when given, else this
    /// session's node.
    fn label_of(&self, i: usize, labels: Option<&[(Label, Option<u32>)]>) -> (Label, Option<u32>) {
        match labels {
            Some(l) => l[i].clone(),
            None => (self.nodes[i].label.clone(), self.nodes[i].layer),
        }
    }

    fn take_fault(&mut self, label: &str) -> bool {
        let Some(f) = &self.exec.config.fault else {
            return false;
        };
        if !label.contains(f.label.as_str()) {
            return false;
        }
        let hit = self.exec.fault_seen == f.after;
        self.exec.fault_seen += 1;
        if hit {
            self.exec.config.fault = None;
            self.exec.fault_seen = 0;
        }
        hit
    }
}

impl Recorder for GraphSession<'_> {
    fn alloc(&mut self, dtype: DType, dims: &[usize]) -> Result<Tensor, OpError> {
        self.exec
            .pool_alloc(dtype, dims)
            .map_err(|e| OpError::Record(e.to_string()))
    }

    fn record(&mut self, node: OpNode, label: Label) -> Result<(), OpError> {
        let (reads, writes) = node.ranges();
        self.record_validated(node, label, Some(reads), Some(writes))
            .map_err(|e| match e {
                RuntimeError::Op(op) => op,
                other => OpError::Record(other.to_string()),
            })
    }
}

impl Drop for GraphSession<'_> {
    /// Dropping an unfinished session discards its recording (nothing was
    /// submitted) and closes the pool scopes it opened.
    fn drop(&mut self) {
        self.end_scopes();
    }
}

fn collect_timings(jobs: &[Arc<Job>]) -> Vec<NodeTiming> {
    let mut out = Vec::new();
    for (cb, job) in jobs.iter().enumerate() {
        let mut spans: Vec<Option<(f64, f64)>> = vec![None; job.nodes.len()];
        for ev in job.events.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let (s, e) = (ev.start.as_secs_f64(), ev.end.as_secs_f64());
            let span = spans[ev.node].get_or_insert((s, e));
            span.0 = span.0.min(s);
            span.1 = span.1.max(e);
        }
        for (li, level) in job.levels.iter().enumerate() {
            for n in level.nodes.clone() {
                let node = &job.nodes[n];
                out.push(NodeTiming {
                    op: node.node.op.name(),
                    label: node.label.to_string(),
                    layer: node.layer,
                    command_buffer: cb,
                    level: li as u32,
                    micros: spans[n].map_or(0.0, |(s, e)| (e - s) * 1e6),
                });
            }
        }
    }
    out
}

/// Labels and layers of `nodes`, by index.
fn node_labels(nodes: &[Node]) -> Vec<(Label, Option<u32>)> {
    nodes.iter().map(|n| (n.label.clone(), n.layer)).collect()
}

fn plan_differs(what: &str) -> RuntimeError {
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
    if config.check_schedules {
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
