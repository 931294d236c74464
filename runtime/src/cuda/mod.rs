//! The CUDA backend: device buffers, weights uploaded once, and command
//! buffers turned into CUDA graphs whose branches follow weft's levels.
//!
//! One command buffer becomes one graph. Nodes of one level are launched on
//! several streams forked from the capture stream (independent branches);
//! the end of a level joins them (a barrier). The graph is captured once
//! per command-buffer *structure* (ops, static parameters, tensors) and
//! replayed while the structure is unchanged: values that change from token
//! to token (positions, cache rows, uploaded token ids) are written into
//! device memory or pinned staging that the graph reads, so a new decode
//! token needs no new graph. [`CudaConfig::streams`] (1-4, default 4) caps
//! the streams a level is spread over (1: every node on one stream, in
//! order). A level's decode matvecs of one activation row (a layer's q, k
//! and v) share one launch. Where capture is impossible (or switched off,
//! [`CudaConfig::graphs`]) the same launches run eagerly, and the counters
//! say so.

mod graph;
mod submit;

pub(crate) use graph::{CudaCommandBuffer, CudaNode, CudaWork};
pub(crate) use submit::node_timings;

use crate::{CudaConfig, RuntimeError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use weft_kernels::cuda::cudarc::driver::{
    result, sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice,
};
use weft_kernels::cuda::CudaKernels;

/// Why CUDA cannot be used on this machine, if it cannot.
pub fn unavailable_reason() -> Option<String> {
    weft_kernels::cuda::driver_status().err()
}

fn driver(e: impl std::fmt::Debug) -> RuntimeError {
    RuntimeError::Usage(format!("[weft-runtime::cuda] CUDA driver error: {e:?}"))
}

/// Device memory of one buffer.
pub(crate) struct DeviceBuffer {
    _slice: CudaSlice<u8>,
    pub ptr: u64,
    pub len: usize,
}

/// Graph figures of a CUDA executor.
#[derive(Default)]
pub(crate) struct GraphStats {
    pub captures: AtomicU64,
    pub replays: AtomicU64,
    pub eager: AtomicU64,
}

/// One device: its context, streams, kernels and captured graphs.
pub(crate) struct CudaBackend {
    pub ctx: Arc<CudaContext>,
    /// Capture and launch stream (never the default stream).
    pub main: Arc<CudaStream>,
    /// Extra streams for a level's parallel branches.
    pub branches: Vec<Arc<CudaStream>>,
    pub kernels: CudaKernels,
    pub graphs: Mutex<HashMap<u64, Arc<graph::CachedGraph>>>,
    /// Signatures seen once (captured when they come again).
    pub seen: Mutex<std::collections::HashSet<u64>>,
    pub use_graphs: bool,
    /// Streams a level's nodes are spread over (at most [`BRANCH_STREAMS`]).
    pub streams: usize,
    pub stats: GraphStats,
    /// Device time zero of node timings and the host instant it maps to.
    clock: Mutex<Option<(Arc<CudaEvent>, Instant)>>,
    /// Pinned memory that downloads go through, and their stream.
    readback: Mutex<Option<PinnedHostSlice<u8>>>,
    readback_stream: Arc<CudaStream>,
    /// Device time of the command buffers waited for, in nanoseconds.
    pub busy_ns: Arc<AtomicU64>,
}

/// Streams a level's nodes can be spread over.
const BRANCH_STREAMS: usize = CudaConfig::MAX_STREAMS;

impl CudaBackend {
    pub(crate) fn new(
        ordinal: usize,
        config: &CudaConfig,
        numerics: weft_kernels::Numerics,
    ) -> Result<CudaBackend, RuntimeError> {
        if !(1..=BRANCH_STREAMS).contains(&config.streams) {
            return Err(RuntimeError::Usage(format!(
                "CudaConfig::streams must be from 1 to {BRANCH_STREAMS}, got {}",
                config.streams
            )));
        }
        if let Some(why) = unavailable_reason() {
            return Err(RuntimeError::Usage(format!("CUDA is unavailable: {why}")));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        // SAFETY: no allocation has been made on this context yet; weft
        // orders all work itself (streams, events, graph dependencies).
        unsafe { ctx.disable_event_tracking() };
        let main = ctx.new_stream().map_err(driver)?;
        let branches = (1..BRANCH_STREAMS)
            .map(|_| ctx.new_stream().map_err(driver))
            .collect::<Result<_, _>>()?;
        let readback_stream = ctx.new_stream().map_err(driver)?;
        let kernels =
            CudaKernels::with_numerics(Arc::clone(&ctx), config.ptx_cache.as_deref(), numerics)?;
        Ok(CudaBackend {
            ctx,
            streams: config.streams,
            main,
            branches,
            kernels,
            graphs: Mutex::new(HashMap::new()),
            seen: Mutex::new(std::collections::HashSet::new()),
            use_graphs: config.graphs,
            stats: GraphStats::default(),
            clock: Mutex::new(None),
            readback: Mutex::new(None),
            readback_stream,
            busy_ns: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Zeroed device memory.
    pub(crate) fn alloc(&self, len: usize) -> Result<DeviceBuffer, RuntimeError> {
        let slice =
            self.main
                .alloc_zeros::<u8>(len.max(1))
                .map_err(|e| RuntimeError::OutOfMemory {
                    bytes: len as u64,
                    name: format!("cuda: {e:?}"),
                })?;
        let ptr = {
            let (ptr, _guard) = slice.device_ptr(&self.main);
            ptr
        };
        Ok(DeviceBuffer {
            _slice: slice,
            ptr,
            len,
        })
    }

    /// Copies host bytes to `dst + offset`, waiting for the copy.
    pub(crate) fn upload(&self, dst: u64, data: &[u8]) -> Result<(), RuntimeError> {
        // SAFETY: dst..dst+len lies in a live allocation (checked by the caller).
        unsafe { result::memcpy_htod_async(dst, data, self.main.cu_stream()) }.map_err(driver)?;
        self.main.synchronize().map_err(driver)
    }

    /// Copies device bytes to the host as they are now, on the read-back
    /// stream (not ordered after the work on the others: the caller waited
    /// for the bytes' writer). Through pinned memory (kept and grown): a
    /// decode step's logits come back in a fraction of a pageable copy's time.
    pub(crate) fn download_now(&self, src: u64, len: usize) -> Result<Vec<u8>, RuntimeError> {
        let mut pinned = self.readback.lock().unwrap_or_else(|p| p.into_inner());
        if pinned.as_ref().is_none_or(|p| p.len() < len) {
            // SAFETY: the pinned bytes are written by the copy before being read.
            let fresh = unsafe {
                self.ctx
                    .alloc_pinned::<u8>(len.next_power_of_two().max(4096))
            };
            *pinned = Some(fresh.map_err(driver)?);
        }
        let Some(host) = pinned.as_mut() else {
            return Err(RuntimeError::Usage("no pinned read-back buffer".into()));
        };
        let host = &mut host.as_mut_slice().map_err(driver)?[..len];
        // SAFETY: src..src+len lies in a live allocation (checked by the caller).
        unsafe { result::memcpy_dtoh_async(host, src, self.readback_stream.cu_stream()) }
            .map_err(driver)?;
        self.readback_stream.synchronize().map_err(driver)?;
        Ok(host.to_vec())
    }

    /// Waits for everything submitted.
    pub(crate) fn synchronize(&self) -> Result<(), RuntimeError> {
        self.main.synchronize().map_err(driver)?;
        for s in &self.branches {
            s.synchronize().map_err(driver)?;
        }
        Ok(())
    }

    /// The clock origin of device timings: an event recorded on an idle
    /// device and the host instant just after it completed (set once).
    pub(crate) fn clock_origin(&self) -> Result<(Arc<CudaEvent>, Instant), RuntimeError> {
        let mut clock = self.clock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((e, at)) = clock.as_ref() {
            return Ok((Arc::clone(e), *at));
        }
        self.synchronize()?;
        let e = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver)?;
        e.record(&self.main).map_err(driver)?;
        e.synchronize().map_err(driver)?;
        let origin = (Arc::new(e), Instant::now());
        *clock = Some((Arc::clone(&origin.0), origin.1));
        Ok(origin)
    }

    pub(crate) fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "cuda".into())
    }

    pub(crate) fn graph_counts(&self) -> (u64, u64, u64) {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        (
            g(&self.stats.captures),
            g(&self.stats.replays),
            g(&self.stats.eager),
        )
    }
}
