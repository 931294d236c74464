//! Command buffers on the device: structure signatures, capture into CUDA
//! graphs with one branch per stream inside a level, and replay.

use super::{driver, CudaBackend, DeviceBuffer, BRANCH_STREAMS};
use crate::memory::Storage;
use crate::RuntimeError;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use weft_kernels::cuda::cudarc::driver::{
    result, sys, CudaEvent, CudaGraph, CudaStream, PinnedHostSlice,
};
use weft_kernels::cuda::DeviceTensor;
use weft_ops::{Op, OpNode, Tensor};

/// A node resolved to device memory.
pub(crate) struct CudaNode {
    pub node: OpNode,
    pub ins: Vec<DeviceTensor>,
    pub outs: Vec<DeviceTensor>,
    pub label: String,
    pub fail: bool,
}

/// One command buffer ready for the device: nodes in execution order, levels.
pub(crate) struct CudaCommandBuffer {
    pub nodes: Vec<CudaNode>,
    pub levels: Vec<Range<usize>>,
    pub keep_alive: Vec<Arc<Storage>>,
}

/// A captured graph and the device memory it reads per replay.
pub(crate) struct CachedGraph {
    graph: Mutex<Option<CudaGraph>>,
    step: DeviceBuffer,
    step_offsets: Vec<usize>,
    step_len: usize,
    staging: Mutex<PinnedHostSlice<u8>>,
    write_offsets: Vec<Option<usize>>,
    _scratch: DeviceBuffer,
    /// Completion of the previous replay (staging may be rewritten after it).
    last: Mutex<Option<CudaEvent>>,
}

// SAFETY: the graph and pinned staging are only touched under their mutexes;
// device pointers are plain integers.
unsafe impl Send for CachedGraph {}
// SAFETY: as above.
unsafe impl Sync for CachedGraph {}

/// Submitted device work.
pub(crate) struct CudaWork {
    done: Option<CudaEvent>,
    error: Mutex<Option<RuntimeError>>,
    _keep_alive: Vec<Arc<Storage>>,
    _graph: Option<Arc<CachedGraph>>,
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
        }
        Ok(())
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.as_ref().is_none_or(|e| e.is_complete())
    }

    fn failed(e: RuntimeError, keep_alive: Vec<Arc<Storage>>) -> CudaWork {
        CudaWork {
            done: None,
            error: Mutex::new(Some(e)),
            _keep_alive: keep_alive,
            _graph: None,
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
    pub(crate) fn submit(&self, cb: CudaCommandBuffer) -> Arc<CudaWork> {
        if let Some(n) = cb.nodes.iter().find(|n| n.fail) {
            let e = RuntimeError::Execution {
                op: n.node.op.name(),
                label: n.label.clone(),
                message: "injected fault".into(),
            };
            return Arc::new(CudaWork::failed(e, cb.keep_alive));
        }
        match self.run(&cb) {
            Ok((done, graph)) => Arc::new(CudaWork {
                done: Some(done),
                error: Mutex::new(None),
                _keep_alive: cb.keep_alive,
                _graph: graph,
            }),
            Err(e) => Arc::new(CudaWork::failed(e, cb.keep_alive)),
        }
    }

    fn run(
        &self,
        cb: &CudaCommandBuffer,
    ) -> Result<(CudaEvent, Option<Arc<CachedGraph>>), RuntimeError> {
        let key = signature(&self.kernels, cb);
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
                self.launch_levels(cb, &graph, staging.as_slice().map_err(driver)?)?;
                self.stats.eager.fetch_add(1, Ordering::Relaxed);
            }
        }
        let done = self.main.record_event(None).map_err(driver)?;
        *graph.last.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(self.main.record_event(None).map_err(driver)?);
        Ok((done, Some(graph)))
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
                self.kernels.supports(&n.node)?;
                self.kernels.prepare(&n.node, &self.main)?;
            }
            step_offsets.push(step_len);
            step_len += self.kernels.step_scalars(&n.node).len();
            write_offsets.push(match &n.node.op {
                Op::Write { data } => {
                    let at = staging_len;
                    staging_len += data.len().next_multiple_of(64);
                    Some(at)
                }
                _ => None,
            });
            scratch_len += self.kernels.scratch_bytes(&n.node).next_multiple_of(256);
        }
        // SAFETY: pinned memory is written before any copy reads it.
        let staging =
            unsafe { self.ctx.alloc_pinned::<u8>(staging_len.max(64)) }.map_err(driver)?;
        let g = CachedGraph {
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
            let launched = self.launch_levels(cb, &g, host);
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
        if let Some(prev) = g.last.lock().unwrap_or_else(|p| p.into_inner()).take() {
            prev.synchronize().map_err(driver)?;
        }
        let mut values = Vec::with_capacity(g.step_len);
        for n in &cb.nodes {
            values.extend(self.kernels.step_scalars(&n.node));
        }
        if !values.is_empty() {
            // SAFETY: the step buffer holds step_len u32s; the copy is ordered
            // before the launch on the same stream (pageable source: staged now).
            unsafe { result::memcpy_htod_async(g.step.ptr, &values, self.main.cu_stream()) }
                .map_err(driver)?;
        }
        let mut staging = g.staging.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = staging.as_mut_slice().map_err(driver)?;
        for (n, at) in cb.nodes.iter().zip(&g.write_offsets) {
            if let (Op::Write { data }, Some(at)) = (&n.node.op, at) {
                bytes[*at..*at + data.len()].copy_from_slice(data);
            }
        }
        Ok(())
    }

    /// Enqueues every node, level by level: a level's nodes go round-robin
    /// to the streams, and the level ends with a join on the main stream.
    /// `host` is the graph's pinned staging, taken before any capture
    /// (taking it synchronizes, which a capturing stream refuses). The
    /// fork/join events are returned, to be dropped once the capture ends.
    fn launch_levels(
        &self,
        cb: &CudaCommandBuffer,
        g: &CachedGraph,
        host: &[u8],
    ) -> Result<Vec<CudaEvent>, RuntimeError> {
        let mut events = Vec::new();
        let mut scratch = g._scratch.ptr;
        for level in &cb.levels {
            let width = level.len().min(BRANCH_STREAMS);
            if width > 1 {
                let fork = self.main.record_event(None).map_err(driver)?;
                for s in &self.branches[..width - 1] {
                    s.wait(&fork).map_err(driver)?;
                }
                events.push(fork);
            }
            for (k, i) in level.clone().enumerate() {
                let stream: &Arc<CudaStream> = if k % width == 0 {
                    &self.main
                } else {
                    &self.branches[k % width - 1]
                };
                let n = &cb.nodes[i];
                let step = g.step.ptr + 4 * g.step_offsets[i] as u64;
                let node_scratch = scratch;
                scratch += self.kernels.scratch_bytes(&n.node).next_multiple_of(256) as u64;
                self.launch_node(
                    stream,
                    n,
                    g.write_offsets[i].map(|at| &host[at..]),
                    node_scratch,
                    step,
                )?;
            }
            if width > 1 {
                for s in &self.branches[..width - 1] {
                    let join = s.record_event(None).map_err(driver)?;
                    self.main.wait(&join).map_err(driver)?;
                    events.push(join);
                }
            }
        }
        Ok(events)
    }

    fn launch_node(
        &self,
        stream: &Arc<CudaStream>,
        n: &CudaNode,
        staged: Option<&[u8]>,
        scratch: u64,
        step: u64,
    ) -> Result<(), RuntimeError> {
        let fail = |e: weft_ops::OpError| RuntimeError::Execution {
            op: n.node.op.name(),
            label: n.label.clone(),
            message: e.to_string(),
        };
        if let (Op::Write { data }, Some(src)) = (&n.node.op, staged) {
            // SAFETY: the output lies in a live device buffer; `src` is pinned
            // staging that lives as long as the graph.
            return unsafe {
                result::memcpy_htod_async(n.outs[0].ptr, &src[..data.len()], stream.cu_stream())
            }
            .map_err(driver);
        }
        // SAFETY: every tensor was resolved to live device memory of its size.
        unsafe {
            self.kernels
                .launch(stream, &n.node, &n.ins, &n.outs, scratch, step)
        }
        .map_err(fail)
    }
}
