//! The Metal backend (macOS, feature `metal`): weft buffers as mlx-native
//! buffers in shared memory, weights uploaded once, and command buffers
//! encoded level by level (see `graph.rs`).
//!
//! Buffers are `StorageModeShared`: on Apple silicon the host reads and
//! writes them in place once in-flight work has completed, so host access
//! needs no staging copies.
//!
//! **Activation companions.** mlx-native's matmul kernels take f32
//! activations, while weft's recordings quantize activations first (Q8_0,
//! Q8_1, Q8_K, f16 or bf16: `QuantizeRows`) the way its CPU kernels and
//! llama.cpp do. A buffer that receives such rows gets a companion four
//! times its size; the f32 image of a tensor at byte `o` lives at `4 o`
//! (no tensor has more elements than bytes), so disjoint tensors have
//! disjoint images and every image is guarded by the same hazards as its
//! rows: only the node writing the rows writes it, only nodes reading
//! exactly those rows read it. An image is valid while the last writer of
//! its rows was a `QuantizeRows` that wrote it; any other write (a node, a
//! host write) invalidates it, and a matmul then rebuilds the f32
//! activations in a prologue before its level.

mod graph;
mod submit;

pub(crate) use graph::{prepare, MetalWork};

use crate::RuntimeError;
use std::sync::{Arc, Mutex, Weak};
use weft_kernels::metal::mlx_native::{MlxBuffer, MlxDevice};
use weft_kernels::metal::{view_of, Arena, MetalKernels, MlxDType};
use weft_ops::{DType, Tensor};

/// Why Metal cannot be used here, if it cannot.
pub fn unavailable_reason() -> Option<String> {
    match weft_kernels::metal::mlx_native::metal::Device::system_default() {
        Some(_) => None,
        None => Some("no Metal device was found on this Mac".into()),
    }
}

fn device_error(what: &str, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Usage(format!("[weft-runtime::metal] {what}: {e}"))
}

/// A range of a buffer whose companion holds the f32 image of its rows.
#[derive(Clone, Copy, Debug)]
struct Valid {
    start: u64,
    end: u64,
    dtype: DType,
}

#[derive(Default)]
struct Companion {
    /// f32 images: rows at byte `o` of the buffer have theirs at `4 o`.
    buffer: Option<MlxBuffer>,
    valid: Vec<Valid>,
}

/// Memory of one weft buffer on a Metal executor.
pub(crate) struct MetalStorage {
    /// The allocation (at least one byte), shared with the host.
    pub buffer: MlxBuffer,
    pub len: usize,
    companion: Mutex<Companion>,
}

impl MetalStorage {
    fn new(buffer: MlxBuffer, len: usize) -> MetalStorage {
        MetalStorage {
            buffer,
            len,
            companion: Mutex::new(Companion::default()),
        }
    }

    /// Host address of the first byte.
    pub fn host_ptr(&self) -> *mut u8 {
        // SAFETY: the offset lies inside the allocation (buffers made here
        // have offset 0).
        unsafe { (self.buffer.contents_ptr() as *mut u8).add(self.buffer.byte_offset() as usize) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Companion> {
        self.companion.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where a `QuantizeRows` writing `t` puts the f32 image of its rows
    /// (allocating the companion on first use); `None` when the companion
    /// cannot be allocated (matmuls then rebuild the image themselves).
    pub fn image_for_write(&self, device: &MlxDevice, t: &Tensor) -> Option<MlxBuffer> {
        let mut c = self.lock();
        if c.buffer.is_none() {
            let bytes = 4 * self.len.max(1);
            c.buffer = device.alloc_buffer(bytes, MlxDType::U8, vec![bytes]).ok();
        }
        let buffer = c.buffer.as_ref()?;
        view_of(
            buffer,
            4 * t.offset,
            4 * t.shape.elements() as u64,
            MlxDType::F32,
        )
        .ok()
    }

    /// The f32 image of rows `t` if it is valid. Only the exact rows a
    /// `QuantizeRows` wrote qualify: a sub-range's image would be anchored
    /// at the writer's start, where a concurrent writer of other rows of
    /// that old range could overlap it.
    pub fn image_for_read(&self, t: &Tensor) -> Option<MlxBuffer> {
        let c = self.lock();
        let buffer = c.buffer.as_ref()?;
        let end = t.offset + t.bytes();
        c.valid
            .iter()
            .any(|v| v.dtype == t.dtype && v.start == t.offset && v.end == end)
            .then(|| {
                view_of(
                    buffer,
                    4 * t.offset,
                    4 * t.shape.elements() as u64,
                    MlxDType::F32,
                )
                .ok()
            })
            .flatten()
    }

    /// Bytes `start..end` were written without their image.
    pub fn invalidate(&self, start: u64, end: u64) {
        let mut c = self.lock();
        if !c.valid.is_empty() {
            c.valid.retain(|v| v.end <= start || end <= v.start);
        }
    }

    /// Rows `t` were written together with their image.
    pub fn validate(&self, t: &Tensor) {
        let (start, end) = (t.offset, t.offset + t.bytes());
        let mut c = self.lock();
        c.valid.retain(|v| v.end <= start || end <= v.start);
        c.valid.push(Valid {
            start,
            end,
            dtype: t.dtype,
        });
    }
}

/// One Metal device: its kernels, reusable per-command-buffer arenas and
/// the command buffers in flight.
pub(crate) struct MetalBackend {
    pub kernels: MetalKernels,
    arenas: Arc<Mutex<Vec<Arena>>>,
    in_flight: Mutex<Vec<Weak<MetalWork>>>,
}

impl MetalBackend {
    pub(crate) fn new() -> Result<MetalBackend, RuntimeError> {
        let device = MlxDevice::new().map_err(|e| device_error("no Metal device", e))?;
        let kernels = MetalKernels::new(device);
        kernels
            .prepare()
            .map_err(|e| device_error("weft's Metal shaders", e))?;
        Ok(MetalBackend {
            kernels,
            arenas: Arc::new(Mutex::new(Vec::new())),
            in_flight: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn device(&self) -> &MlxDevice {
        self.kernels.device()
    }

    /// Zeroed shared memory of `len` bytes.
    pub(crate) fn alloc(&self, len: usize, name: &str) -> Result<MetalStorage, RuntimeError> {
        let bytes = len.max(1);
        let buffer = self
            .device()
            .alloc_buffer(bytes, MlxDType::U8, vec![bytes])
            .map_err(|_| RuntimeError::OutOfMemory {
                bytes: len as u64,
                name: name.to_string(),
            })?;
        Ok(MetalStorage::new(buffer, len))
    }

    /// Shared memory holding a copy of `data` (weights: uploaded once).
    pub(crate) fn upload(&self, data: &[u8], name: &str) -> Result<MetalStorage, RuntimeError> {
        let storage = self.alloc(data.len(), name)?;
        // SAFETY: the fresh allocation holds at least `data.len()` bytes and
        // nothing else references it yet.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), storage.host_ptr(), data.len()) };
        Ok(storage)
    }

    /// An arena for one command buffer (a recycled one when available).
    pub(crate) fn take_arena(&self) -> Arena {
        let recycled = self.arenas.lock().unwrap_or_else(|p| p.into_inner()).pop();
        recycled.unwrap_or_else(|| Arena::new(self.device().clone()))
    }

    pub(crate) fn arena_pool(&self) -> Arc<Mutex<Vec<Arena>>> {
        Arc::clone(&self.arenas)
    }

    /// Notes submitted work so `synchronize` can wait for it.
    pub(crate) fn track(&self, work: &Arc<MetalWork>) {
        let mut list = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|w| w.upgrade().is_some_and(|w| !w.is_done_now()));
        list.push(Arc::downgrade(work));
    }

    /// Waits for every command buffer submitted so far (failures stay with
    /// whoever holds the in-flight handles).
    pub(crate) fn synchronize(&self) {
        let list = std::mem::take(&mut *self.in_flight.lock().unwrap_or_else(|p| p.into_inner()));
        for work in list.iter().filter_map(Weak::upgrade) {
            work.wait_done();
        }
    }

    pub(crate) fn name(&self) -> String {
        self.device().name()
    }
}
