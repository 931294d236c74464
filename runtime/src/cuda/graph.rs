//! Command buffers on the device: structure signatures, capture into CUDA
//! graphs with one branch per stream inside a level, and replay.

use super::{driver, CudaBackend, DeviceBuffer};
use crate::launches::{LaunchRules, LevelLaunches};
use crate::memory::Storage;
use crate::trace::DeviceSpan;
use crate::RuntimeError;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use weft_kernels::cuda::cudarc::driver::{result, sys, CudaEvent, CudaGraph, PinnedHostSlice};
use weft_kernels::cuda::DeviceTensor;
use weft_kernels::Kernels;
use weft_ops::{Op, OpNode, Tensor};

mod launch;

/// A node resolved to device memory.
pub(crate) struct CudaNode {
    pub node: OpNode,
    pub ins: Vec<DeviceTensor>,
    pub outs: Vec<DeviceTensor>,
    pub label: String,
    pub layer: Option<u32>,
    pub fail: bool,
}

/// One command buffer ready for the device: nodes in execution order, levels.
pub(crate) struct CudaCommandBuffer {
    pub nodes: Vec<CudaNode>,
    pub levels: Vec<Range<usize>>,
    pub keep_alive: Vec<Arc<Storage>>,
    /// Time every node on the device (traces, profiles).
    pub timed: bool,
}

/// Device times of a timed command buffer's nodes (start, end), in
/// microseconds from the backend's clock origin; `None` until collected.
type TimeSlot = Arc<Mutex<Option<Vec<(f64, f64)>>>>;

/// The timing events of a timed graph: an origin on the main stream, a
/// start and an end event around every node, on the node's stream. They
/// are part of the captured graph (event record nodes), so a replay
/// re-records them; the previous replay's times are read before that.
struct NodeClock {
    origin: CudaEvent,
    marks: Vec<(CudaEvent, CudaEvent)>,
    /// The slot of the replay whose times are still in the events.
    pending: Mutex<Option<TimeSlot>>,
}

/// A captured graph and the device memory it reads per replay.
pub(crate) struct CachedGraph {
    /// Each level's launches (the launch pass's output; a replay needs
    /// none of them, so they are planned only when a graph is built).
    launches: Vec<LevelLaunches>,
    graph: Mutex<Option<CudaGraph>>,
    step: DeviceBuffer,
    step_offsets: Vec<usize>,
    step_len: usize,
    staging: Mutex<PinnedHostSlice<u8>>,
    /// Per node: where its host write is staged, and its size.
    write_offsets: Vec<Option<(usize, usize)>>,
    _scratch: DeviceBuffer,
    /// Completion of the previous replay (staging may be rewritten after it).
    last: Mutex<Option<Arc<CudaEvent>>>,
    clock: Option<NodeClock>,
    /// The backend's clock origin (timed graphs).
    origin: Option<Arc<CudaEvent>>,
}

// SAFETY: the graph and pinned staging are only touched under their mutexes;
// device pointers are plain integers.
unsafe impl Send for CachedGraph {}
// SAFETY: as above.
unsafe impl Sync for CachedGraph {}

/// Submitted device work.
pub(crate) struct CudaWork {
    /// Recorded after the launch (also the graph's `last`).
    done: Option<Arc<CudaEvent>>,
    /// Recorded before the launch: with `done`, the command buffer's span
    /// on the device, added to `busy` (nanoseconds) by the first wait.
    start: Option<CudaEvent>,
    busy: Mutex<Option<Arc<AtomicU64>>>,
    error: Mutex<Option<RuntimeError>>,
    _keep_alive: Vec<Arc<Storage>>,
    _graph: Option<Arc<CachedGraph>>,
    /// Timed command buffers: the nodes as a trace shows them (times still
    /// zero) and where their device times land.
    timing: Option<(Vec<DeviceSpan>, TimeSlot)>,
}

// SAFETY: the event is only synchronized on; everything else is plain data.
unsafe impl Send for CudaWork {}
// SAFETY: as above.
unsafe impl Sync for CudaWork {}

impl CudaWork {
    pub(crate) fn wait(&self) -> Result<(), RuntimeError> {
        if let Some(e) = self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        if let Some(ev) = &self.done {
            ev.synchronize().map_err(|e| RuntimeError::Execution {
                op: "cuda",
                label: "command buffer".into(),
                message: format!("{e:?}"),
            })?;
            let busy = self.busy.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let (Some(start), Some(busy)) = (&self.start, busy) {
                // SAFETY: both events are live, timing-enabled and complete.
                if let Ok(ms) = unsafe { result::event::elapsed(start.cu_event(), ev.cu_event()) } {
                    busy.fetch_add((ms as f64 * 1e6) as u64, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.as_ref().is_none_or(|e| e.is_complete())
    }

    /// The device spans of a timed command buffer's nodes, once it ran
    /// (waits for it), as command buffer `cb`, with times counted from
    /// `zero_us` plus the backend's clock origin; empty for untimed or
    /// failed work.
    pub(crate) fn node_spans(&self, cb: u64, zero_us: f64) -> Vec<DeviceSpan> {
        let Some((nodes, slot)) = &self.timing else {
            return Vec::new();
        };
        if self.wait().is_err() {
            return Vec::new();
        }
        if let Some(g) = &self._graph {
            let _ = g.collect_times(Some(slot));
        }
        let times = slot.lock().unwrap_or_else(|p| p.into_inner());
        let Some(times) = times.as_ref() else {
            return Vec::new();
        };
        nodes
            .iter()
            .zip(times)
            .map(|(n, &(start, end))| DeviceSpan {
                command_buffer: cb,
                start_us: zero_us + start,
                dur_us: end - start,
                ..n.clone()
            })
            .collect()
    }

    fn failed(e: RuntimeError, keep_alive: Vec<Arc<Storage>>) -> CudaWork {
        CudaWork {
            done: None,
            start: None,
            busy: Mutex::new(None),
            error: Mutex::new(Some(e)),
            _keep_alive: keep_alive,
            _graph: None,
            timing: None,
        }
    }
}

/// A tensor's place and shape (its bytes are not part of a graph).
fn hash_tensor(t: &Tensor, h: &mut impl Hasher) {
    t.buffer.0.hash(h);
    t.offset.hash(h);
    t.dtype.ggml_id().hash(h);
    t.shape.dims().hash(h);
}

/// Feeds formatted text into a hasher.
struct HashWriter<'a>(&'a mut DefaultHasher);

impl std::fmt::Write for HashWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

/// Captured graphs kept at most (the table is emptied when full).
const MAX_GRAPHS: usize = 64;
/// Signatures remembered for capture-on-second-sight at most.
const MAX_SEEN: usize = 4096;

/// Hash of everything a captured graph depends on.
fn signature(kernels: &weft_kernels::cuda::CudaKernels, cb: &CudaCommandBuffer) -> u64 {
    let mut h = DefaultHasher::new();
    cb.levels.hash(&mut h);
    cb.timed.hash(&mut h);
    for n in &cb.nodes {
        // The op's Debug text, hashed as it is written (no allocation).
        let _ = std::fmt::Write::write_fmt(
            &mut HashWriter(&mut h),
            format_args!("{:?}", kernels.structural(&n.node.op)),
        );
        for t in n.ins.iter().chain(&n.outs) {
            t.ptr.hash(&mut h);
            hash_tensor(&t.tensor, &mut h);
        }
    }
    h.finish()
}

impl CudaBackend {
    /// Runs `cb`: replays its graph when one with the same structure was
    /// captured; captures one when the structure comes a second time;
    /// launches eagerly otherwise (and always with `WEFT_CUDA_GRAPHS=0`).
    /// Also returns the structure's key when a graph of it is cached now
    /// (a later step of the same structure can [`replay_graph`](Self::replay_graph) it).
    pub(crate) fn enqueue(&self, cb: CudaCommandBuffer) -> (Arc<CudaWork>, Option<u64>) {
        if let Some(n) = cb.nodes.iter().find(|n| n.fail) {
            let e = RuntimeError::Execution {
                op: n.node.op.name(),
                label: n.label.clone(),
                message: "injected fault".into(),
            };
            return (Arc::new(CudaWork::failed(e, cb.keep_alive)), None);
        }
        let key = signature(&self.kernels, &cb);
        match self.run(&cb, key) {
            Ok((launch, graph, slot)) => {
                let timing = slot
                    .zip(graph.as_ref())
                    .map(|(slot, g)| (timed_nodes(&cb, &g.launches), slot));
                let work = self.work(launch, graph, timing, cb.keep_alive);
                (work, self.has_graph(key).then_some(key))
            }
            Err(e) => (Arc::new(CudaWork::failed(e, cb.keep_alive)), None),
        }
    }

    /// `cb`'s launches (the launch pass, `crate::launches`) for this
    /// device's streams and kernels; timed command buffers share none.
    fn plan_launches(&self, cb: &CudaCommandBuffer) -> Vec<LevelLaunches> {
        let nodes: Vec<&OpNode> = cb.nodes.iter().map(|n| &n.node).collect();
        let rules = LaunchRules {
            streams: self.streams,
            share: !cb.timed,
            limit: &|n| Kernels::shared_launch_limit(&self.kernels, n),
            early: &|n, next| Kernels::launches_early(&self.kernels, n, next),
        };
        crate::launches::plan(&nodes, &cb.levels, &rules)
    }

    /// The structure key of a command buffer (what its graph depends on).
    pub(crate) fn key_of(&self, cb: &CudaCommandBuffer) -> u64 {
        signature(&self.kernels, cb)
    }

    /// Is a captured graph of structure `key` cached (and was its capture
    /// complete)?
    pub(crate) fn has_graph(&self, key: u64) -> bool {
        let graphs = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
        graphs
            .get(&key)
            .is_some_and(|g| g.graph.lock().unwrap_or_else(|p| p.into_inner()).is_some())
    }

    /// Replays the captured graph of structure `key` with this step's
    /// values: `values` are the step scalars of its nodes in order, `writes`
    /// the host bytes of its `Write` nodes (by position in the command
    /// buffer). `None` when no such graph is cached (any more).
    pub(crate) fn replay_graph(
        &self,
        key: u64,
        values: &[u32],
        writes: &[(usize, &[u8])],
        keep_alive: Vec<Arc<Storage>>,
    ) -> Option<Arc<CudaWork>> {
        let graph = self
            .graphs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned()?;
        let run = || -> Result<(CudaEvent, Arc<CudaEvent>), RuntimeError> {
            self.load_values(&graph, values, writes)?;
            let g = graph.graph.lock().unwrap_or_else(|p| p.into_inner());
            let g = g.as_ref().ok_or_else(|| {
                RuntimeError::Usage("a cached CUDA graph was never captured".into())
            })?;
            let start = self.timing_event()?;
            g.launch().map_err(driver)?;
            self.stats.replays.fetch_add(1, Ordering::Relaxed);
            Ok((start, self.launched(&graph)?))
        };
        Some(match run() {
            Ok(launch) => self.work(launch, Some(graph), None, keep_alive),
            Err(e) => Arc::new(CudaWork::failed(e, keep_alive)),
        })
    }

    /// Work in flight from a launch's (start, done) events.
    fn work(
        &self,
        (start, done): (CudaEvent, Arc<CudaEvent>),
        graph: Option<Arc<CachedGraph>>,
        timing: Option<(Vec<DeviceSpan>, TimeSlot)>,
        keep_alive: Vec<Arc<Storage>>,
    ) -> Arc<CudaWork> {
        Arc::new(CudaWork {
            done: Some(done),
            start: Some(start),
            busy: Mutex::new(Some(Arc::clone(&self.busy_ns))),
            error: Mutex::new(None),
            _keep_alive: keep_alive,
            _graph: graph,
            timing,
        })
    }

    /// After a launch: the event that marks its end, also kept as the
    /// graph's `last` (its memory may be rewritten once that completed).
    fn launched(&self, graph: &CachedGraph) -> Result<Arc<CudaEvent>, RuntimeError> {
        let done = Arc::new(self.timing_event()?);
        *graph.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&done));
        Ok(done)
    }

    #[allow(clippy::type_complexity)]
    fn run(
        &self,
        cb: &CudaCommandBuffer,
        key: u64,
    ) -> Result<
        (
            (CudaEvent, Arc<CudaEvent>),
            Option<Arc<CachedGraph>>,
            Option<TimeSlot>,
        ),
        RuntimeError,
    > {
        let cached = self
            .graphs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        let graph = match cached {
            Some(g) => g,
            None => {
                // A structure is captured the second time it comes: a one-off
                // (a prefill chunk of a new length) runs eagerly and pays no
                // capture. Both tables are bounded.
                let capture = self.use_graphs && {
                    let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
                    if seen.len() >= MAX_SEEN {
                        seen.clear();
                    }
                    !seen.insert(key)
                };
                let g = Arc::new(self.build(cb, capture)?);
                if capture {
                    let mut graphs = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
                    if graphs.len() >= MAX_GRAPHS {
                        graphs.clear();
                    }
                    graphs.insert(key, Arc::clone(&g));
                }
                g
            }
        };
        self.load_step_values(&graph, cb)?;
        // A timed graph's events still hold the previous replay's times:
        // read them before this replay records over them.
        let slot = match &graph.clock {
            Some(clock) => {
                graph.collect_times(None)?;
                let slot: TimeSlot = Arc::new(Mutex::new(None));
                *clock.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&slot));
                Some(slot)
            }
            None => None,
        };
        let start = self.timing_event()?;
        let launched = graph
            .graph
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(CudaGraph::launch);
        match launched {
            Some(r) => {
                r.map_err(driver)?;
                self.stats.replays.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                let staging = graph.staging.lock().unwrap_or_else(|p| p.into_inner());
                self.launch_levels(cb, &graph, staging.as_slice().map_err(driver)?, false)?;
                self.stats.eager.fetch_add(1, Ordering::Relaxed);
            }
        }
        let done = self.launched(&graph)?;
        Ok(((start, done), Some(graph), slot))
    }

    /// Allocates a graph's step buffer, staging and scratch, prepares the
    /// kernels and (when graphs are on) captures the launches.
    fn build(&self, cb: &CudaCommandBuffer, capture: bool) -> Result<CachedGraph, RuntimeError> {
        let mut step_offsets = Vec::with_capacity(cb.nodes.len());
        let mut step_len = 0usize;
        let mut write_offsets = Vec::with_capacity(cb.nodes.len());
        let mut staging_len = 0usize;
        let mut scratch_len = 0usize;
        for n in &cb.nodes {
            // Host writes are copies from pinned staging, not kernels.
            if !matches!(n.node.op, Op::Write { .. }) {
                Kernels::supports(&self.kernels, &n.node)?;
                self.kernels.prepare(&n.node, &self.main)?;
            }
            step_offsets.push(step_len);
            step_len += self.kernels.step_scalars(&n.node).len();
            write_offsets.push(match &n.node.op {
                Op::Write { data } => {
                    let at = staging_len;
                    staging_len += data.len().next_multiple_of(64);
                    Some((at, data.len()))
                }
                _ => None,
            });
            scratch_len += Kernels::scratch_bytes(&self.kernels, &n.node).next_multiple_of(256);
        }
        // SAFETY: pinned memory is written before any copy reads it.
        let staging =
            unsafe { self.ctx.alloc_pinned::<u8>(staging_len.max(64)) }.map_err(driver)?;
        let origin = if cb.timed {
            Some(self.clock_origin()?.0)
        } else {
            None
        };
        let clock = if cb.timed {
            let event = || {
                self.ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(driver)
            };
            let marks = cb
                .nodes
                .iter()
                .map(|_| Ok((event()?, event()?)))
                .collect::<Result<_, RuntimeError>>()?;
            Some(NodeClock {
                origin: event()?,
                marks,
                pending: Mutex::new(None),
            })
        } else {
            None
        };
        let g = CachedGraph {
            launches: self.plan_launches(cb),
            clock,
            origin,
            graph: Mutex::new(None),
            step: self.alloc(step_len.max(1) * 4)?,
            step_offsets,
            step_len,
            staging: Mutex::new(staging),
            write_offsets,
            _scratch: self.alloc(scratch_len.max(256))?,
            last: Mutex::new(None),
        };
        self.main.synchronize().map_err(driver)?;
        if capture {
            self.stats.captures.fetch_add(1, Ordering::Relaxed);
            let staging = g.staging.lock().unwrap_or_else(|p| p.into_inner());
            let host = staging.as_slice().map_err(driver)?;
            self.main
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(driver)?;
            let launched = self.launch_levels(cb, &g, host, true);
            let captured = self.main.end_capture(sys::CUgraphInstantiate_flags(0));
            drop(launched?);
            drop(staging);
            *g.graph.lock().unwrap_or_else(|p| p.into_inner()) = captured.map_err(driver)?;
        }
        Ok(g)
    }

    /// Writes this step's scalars and uploads into the graph's memory.
    fn load_step_values(
        &self,
        g: &CachedGraph,
        cb: &CudaCommandBuffer,
    ) -> Result<(), RuntimeError> {
        let mut values = Vec::with_capacity(g.step_len);
        let mut writes = Vec::new();
        for (i, n) in cb.nodes.iter().enumerate() {
            values.extend(self.kernels.step_scalars(&n.node));
            if let Op::Write { data } = &n.node.op {
                writes.push((i, &data[..]));
            }
        }
        self.load_values(g, &values, &writes)
    }

    /// Writes step scalars and host bytes (by node position) into the
    /// graph's memory, once its previous replay is done with them.
    fn load_values(
        &self,
        g: &CachedGraph,
        values: &[u32],
        writes: &[(usize, &[u8])],
    ) -> Result<(), RuntimeError> {
        if let Some(prev) = g.last.lock().unwrap_or_else(|p| p.into_inner()).take() {
            prev.synchronize().map_err(driver)?;
        }
        if values.len() != g.step_len {
            return Err(RuntimeError::Usage(format!(
                "a CUDA graph takes {} step values, got {}",
                g.step_len,
                values.len()
            )));
        }
        if !values.is_empty() {
            // SAFETY: the step buffer holds step_len u32s; the copy is ordered
            // before the launch on the same stream (pageable source: staged now).
            unsafe { result::memcpy_htod_async(g.step.ptr, values, self.main.cu_stream()) }
                .map_err(driver)?;
        }
        let mut staging = g.staging.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = staging.as_mut_slice().map_err(driver)?;
        for &(i, data) in writes {
            match g.write_offsets.get(i).copied().flatten() {
                Some((at, len)) if len == data.len() && at + len <= bytes.len() => {
                    bytes[at..at + len].copy_from_slice(data)
                }
                _ => {
                    return Err(RuntimeError::Usage(format!(
                        "host write {i} of {} bytes does not match the graph's staging",
                        data.len()
                    )))
                }
            }
        }
        Ok(())
    }
}

impl CudaBackend {
    /// A timing-enabled event recorded on the main stream now.
    fn timing_event(&self) -> Result<CudaEvent, RuntimeError> {
        let e = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver)?;
        e.record(&self.main).map_err(driver)?;
        Ok(e)
    }
}

/// Each node as a trace shows it: its level and the stream its launch
/// goes to (times filled in once it ran).
fn timed_nodes(cb: &CudaCommandBuffer, launches: &[LevelLaunches]) -> Vec<DeviceSpan> {
    let mut out = Vec::with_capacity(cb.nodes.len());
    for (level, plan) in launches.iter().enumerate() {
        for (k, launch) in plan.launches.iter().enumerate() {
            for &i in &launch.nodes {
                let n = &cb.nodes[i];
                out.push(DeviceSpan {
                    label: n.label.clone(),
                    op: n.node.op.name(),
                    layer: n.layer,
                    level: level as u32,
                    command_buffer: 0,
                    stream: plan.stream_of(k),
                    start_us: 0.0,
                    dur_us: 0.0,
                });
            }
        }
    }
    out
}

impl CachedGraph {
    /// Reads the pending replay's node times into its slot (only when that
    /// slot is `only`, if given). The replay must have completed.
    fn collect_times(&self, only: Option<&TimeSlot>) -> Result<(), RuntimeError> {
        let Some(clock) = &self.clock else {
            return Ok(());
        };
        let mut pending = clock.pending.lock().unwrap_or_else(|p| p.into_inner());
        let slot = match (pending.as_ref(), only) {
            (None, _) => return Ok(()),
            (Some(p), Some(o)) if !Arc::ptr_eq(p, o) => return Ok(()),
            (Some(p), _) => Arc::clone(p),
        };
        *pending = None;
        let origin = self.origin.as_ref().ok_or_else(|| {
            RuntimeError::Usage("a timed CUDA graph without a clock origin".into())
        })?;
        // The replay completed (the caller waited for it), so every event
        // did: read the times without a synchronize per event.
        let us = |a: &CudaEvent, b: &CudaEvent| -> Result<f64, RuntimeError> {
            // SAFETY: both events are live, timing-enabled and completed.
            let ms = unsafe { result::event::elapsed(a.cu_event(), b.cu_event()) };
            Ok(ms.map_err(driver)? as f64 * 1e3)
        };
        let base = us(origin, &clock.origin)?;
        let times = clock
            .marks
            .iter()
            .map(|(s, e)| Ok((base + us(&clock.origin, s)?, base + us(&clock.origin, e)?)))
            .collect::<Result<Vec<_>, RuntimeError>>()?;
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(times);
        Ok(())
    }
}
