//! The KV cache and its transactions.
//!
//! A step asks for a [`CacheSpan`] (`plan_prefill` / `plan_next_step`:
//! planning changes nothing), records its writes into the rows the span
//! names, and only after every submitted command buffer has drained does it
//! publish the new position (`commit_prefill` / `commit_step`). Any failure
//! after work was submitted poisons the cache: every later plan, commit or
//! snapshot is refused until `reset()` or `restore()`, so a half-written
//! cache can never pass for a valid one.
//!
//! Model-agnostic: a layer is K and V rows of some width, optionally a ring
//! of `window + max_chunk` rows for sliding-window attention.

mod chunking;
mod span;

pub use chunking::{ChunkPolicy, LARGE_WEIGHTS_BYTES};
pub use span::{CacheSpan, LayerSpan};

use crate::{GraphExecutor, RuntimeError};
use weft_ops::{DType, Tensor};

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
    /// Element type of K and V rows.
    pub dtype: DType,
}

impl CacheConfig {
    /// Rows a layer keeps.
    pub fn rows(&self, layer: &LayerSpec) -> u32 {
        match layer.window {
            Some(w) => (w + self.max_chunk).min(self.context),
            None => self.context,
        }
    }

    /// Bytes of K plus V for each layer.
    pub fn bytes_per_layer(&self) -> Vec<u64> {
        self.layers
            .iter()
            .map(|l| 2 * self.rows(l) as u64 * self.dtype.row_bytes(l.width).unwrap_or(0) as u64)
            .collect()
    }

    /// Total bytes the cache needs.
    pub fn total_bytes(&self) -> u64 {
        self.bytes_per_layer().iter().sum()
    }

    /// Bytes one more token of context costs (layers without a window).
    pub fn bytes_per_token(&self) -> u64 {
        self.layers
            .iter()
            .filter(|l| l.window.is_none())
            .map(|l| 2 * self.dtype.row_bytes(l.width).unwrap_or(0) as u64)
            .sum()
    }

    /// Admission check before allocating: does this cache fit `budget` bytes?
    pub fn admit(&self, budget: u64) -> Result<u64, RuntimeError> {
        let need = self.total_bytes();
        if need > budget {
            return Err(RuntimeError::Usage(format!(
                "a cache for {} tokens needs {need} bytes ({} per token over {} layers), more than the budget of {budget}",
                self.context,
                self.bytes_per_token(),
                self.layers.len()
            )));
        }
        Ok(need)
    }
}

/// One layer's K and V rows on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerCache {
    pub k: Tensor,
    pub v: Tensor,
    /// Ring size, for windowed layers.
    pub ring: Option<u32>,
    pub window: Option<u32>,
}

/// A KV cache with transactional spans.
pub struct KvCache {
    config: CacheConfig,
    layers: Vec<LayerCache>,
    position: u32,
    poisoned: Option<String>,
}

impl KvCache {
    /// Allocates the cache on `exec`'s device.
    pub fn new(exec: &mut GraphExecutor, config: CacheConfig) -> Result<KvCache, RuntimeError> {
        if config.context == 0 || config.max_chunk == 0 {
            return Err(RuntimeError::Usage(
                "a cache needs a context and a chunk size of at least one token".into(),
            ));
        }
        let mut layers = Vec::with_capacity(config.layers.len());
        for (i, spec) in config.layers.iter().enumerate() {
            let rows = config.rows(spec) as usize;
            let k =
                exec.alloc_tensor(config.dtype, &[rows, spec.width], &format!("cache.k.{i}"))?;
            let v =
                exec.alloc_tensor(config.dtype, &[rows, spec.width], &format!("cache.v.{i}"))?;
            let ring = spec
                .window
                .map(|_| rows as u32)
                .filter(|&r| r < config.context);
            layers.push(LayerCache {
                k,
                v,
                ring,
                window: spec.window,
            });
        }
        Ok(KvCache {
            config,
            layers,
            position: 0,
            poisoned: None,
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Published position: tokens `0..position()` are in the cache.
    pub fn position(&self) -> u32 {
        self.position
    }

    /// The layer's rows.
    pub fn layer(&self, layer: usize) -> &LayerCache {
        &self.layers[layer]
    }

    pub fn layers(&self) -> &[LayerCache] {
        &self.layers
    }

    /// Why the cache is poisoned, if it is.
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    fn refuse_if_poisoned(&self, what: &str) -> Result<(), RuntimeError> {
        match &self.poisoned {
            Some(why) => Err(RuntimeError::Usage(format!(
                "cannot {what}: the KV cache is poisoned ({why}); call reset() and replay the sequence, or restore() a snapshot"
            ))),
            None => Ok(()),
        }
    }

    /// Plans writing `n` tokens at the current position. Changes nothing.
    pub fn plan_prefill(&self, n: u32) -> Result<CacheSpan, RuntimeError> {
        self.refuse_if_poisoned("plan a prefill")?;
        if n == 0 {
            return Err(RuntimeError::Usage(
                "cannot plan a prefill of 0 tokens".into(),
            ));
        }
        if n > self.config.max_chunk {
            return Err(RuntimeError::Usage(format!(
                "a step of {n} tokens exceeds the cache's chunk limit of {}",
                self.config.max_chunk
            )));
        }
        let end = self.position as u64 + n as u64;
        if end > self.config.context as u64 {
            return Err(RuntimeError::Usage(format!(
                "{n} more tokens at position {} exceed the context length of {}",
                self.position, self.config.context
            )));
        }
        Ok(CacheSpan::new(self.position, n, &self.layers))
    }

    /// Plans one decode token. Changes nothing.
    pub fn plan_next_step(&self) -> Result<CacheSpan, RuntimeError> {
        self.plan_prefill(1)
    }

    /// Publishes a drained prefill of `n` tokens starting at `start`.
    pub fn commit_prefill(&mut self, start: u32, n: u32) -> Result<(), RuntimeError> {
        self.refuse_if_poisoned("commit")?;
        if start != self.position || n == 0 || start as u64 + n as u64 > self.config.context as u64
        {
            let why = format!(
                "commit of {n} tokens at {start} does not match the cache at position {}",
                self.position
            );
            self.poison(&why);
            return Err(RuntimeError::Usage(why));
        }
        self.position = start + n;
        Ok(())
    }

    /// Publishes a drained decode step at `position`.
    pub fn commit_step(&mut self, position: u32) -> Result<(), RuntimeError> {
        self.commit_prefill(position, 1)
    }

    /// Marks the cache unusable until `reset()` or `restore()`.
    pub fn poison(&mut self, why: &str) {
        if self.poisoned.is_none() {
            self.poisoned = Some(why.to_string());
        }
    }

    /// Empties the cache (position 0) and clears poison. Old rows stay in
    /// memory but are never visible: attention only reads published positions.
    pub fn reset(&mut self) {
        self.position = 0;
        self.poisoned = None;
    }
}
