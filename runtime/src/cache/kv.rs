//! The KV cache and its transaction rules: plan (changes nothing), publish
//! after the step drained, poison on any failure after submission.
//!
//! Rows live on the executor's device, one K and one V tensor per layer;
//! a windowed layer whose window plus one chunk is shorter than the context
//! is a ring (position `p` lives in slot `p % ring`). Attention only reads
//! published positions, so rows past `position()` (an unpublished or failed
//! step's writes) are invisible; what a failure may break is the *claim*
//! that the rows below `position()` are the sequence's, which is why a
//! failure poisons instead of rolling back silently.

use super::config::CacheConfig;
use super::lineage::Lineage;
use super::span::CacheSpan;
use crate::{GraphExecutor, RuntimeError};
use weft_ops::Tensor;

/// One layer's K and V rows on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerCache {
    pub k: Tensor,
    pub v: Tensor,
    /// Ring size, for windowed layers kept as rings.
    pub ring: Option<u32>,
    pub window: Option<u32>,
}

impl LayerCache {
    /// Row (slot) that holds position `p`.
    pub fn slot(&self, p: u32) -> u32 {
        self.ring.map_or(p, |r| p % r)
    }

    /// First position a query at `position` (or later) can still see: the
    /// rows a rollback or a swap must bring back start here.
    pub fn needed_from(&self, position: u32) -> u32 {
        self.window.map_or(0, |w| {
            position.saturating_add(1).saturating_sub(w).min(position)
        })
    }
}

/// A KV cache with transactional spans.
#[derive(Debug)]
pub struct KvCache {
    pub(super) config: CacheConfig,
    pub(super) layers: Vec<LayerCache>,
    pub(super) position: u32,
    pub(super) poisoned: Option<String>,
    pub(super) lineage: Lineage,
}

impl KvCache {
    /// Allocates the cache on `exec`'s device (outside the pools).
    pub fn new(exec: &mut GraphExecutor, config: CacheConfig) -> Result<KvCache, RuntimeError> {
        config.validate()?;
        let mut layers = Vec::with_capacity(config.layers.len());
        for (i, spec) in config.layers.iter().enumerate() {
            let rows = config.rows(spec) as usize;
            let k =
                exec.alloc_tensor(config.dtype, &[rows, spec.width], &format!("cache.k.{i}"))?;
            let v =
                exec.alloc_tensor(config.dtype, &[rows, spec.width], &format!("cache.v.{i}"))?;
            let ring = config.is_ring(spec).then_some(rows as u32);
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
            lineage: Lineage::fresh(),
        })
    }

    /// Runs the admission check against `budget` bytes, then allocates.
    pub fn with_budget(
        exec: &mut GraphExecutor,
        config: CacheConfig,
        budget: u64,
    ) -> Result<KvCache, RuntimeError> {
        config.admit(budget)?;
        Self::new(exec, config)
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Published position: tokens `0..position()` are in the cache.
    pub fn position(&self) -> u32 {
        self.position
    }

    /// The layer's rows. Panics if `layer` is out of range (a model bug).
    pub fn layer(&self, layer: usize) -> &LayerCache {
        &self.layers[layer]
    }

    pub fn layers(&self) -> &[LayerCache] {
        &self.layers
    }

    /// Bytes of keys and values a query at `position` reads across the
    /// layers: the cells it may see (its window's, or the ring's), each a
    /// key row and a value row.
    pub fn bytes_read_at(&self, position: u32) -> u64 {
        self.layers
            .iter()
            .map(|l| {
                let cells = (position as u64 + 1)
                    .min(l.ring.map_or(u64::MAX, u64::from))
                    .min(l.window.map_or(u64::MAX, u64::from));
                cells * (l.k.row_bytes() + l.v.row_bytes()) as u64
            })
            .sum()
    }

    /// Why the cache is poisoned, if it is.
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// True when the cache is poisoned.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    pub(super) fn refuse_if_poisoned(&self, what: &str) -> Result<(), RuntimeError> {
        match &self.poisoned {
            Some(why) => Err(RuntimeError::Usage(format!(
                "KV cache: cannot {what}: the cache is poisoned ({why}); \
                 call reset() and replay the sequence, or restore() a snapshot"
            ))),
            None => Ok(()),
        }
    }

    /// Plans writing `n` tokens at the current position. Changes nothing;
    /// refuses (without poisoning) `n = 0`, more than `max_chunk` tokens, a
    /// step past the context length, or a poisoned cache.
    pub fn plan_prefill(&self, n: u32) -> Result<CacheSpan, RuntimeError> {
        self.plan_ahead(0, n)
    }

    /// Plans writing `n` tokens after `ahead` tokens that were submitted but
    /// not yet published (a pipelined decode records step `k + 1` while step
    /// `k` runs; each is published, in order, once drained). The same
    /// refusals as [`KvCache::plan_prefill`], with the in-flight tokens
    /// counted against the context. Step `k + 1` reads the rows step `k`
    /// wrote before they are published: the device runs steps in submission
    /// order. A step that is never published wrote only rows past the
    /// published position, which attention never reads before the next
    /// step there rewrites them (in a ring too: a ring holds at least the
    /// window, so the slot it overwrote was outside every later window).
    pub fn plan_ahead(&self, ahead: u32, n: u32) -> Result<CacheSpan, RuntimeError> {
        self.refuse_if_poisoned("plan a step")?;
        if n == 0 {
            return Err(RuntimeError::Usage(
                "KV cache: cannot plan a step of 0 tokens; pass at least one token".into(),
            ));
        }
        if n > self.config.max_chunk {
            return Err(RuntimeError::Usage(format!(
                "KV cache: a step of {n} tokens exceeds the chunk limit of {}; split the prompt (ChunkPolicy) or build the cache with a larger max_chunk",
                self.config.max_chunk
            )));
        }
        let start = self.position as u64 + ahead as u64;
        if start + n as u64 > self.config.context as u64 {
            return Err(RuntimeError::Usage(format!(
                "KV cache: {n} more tokens at position {start} exceed the context length of {}; \
                 start a new sequence (reset()) or build a longer cache",
                self.config.context
            )));
        }
        Ok(CacheSpan::new(start as u32, n, &self.layers))
    }

    /// Plans one decode token. Changes nothing.
    pub fn plan_next_step(&self) -> Result<CacheSpan, RuntimeError> {
        self.plan_prefill(1)
    }

    /// Publishes a drained prefill of `n` tokens starting at `start`. A
    /// publish that does not match the cache poisons it.
    pub fn commit_prefill(&mut self, start: u32, n: u32) -> Result<(), RuntimeError> {
        self.refuse_if_poisoned("commit")?;
        let fits = start as u64 + n as u64 <= self.config.context as u64;
        if start != self.position || n == 0 || !fits {
            let why = format!(
                "a publish of {n} tokens at {start} does not match the cache at position {} (context {})",
                self.position, self.config.context
            );
            self.poison(&why);
            return Err(RuntimeError::Usage(format!(
                "KV cache: {why}; the cache is now poisoned: call reset() and replay the sequence, or restore() a snapshot"
            )));
        }
        self.position = start + n;
        Ok(())
    }

    /// Publishes a drained decode step at `position`.
    pub fn commit_step(&mut self, position: u32) -> Result<(), RuntimeError> {
        self.commit_prefill(position, 1)
    }

    /// First half of a publish that cannot fail: checks that a drained
    /// decode step at `position` may be published and hands back a ticket;
    /// [`KvCache::publish_step_end`] then publishes it. A failed check
    /// poisons the cache (work was already submitted).
    pub fn validate_step_commit(&mut self, position: u32) -> Result<StepTicket<'_>, RuntimeError> {
        self.refuse_if_poisoned("validate a step")?;
        if let Some(why) = self.step_commit_problem(position) {
            self.poison(&why);
            return Err(RuntimeError::Usage(format!(
                "KV cache: {why}; the cache is now poisoned: call reset() and replay the sequence, or restore() a snapshot"
            )));
        }
        Ok(StepTicket {
            cache: self,
            position,
            settled: false,
        })
    }

    /// Why a decode step at `position` cannot be validated, if it cannot.
    pub(crate) fn step_commit_problem(&self, position: u32) -> Option<String> {
        if let Some(why) = &self.poisoned {
            return Some(format!("the cache is poisoned ({why})"));
        }
        let fits = position < self.config.context;
        (position != self.position || !fits).then(|| {
            format!(
                "validation of a step at {position} failed: the cache is at position {} (context {})",
                self.position, self.config.context
            )
        })
    }

    /// Publishes a validated step. Cannot fail: the ticket borrowed the
    /// cache exclusively since validation, so nothing changed in between.
    pub fn publish_step_end(ticket: StepTicket<'_>) {
        ticket.publish();
    }

    /// Marks the cache unusable until `reset()` or `restore()`. The first
    /// reason is kept.
    pub fn poison(&mut self, why: &str) {
        if self.poisoned.is_none() {
            self.poisoned = Some(why.to_string());
        }
    }

    /// Empties the cache (position 0) and clears poison: a new sequence
    /// starts (snapshots of the old one can no longer be restored). Old rows
    /// stay in memory but are never visible: attention only reads published
    /// positions.
    pub fn reset(&mut self) {
        self.position = 0;
        self.poisoned = None;
        self.lineage = Lineage::fresh();
    }
}

/// A validated, not yet published decode step of one cache. Holding it
/// borrows the cache, so nothing can change between validation and
/// [`KvCache::publish_step_end`]. Dropping it unpublished (or calling
/// [`StepTicket::abort`]) poisons the cache: the step ran but was not kept.
#[must_use = "a validated step must be published (KvCache::publish_step_end) or aborted"]
pub struct StepTicket<'c> {
    cache: &'c mut KvCache,
    position: u32,
    settled: bool,
}

impl StepTicket<'_> {
    /// Position of the validated step.
    pub fn position(&self) -> u32 {
        self.position
    }

    /// Publishes the step: the cache moves to `position + 1`.
    pub fn publish(mut self) {
        self.cache.position = self.position + 1;
        self.settled = true;
    }

    /// Gives the step up: the cache is poisoned with `why`.
    pub fn abort(mut self, why: &str) {
        self.cache.poison(why);
        self.settled = true;
    }
}

impl Drop for StepTicket<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.cache.poison(&format!(
                "the validated step at {} was dropped without being published",
                self.position
            ));
        }
    }
}
