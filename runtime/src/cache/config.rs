//! The shape of a KV cache and what it costs: rows per layer, bytes per
//! layer and per token, and the admission check a caller runs before
//! allocating (does this context fit the memory budget?).
//!
//! Kept apart from the cache itself so a scheduler can size caches (and
//! refuse requests) without touching a device.

use crate::RuntimeError;
use weft_ops::DType;

/// Shape of one layer's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    /// Values per row (kv heads x head size).
    pub width: usize,
    /// Sliding window: a query at `p` sees positions `> p - window`. The
    /// layer then keeps a ring of `window + max_chunk` rows.
    pub window: Option<u32>,
}

/// Shape of a whole cache.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheConfig {
    pub layers: Vec<LayerSpec>,
    /// Longest sequence the cache holds.
    pub context: u32,
    /// Most tokens one step may write (sizes rings).
    pub max_chunk: u32,
    /// Element type of K and V rows (f16 or f32: what attention reads).
    pub dtype: DType,
}

/// Memory of one layer's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LayerMemory {
    /// Rows kept (the context, or the ring size of a windowed layer).
    pub rows: u32,
    /// Bytes of one token's K plus V row.
    pub token_bytes: u64,
    /// Bytes of K plus V for the whole layer.
    pub bytes: u64,
    /// True when the layer is a ring (its size does not grow with the context).
    pub ring: bool,
}

/// Memory of a whole cache, per layer and per token.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemoryReport {
    pub layers: Vec<LayerMemory>,
    /// Bytes of every layer together.
    pub total_bytes: u64,
    /// Bytes one more token of context costs (layers that are not rings).
    pub bytes_per_token: u64,
    /// Bytes of the ring layers, which do not depend on the context.
    pub ring_bytes: u64,
}

impl CacheConfig {
    /// Checks the layout: a context and a chunk of at least one token,
    /// layers of non-zero width, an element type attention can read.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        if self.context == 0 || self.max_chunk == 0 {
            return Err(RuntimeError::Usage(format!(
                "KV cache: context ({}) and max_chunk ({}) must be at least one token",
                self.context, self.max_chunk
            )));
        }
        if !matches!(self.dtype, DType::F16 | DType::F32) {
            return Err(RuntimeError::Usage(format!(
                "KV cache: rows of {} are not supported; use f16 or f32",
                self.dtype
            )));
        }
        if let Some((i, l)) = self
            .layers
            .iter()
            .enumerate()
            .find(|(_, l)| l.width == 0 || l.window == Some(0))
        {
            return Err(RuntimeError::Usage(format!(
                "KV cache: layer {i} has width {} and window {:?}; both must be at least 1",
                l.width, l.window
            )));
        }
        Ok(())
    }

    /// Rows a layer keeps.
    pub fn rows(&self, layer: &LayerSpec) -> u32 {
        match layer.window {
            Some(w) => w.saturating_add(self.max_chunk).min(self.context),
            None => self.context,
        }
    }

    /// True when `layer` is kept as a ring (its window plus a chunk is
    /// shorter than the context).
    pub fn is_ring(&self, layer: &LayerSpec) -> bool {
        self.rows(layer) < self.context
    }

    /// Bytes of one K (or V) row of `layer`.
    pub fn row_bytes(&self, layer: &LayerSpec) -> u64 {
        self.dtype.row_bytes(layer.width).unwrap_or(0) as u64
    }

    /// Memory per layer and per token.
    pub fn memory_report(&self) -> MemoryReport {
        let layers: Vec<LayerMemory> = self
            .layers
            .iter()
            .map(|l| {
                let token_bytes = 2 * self.row_bytes(l);
                let rows = self.rows(l);
                LayerMemory {
                    rows,
                    token_bytes,
                    bytes: rows as u64 * token_bytes,
                    ring: self.is_ring(l),
                }
            })
            .collect();
        let sum = |ring: bool| -> u64 {
            layers
                .iter()
                .filter(|l| l.ring == ring)
                .map(|l| l.bytes)
                .sum()
        };
        MemoryReport {
            total_bytes: layers.iter().map(|l| l.bytes).sum(),
            bytes_per_token: layers
                .iter()
                .filter(|l| !l.ring)
                .map(|l| l.token_bytes)
                .sum(),
            ring_bytes: sum(true),
            layers,
        }
    }

    /// Bytes of K plus V for each layer.
    pub fn bytes_per_layer(&self) -> Vec<u64> {
        self.memory_report()
            .layers
            .iter()
            .map(|l| l.bytes)
            .collect()
    }

    /// Total bytes the cache needs.
    pub fn total_bytes(&self) -> u64 {
        self.memory_report().total_bytes
    }

    /// Bytes one more token of context costs (layers without a window).
    pub fn bytes_per_token(&self) -> u64 {
        self.layers
            .iter()
            .filter(|l| l.window.is_none())
            .map(|l| 2 * self.row_bytes(l))
            .sum()
    }

    /// Admission check before allocating: does this cache fit `budget`
    /// bytes? Returns the bytes it needs.
    pub fn admit(&self, budget: u64) -> Result<u64, RuntimeError> {
        self.validate()?;
        let report = self.memory_report();
        let need = report.total_bytes;
        if need > budget {
            return Err(RuntimeError::Usage(format!(
                "KV cache: {} tokens need {need} bytes ({} per token over {} layers, plus {} in rings), \
                 more than the budget of {budget}; shorten the context to at most {} tokens or raise the budget",
                self.context,
                report.bytes_per_token,
                self.layers.len(),
                report.ring_bytes,
                self.max_context(budget)
            )));
        }
        Ok(need)
    }

    /// The longest context (keeping this layout and chunk size) whose cache
    /// fits `budget` bytes; 0 when not even one token fits.
    pub fn max_context(&self, budget: u64) -> u32 {
        let fits = |context: u32| {
            let c = CacheConfig {
                context,
                ..self.clone()
            };
            c.memory_report().total_bytes <= budget
        };
        let (mut lo, mut hi) = (0u32, u32::MAX);
        if fits(hi) {
            return hi;
        }
        // Invariant: fits(lo) (or lo == 0), !fits(hi).
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }
}
