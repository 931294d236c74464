//! The executor: owns a device's buffers, its pools and (on the CPU) its
//! thread pool, and opens recording sessions.

use crate::backend::Backend;
use crate::config::ExecutorConfig;
use crate::counters::{Counters, LiveCounters};
use crate::cpu::threadpool::{Job, ThreadPool};
use crate::memory::{HostBytes, Storage};
use crate::pool::{PoolScope, PoolStats, Pools};
use crate::session::{GraphSession, SessionMode};
use crate::submission::InFlight;
use crate::trace::{Trace, TraceState};
use crate::RuntimeError;
use std::sync::Arc;
use std::time::Instant;
use weft_graph::dump::BufferInfo;
use weft_graph::BufferId;
use weft_ops::{DType, Shape, Tensor};

/// A tapped tensor: name, shape, values.
pub type Tapped = (String, Vec<usize>, Vec<f32>);

/// Where work runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// Host CPU with a persistent thread pool.
    Cpu,
    /// An NVIDIA GPU by ordinal (needs the `cuda` feature and a driver).
    Cuda(usize),
    /// The Mac's GPU through Metal (needs macOS and the `metal` feature).
    Metal,
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Metal => f.write_str("metal"),
        }
    }
}

pub(crate) struct BufferEntry {
    pub storage: Arc<Storage>,
    pub name: String,
    /// A command buffer has had a node write it: on CUDA its readers are
    /// never marked constant (`DeviceTensor::constant`), even in a command
    /// buffer that does not write it while an earlier one may still run.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub written: bool,
}

/// Runs recorded graphs on one device.
pub struct GraphExecutor {
    device: Device,
    pub(crate) config: ExecutorConfig,
    /// The device's side of every commit (`backend.rs`).
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) buffers: Vec<Option<BufferEntry>>,
    pub(crate) pool: ThreadPool,
    pub(crate) counters: Arc<LiveCounters>,
    pub(crate) pools: Pools,
    /// The most recently submitted jobs: host access waits for them.
    pub(crate) last_jobs: Vec<Arc<Job>>,
    pub(crate) epoch: Instant,
    pub(crate) fault_seen: usize,
    /// Nodes of the last recording (a new session reserves as many).
    pub(crate) last_recording_len: usize,
    /// Plans of recent recordings (most recent first), reused while steps
    /// repeat one.
    pub(crate) step_plans: Vec<crate::plan::StepPlan>,
    /// Tensors copied out by `GraphSession::tap` while taps are on.
    pub(crate) taps: Option<Vec<(String, Tensor)>>,
    /// Collected events while tracing.
    pub(crate) trace: Option<TraceState>,
    /// Tensors kept by name for the executor's life ([`Self::named_tensor`]).
    named: std::collections::HashMap<String, Tensor>,
}

impl GraphExecutor {
    /// An executor with the default configuration.
    pub fn new(device: Device) -> Result<GraphExecutor, RuntimeError> {
        Self::with_config(device, ExecutorConfig::default())
    }

    /// An executor with `config`.
    pub fn with_config(
        device: Device,
        config: ExecutorConfig,
    ) -> Result<GraphExecutor, RuntimeError> {
        if config.threads == 0 {
            return Err(RuntimeError::Usage("threads must be at least 1".into()));
        }
        if let Some(why) = device.unavailable_reason() {
            return Err(RuntimeError::Usage(format!("cannot use {device}: {why}")));
        }
        if let Some(isa) = config.cpu.isa {
            isa.select()?;
        }
        let backend = crate::backend::for_device(device, &config)?;
        let counters = Arc::new(LiveCounters::default());
        let pool = ThreadPool::new(config.threads, Arc::clone(&counters))?;
        Ok(GraphExecutor {
            device,
            config,
            backend,
            buffers: Vec::new(),
            pool,
            counters,
            pools: Pools::default(),
            last_jobs: Vec::new(),
            epoch: Instant::now(),
            fault_seen: 0,
            last_recording_len: 0,
            step_plans: Vec::new(),
            taps: None,
            trace: None,
            named: std::collections::HashMap::new(),
        })
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn config(&self) -> &ExecutorConfig {
        &self.config
    }

    /// Whether a matmul over `w` of `batch` activation rows gives every
    /// row the bits a one-row matmul gives it on this device, so that rows
    /// of independent sequences can share one step. The CPU answers from
    /// its kernels' float orders; other devices answer false.
    pub fn batch_keeps_row_order(&self, w: &weft_ops::Tensor, batch: usize) -> bool {
        match self.device {
            Device::Cpu => {
                weft_kernels::cpu::quant::batch_keeps_row_order(w.dtype, w.rows(), w.cols(), batch)
            }
            _ => false,
        }
    }

    /// Changes scheduling settings (threads are fixed at creation).
    pub fn config_mut(&mut self) -> &mut ExecutorConfig {
        &mut self.config
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// A zeroed device buffer of `bytes` bytes that the pools never touch.
    pub fn alloc_buffer(&mut self, bytes: u64, name: &str) -> Result<BufferId, RuntimeError> {
        let len = usize::try_from(bytes).map_err(|_| RuntimeError::OutOfMemory {
            bytes,
            name: name.into(),
        })?;
        let storage = self.backend.alloc_storage(len, name)?;
        Ok(self.insert(storage, name))
    }

    /// A persistent zeroed tensor in its own buffer.
    pub fn alloc_tensor(
        &mut self,
        dtype: DType,
        dims: &[usize],
        name: &str,
    ) -> Result<Tensor, RuntimeError> {
        let t = Tensor::new(BufferId(0), 0, dtype, Shape::new(dims))?;
        let id = self.alloc_buffer(t.bytes(), name)?;
        Ok(Tensor { buffer: id, ..t })
    }

    /// The persistent tensor called `name`, allocated (zeroed) the first
    /// time: helpers that run many times (greedy decoding's id buffers) keep
    /// the same buffers, so their steps keep one structure and reuse their
    /// plans and captured graphs from call to call. Asking again with
    /// another type or shape is an error.
    pub fn named_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        dims: &[usize],
    ) -> Result<Tensor, RuntimeError> {
        if let Some(t) = self.named.get(name) {
            if t.dtype != dtype || t.shape.dims() != dims {
                return Err(RuntimeError::Usage(format!(
                    "the named tensor `{name}` is {} {:?}, not {dtype} {dims:?}",
                    t.dtype,
                    t.shape.dims()
                )));
            }
            return Ok(*t);
        }
        let t = self.alloc_tensor(dtype, dims, name)?;
        self.named.insert(name.to_string(), t);
        Ok(t)
    }

    /// Wraps read-only host bytes (a memory-mapped file) as a buffer:
    /// without copying on the CPU, uploaded once to a GPU.
    pub fn map_bytes(
        &mut self,
        bytes: Arc<dyn HostBytes>,
        name: &str,
    ) -> Result<BufferId, RuntimeError> {
        let storage = self.backend.wrap_bytes(bytes, name)?;
        Ok(self.insert(storage, name))
    }

    fn insert(&mut self, storage: Storage, name: &str) -> BufferId {
        let entry = BufferEntry {
            storage: Arc::new(storage),
            name: name.to_string(),
            written: false,
        };
        if let Some(i) = self.buffers.iter().position(Option::is_none) {
            self.buffers[i] = Some(entry);
            return BufferId(i as u32);
        }
        self.buffers.push(Some(entry));
        BufferId(self.buffers.len() as u32 - 1)
    }

    /// Releases a buffer (in-flight work keeps its memory alive until done).
    pub fn release_buffer(&mut self, id: BufferId) {
        if let Some(slot) = self.buffers.get_mut(id.0 as usize) {
            *slot = None;
        }
        // A step plan pointing into the buffer could never match again, and
        // it would keep the memory alive.
        self.step_plans
            .retain(|p| !p.buffers.iter().any(|(b, _)| *b == id));
        // A named tensor in it is gone too (its id may be reused).
        self.named.retain(|_, t| t.buffer != id);
    }

    pub(crate) fn entry(&self, id: BufferId) -> Result<&BufferEntry, RuntimeError> {
        self.buffers
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                RuntimeError::Usage(format!(
                    "buffer {id} does not exist (released or never allocated)"
                ))
            })
    }

    /// Size of a buffer in bytes.
    pub fn buffer_len(&self, id: BufferId) -> Option<u64> {
        self.entry(id).ok().map(|e| e.storage.len() as u64)
    }

    /// Every live buffer, for dumps.
    pub fn buffer_infos(&self) -> Vec<BufferInfo> {
        self.buffers
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                e.as_ref().map(|e| BufferInfo {
                    id: i as u32,
                    bytes: e.storage.len() as u64,
                    name: e.name.clone(),
                })
            })
            .collect()
    }

    /// Waits until everything submitted so far has run (failures are
    /// reported to whoever holds the in-flight handles, not here).
    pub fn synchronize(&mut self) {
        for job in self.last_jobs.drain(..) {
            job.wait_done();
        }
        let _ = self.backend.wait_all();
    }

    /// Copies a tensor's bytes to the host, after in-flight work completes.
    pub fn read_bytes(&mut self, t: &Tensor) -> Result<Vec<u8>, RuntimeError> {
        let start = std::time::Instant::now();
        let bytes = self.read_bytes_now(t);
        LiveCounters::add_since(&self.counters.read_ns, start);
        bytes
    }

    /// Waits for `work` alone, not for work submitted after it, and copies
    /// `t`'s bytes to the host: a pipelined decode reads step `k`'s output
    /// while step `k + 1` runs. `t` must be written by `work` (or earlier)
    /// and by nothing submitted after it; the caller keeps to that (step
    /// outputs in alternating buffers). Backends without a way to read
    /// beside running work (Metal) wait for everything.
    pub fn read_after(&mut self, work: InFlight, t: &Tensor) -> Result<Vec<u8>, RuntimeError> {
        work.wait()?;
        let start = std::time::Instant::now();
        if !self.backend.reads_beside_work() {
            return self.read_bytes(t);
        }
        let bytes = self.read_unsynchronized(t);
        LiveCounters::add_since(&self.counters.read_ns, start);
        bytes
    }

    fn read_bytes_now(&mut self, t: &Tensor) -> Result<Vec<u8>, RuntimeError> {
        self.synchronize();
        // A failed device (a kernel fault) must fail the read, not be read past.
        self.backend.wait_all()?;
        self.read_unsynchronized(t)
    }

    /// `t`'s bytes as they are now (the caller waited for their writer).
    fn read_unsynchronized(&mut self, t: &Tensor) -> Result<Vec<u8>, RuntimeError> {
        let e = self.entry(t.buffer)?;
        let range = t.offset as usize..(t.offset + t.bytes()) as usize;
        if range.end > e.storage.len() {
            return Err(RuntimeError::Usage(format!(
                "tensor {t:?} lies outside its buffer"
            )));
        }
        if let Some(bytes) = self
            .backend
            .read_device(&e.storage, range.start, range.len())
        {
            return bytes;
        }
        match e.storage.bytes() {
            Some(bytes) => Ok(bytes[range].to_vec()),
            None => Err(RuntimeError::Usage(format!(
                "buffer `{}` is not readable from the host",
                e.name
            ))),
        }
    }

    /// A tensor's values as f32 (f32, f16, bf16 or quantized, converted).
    pub fn read_f32(&mut self, t: &Tensor) -> Result<Vec<f32>, RuntimeError> {
        let bytes = self.read_bytes(t)?;
        Ok(weft_ops::reference::to_f32(
            &bytes,
            t.dtype,
            t.shape.elements(),
        )?)
    }

    /// An i32 tensor's values.
    pub fn read_i32(&mut self, t: &Tensor) -> Result<Vec<i32>, RuntimeError> {
        Ok(bytemuck::pod_collect_to_vec(&self.read_bytes(t)?))
    }

    /// Overwrites a tensor's bytes from the host, after in-flight work completes.
    pub fn write_bytes(&mut self, t: &Tensor, data: &[u8]) -> Result<(), RuntimeError> {
        self.synchronize();
        let e = self.entry(t.buffer)?;
        if !e.storage.writable() {
            return Err(RuntimeError::Usage(format!(
                "buffer `{}` is read-only",
                e.name
            )));
        }
        if data.len() as u64 != t.bytes() || t.offset + t.bytes() > e.storage.len() as u64 {
            return Err(RuntimeError::Usage(format!(
                "{} bytes do not fit tensor {t:?}",
                data.len()
            )));
        }
        if let Some(written) = self.backend.write_device(&e.storage, t.offset, data) {
            return written;
        }
        let base = e.storage.host_ptr().ok_or_else(|| {
            RuntimeError::Usage(format!("buffer `{}` is not host memory", e.name))
        })?;
        // SAFETY: no work is in flight (synchronized above), the storage is
        // owned and writable, and the range was checked against its length.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), base.add(t.offset as usize), data.len())
        };
        e.storage.host_written(t.offset, t.offset + t.bytes());
        Ok(())
    }

    /// Counters so far.
    pub fn counters(&self) -> Counters {
        let mut c = self.counters.snapshot();
        c.pool_allocations = self.pools.stats.allocations;
        c
    }

    /// CUDA graph figures so far: `(captures, replays, eager launches)`;
    /// `None` on other devices.
    pub fn graph_stats(&self) -> Option<(u64, u64, u64)> {
        self.backend.graph_stats()
    }

    /// Time the GPU spent on the command buffers waited for so far (from
    /// an event before and after each launch), `None` on the CPU: set
    /// against wall time, it splits a step into device and host time.
    pub fn device_busy(&self) -> Option<std::time::Duration> {
        self.backend.device_busy()
    }

    /// The device's name (the GPU's marketing name on CUDA).
    pub fn device_name(&self) -> String {
        self.backend
            .device_name()
            .unwrap_or_else(|| self.device.to_string())
    }

    /// Pool figures.
    pub fn pool_stats(&self) -> PoolStats {
        self.pools.stats
    }

    /// Opens a pool scope outside any session (sessions can open them too).
    pub fn begin_pool_scope(&mut self, kind: PoolScope) {
        self.pools.begin(kind);
    }

    /// Ends the innermost pool scope.
    pub fn end_pool_scope(&mut self) -> Option<PoolScope> {
        self.pools.end()
    }

    /// Frees the memory of pooled buffers that are not in use.
    pub fn release_pool_scratch(&mut self) {
        for (id, _) in self.pools.release_free() {
            self.release_buffer(id);
        }
    }

    /// A pooled tensor from the innermost scope.
    pub(crate) fn pool_alloc(
        &mut self,
        dtype: DType,
        dims: &[usize],
    ) -> Result<Tensor, RuntimeError> {
        let t = Tensor::new(BufferId(0), 0, dtype, Shape::new(dims))?;
        let bytes = t.bytes();
        let id = match self.pools.take(bytes) {
            Some(id) => id,
            None => {
                let id = self.alloc_buffer(bytes, &format!("pool.{dtype}.{bytes}"))?;
                self.pools.adopt(id, bytes);
                id
            }
        };
        Ok(Tensor { buffer: id, ..t })
    }

    /// Starts tracing: every command buffer runs timed and host-side
    /// phases are noted, until [`take_trace`](Self::take_trace).
    pub fn enable_trace(&mut self) {
        self.trace.get_or_insert_with(TraceState::new);
    }

    /// True while tracing.
    pub fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    /// Everything traced so far (tracing stays on); waits for in-flight work.
    pub fn take_trace(&mut self) -> Trace {
        self.synchronize();
        let threads = self.threads();
        match self.trace.as_mut() {
            Some(state) => {
                let host =
                    std::mem::take(&mut *state.host.lock().unwrap_or_else(|p| p.into_inner()));
                let jobs = std::mem::take(&mut state.jobs);
                let device = self.backend.device_spans(state, self.epoch);
                Trace::build(host, &jobs, threads, device)
            }
            None => Trace::default(),
        }
    }

    /// Starts collecting tapped tensors (see [`GraphSession::tap`]).
    pub fn enable_taps(&mut self) {
        self.taps.get_or_insert_with(Vec::new);
    }

    /// True while taps are collected.
    pub fn taps_enabled(&self) -> bool {
        self.taps.is_some()
    }

    /// The tapped tensors so far, as `(name, shape, values)`, in tap order;
    /// their buffers are released. Waits for in-flight work.
    pub fn take_taps(&mut self) -> Result<Vec<Tapped>, RuntimeError> {
        let taps = match self.taps.as_mut() {
            Some(t) => std::mem::take(t),
            None => return Ok(Vec::new()),
        };
        let mut out = Vec::with_capacity(taps.len());
        for (name, t) in taps {
            let values = self.read_f32(&t)?;
            self.release_buffer(t.buffer);
            out.push((name, t.shape.dims().to_vec(), values));
        }
        Ok(out)
    }

    /// Opens an eager session: nodes run in recorded order, with a barrier
    /// only where a node conflicts with what ran since the last barrier.
    pub fn begin(&mut self) -> GraphSession<'_> {
        GraphSession::new(self, SessionMode::Eager)
    }

    /// Opens a recorded session: nodes are scheduled by the reorder pass on commit.
    pub fn begin_recorded(&mut self) -> GraphSession<'_> {
        GraphSession::new(self, SessionMode::Recorded)
    }
}

impl Drop for GraphExecutor {
    fn drop(&mut self) {
        self.synchronize();
    }
}
