//! Scoped buffer pools for transient tensors.
//!
//! Allocations land in the innermost open scope; ending a scope returns its
//! buffers to free lists keyed by exact size, never to the system. The next
//! step of the same shape finds every size it needs on the free lists, so a
//! steady-state decode allocates nothing (the `pool_allocations` counter
//! proves it). Reuse is safe across in-flight work because every write to a
//! pooled buffer happens inside a command buffer, and command buffers run in
//! submission order.
//!
//! Inside one recording, reuse could add conflicts the reorder pass must
//! respect (a later scope writing a buffer an earlier one still reads). Scopes
//! are per layer (or per token), and every node of layer `l + 1` already
//! depends on layer `l` through the residual stream, so recycling at a layer
//! boundary adds no barrier; `runtime/tests/pool_scopes.rs` measures it,
//! comparing against the same recording with recycling deferred to its end
//! ([`GraphExecutor::set_pool_deferred_recycling`], a diagnosis switch).
//!
//! Scopes are opened with guards that end them on drop
//! ([`GraphSession::pool_scope`], [`GraphExecutor::pool_scope`]) or with the
//! seed's bracket pairs (`begin_prefill_pool_layer` / `end_prefill_pool_layer`,
//! `begin_decode_pool_token` / `end_decode_pool_token`, and the generic
//! `begin_pool_scope` / `end_pool_scope`). Persistent buffers (layer state,
//! the KV cache) come from `alloc_tensor` and bypass the pools;
//! [`GraphExecutor::release_pool_scratch`] frees what the pools hold unused.

use crate::{GraphExecutor, GraphSession, RuntimeError};
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use weft_graph::BufferId;

/// Kinds of scope, as hf2q's runtime named them.
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
    /// Diagnosis: an ending scope hands its buffers to the enclosing scope
    /// instead of the free lists, so nothing is reused inside a recording.
    defer_recycling: bool,
    /// Buffers recycled by an explicitly ended scope since the last
    /// [`Pools::take_ended`]: their contents are dead once read.
    ended: std::collections::HashSet<BufferId>,
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
        self.end_scope(false)
    }

    /// Ends the innermost scope that model code opened and closed itself:
    /// its tensors are dead from here on (the fusion pass may then drop
    /// writes to them that nothing else reads).
    pub(crate) fn end_explicit(&mut self) -> Option<PoolScope> {
        self.end_scope(true)
    }

    /// Buffers of explicitly ended scopes since the last call.
    pub(crate) fn take_ended(&mut self) -> std::collections::HashSet<BufferId> {
        std::mem::take(&mut self.ended)
    }

    fn end_scope(&mut self, explicit: bool) -> Option<PoolScope> {
        let (kind, list) = self.scopes.pop()?;
        if self.defer_recycling {
            if let Some((_, parent)) = self.scopes.last_mut() {
                parent.extend(list);
                return Some(kind);
            }
        }
        // Pushed in reverse, so the next scope's requests get the buffers
        // in the order this one got them: a repeated step records the same
        // tensors (and can reuse its plan) instead of alternating.
        for (id, bytes) in list.into_iter().rev() {
            self.stats.in_use -= bytes;
            self.free.entry(bytes).or_default().push(id);
            if explicit {
                self.ended.insert(id);
            }
        }
        Some(kind)
    }

    pub(crate) fn depth(&self) -> usize {
        self.scopes.len()
    }

    /// Kind of the innermost open scope.
    pub(crate) fn innermost(&self) -> Option<PoolScope> {
        self.scopes.last().map(|(kind, _)| *kind)
    }

    /// Ends scopes until `depth` remain.
    pub(crate) fn end_to(&mut self, depth: usize) {
        while self.scopes.len() > depth {
            self.end();
        }
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

/// An open pool scope of a session; ends (recycling its buffers) when
/// dropped. Records through it as through the session (it dereferences to
/// it). Scopes opened inside it and still open end with it.
pub struct SessionScope<'s, 'e> {
    session: &'s mut GraphSession<'e>,
    /// Scopes open below this one.
    below: usize,
}

impl<'e> Deref for SessionScope<'_, 'e> {
    type Target = GraphSession<'e>;
    fn deref(&self) -> &GraphSession<'e> {
        self.session
    }
}

impl<'e> DerefMut for SessionScope<'_, 'e> {
    fn deref_mut(&mut self) -> &mut GraphSession<'e> {
        self.session
    }
}

impl Drop for SessionScope<'_, '_> {
    /// Ends this scope (and any still open inside it) through the session,
    /// so the session's own bookkeeping sees every end.
    fn drop(&mut self) {
        while self.session.executor().pools.depth() > self.below {
            if self.session.end_pool_scope().is_err() {
                break;
            }
        }
    }
}

/// An open pool scope of an executor, outside any session (for example
/// host-written inputs shared by several sessions); ends on drop. It
/// dereferences to the executor.
pub struct ExecutorScope<'x> {
    exec: &'x mut GraphExecutor,
    below: usize,
}

impl Deref for ExecutorScope<'_> {
    type Target = GraphExecutor;
    fn deref(&self) -> &GraphExecutor {
        self.exec
    }
}

impl DerefMut for ExecutorScope<'_> {
    fn deref_mut(&mut self) -> &mut GraphExecutor {
        self.exec
    }
}

impl Drop for ExecutorScope<'_> {
    fn drop(&mut self) {
        self.exec.pools.end_to(self.below);
    }
}

impl<'e> GraphSession<'e> {
    /// Opens a pool scope that ends when the returned guard drops.
    pub fn pool_scope(&mut self, kind: PoolScope) -> SessionScope<'_, 'e> {
        let below = self.executor().pools.depth();
        self.begin_pool_scope(kind);
        SessionScope {
            session: self,
            below,
        }
    }

    /// hf2q's bracket: opens a scope for one prefill layer (or group).
    pub fn begin_prefill_pool_layer(&mut self) {
        self.begin_pool_scope(PoolScope::PrefillLayer);
    }

    /// Ends the scope `begin_prefill_pool_layer` opened.
    pub fn end_prefill_pool_layer(&mut self) -> Result<(), RuntimeError> {
        self.end_kind(PoolScope::PrefillLayer)
    }

    /// hf2q's bracket: opens a scope for one decode token.
    pub fn begin_decode_pool_token(&mut self) {
        self.begin_pool_scope(PoolScope::DecodeToken);
    }

    /// Ends the scope `begin_decode_pool_token` opened.
    pub fn end_decode_pool_token(&mut self) -> Result<(), RuntimeError> {
        self.end_kind(PoolScope::DecodeToken)
    }

    fn end_kind(&mut self, kind: PoolScope) -> Result<(), RuntimeError> {
        match self.executor().pools.innermost() {
            Some(open) if open == kind => self.end_pool_scope().map(|_| ()),
            open => Err(RuntimeError::Usage(format!(
                "pool: cannot end a {kind:?} scope: the innermost open scope is {open:?}; \
                 end scopes in the reverse order they were begun (or use pool_scope() guards)"
            ))),
        }
    }
}

impl GraphExecutor {
    /// Starts measuring `PoolStats::peak_in_use` afresh (from what is in use
    /// now), e.g. to see one phase's peak (a decode step after a prefill).
    pub fn reset_pool_peak(&mut self) {
        self.pools.stats.peak_in_use = self.pools.stats.in_use;
    }

    /// Diagnosis switch: with `defer` on, an ending scope hands its buffers
    /// to the enclosing scope instead of recycling them, so a recording
    /// reuses nothing until its outermost scope ends (at commit). Comparing
    /// barrier counts with it on and off shows what pooled reuse costs the
    /// schedule (nothing, for per-layer scopes: see `tests/pool_scopes.rs`).
    pub fn set_pool_deferred_recycling(&mut self, defer: bool) {
        self.pools.defer_recycling = defer;
    }

    /// Opens a pool scope outside any session that ends when the returned
    /// guard drops.
    pub fn pool_scope(&mut self, kind: PoolScope) -> ExecutorScope<'_> {
        let below = self.pools.depth();
        self.pools.begin(kind);
        ExecutorScope { exec: self, below }
    }
}
