//! Scoped buffer pools for transient tensors.
//!
//! Allocations land in the innermost open scope; ending a scope returns its
//! buffers to free lists keyed by exact size, never to the system. The next
//! step of the same shape finds every size it needs on the free lists, so a
//! steady-state decode allocates nothing (the `pool_allocations` counter
//! proves it). Reuse is safe across in-flight work because every write to a
//! pooled buffer happens inside a command buffer, and command buffers run in
//! submission order.

use std::collections::HashMap;
use weft_graph::BufferId;

/// Kinds of scope, as the seed runtime named them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum PoolScope {
    /// One prefill layer (or group of layers).
    PrefillLayer,
    /// One decode token.
    DecodeToken,
    /// Host-written inputs that must stay unique until their command buffer completes.
    Inputs,
    /// The implicit scope of a session that opened none.
    Session,
}

/// Pool figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Buffers the pool owns (in use or free).
    pub buffers: usize,
    /// Bytes the pool owns.
    pub bytes: u64,
    /// Highest number of bytes in use at once.
    pub peak_in_use: u64,
    /// Bytes in use now.
    pub in_use: u64,
    /// Buffers allocated from the system, ever.
    pub allocations: u64,
    /// Allocations served from a free list, ever.
    pub reuses: u64,
}

#[derive(Default)]
pub(crate) struct Pools {
    free: HashMap<u64, Vec<BufferId>>,
    scopes: Vec<(PoolScope, Vec<(BufferId, u64)>)>,
    pub(crate) stats: PoolStats,
}

impl Pools {
    /// A free buffer of exactly `bytes`, if one is waiting.
    pub(crate) fn take(&mut self, bytes: u64) -> Option<BufferId> {
        let id = self.free.get_mut(&bytes)?.pop()?;
        self.stats.reuses += 1;
        self.note_in_use(id, bytes);
        Some(id)
    }

    /// Registers a buffer the executor just allocated for the pool.
    pub(crate) fn adopt(&mut self, id: BufferId, bytes: u64) {
        self.stats.buffers += 1;
        self.stats.bytes += bytes;
        self.stats.allocations += 1;
        self.note_in_use(id, bytes);
    }

    fn note_in_use(&mut self, id: BufferId, bytes: u64) {
        if self.scopes.is_empty() {
            self.scopes.push((PoolScope::Session, Vec::new()));
        }
        if let Some((_, list)) = self.scopes.last_mut() {
            list.push((id, bytes));
        }
        self.stats.in_use += bytes;
        self.stats.peak_in_use = self.stats.peak_in_use.max(self.stats.in_use);
    }

    pub(crate) fn begin(&mut self, kind: PoolScope) {
        self.scopes.push((kind, Vec::new()));
    }

    /// Ends the innermost scope, recycling its buffers. Returns its kind.
    pub(crate) fn end(&mut self) -> Option<PoolScope> {
        let (kind, list) = self.scopes.pop()?;
        for (id, bytes) in list {
            self.stats.in_use -= bytes;
            self.free.entry(bytes).or_default().push(id);
        }
        Some(kind)
    }

    pub(crate) fn depth(&self) -> usize {
        self.scopes.len()
    }

    /// Forgets every free buffer, returning their ids so the executor can
    /// release their memory.
    pub(crate) fn release_free(&mut self) -> Vec<(BufferId, u64)> {
        let mut out = Vec::new();
        for (bytes, ids) in self.free.drain() {
            for id in ids {
                self.stats.buffers -= 1;
                self.stats.bytes -= bytes;
                out.push((id, bytes));
            }
        }
        out
    }
}
