//! Step plans: a decode step records the same nodes token after token;
//! only positions, cache rows and uploaded bytes change. The first time a
//! structure is submitted, its fusion merges and schedule (on CUDA also its
//! captured graphs' keys) are kept; a later recording equal to it in
//! everything but those values skips fusion and scheduling (on CUDA also
//! device preparation, replaying the graphs with its own values).
//!
//! Sound because the kept schedule is computed on position-independent
//! ranges ([`crate::widen::widen`]): a cache write (`set_rows`) declares the whole
//! destination and attention reads the cache's whole capacity (as its CUDA
//! kernel does), so the schedule orders every pair of nodes that could
//! conflict at any position; everything else must be equal, ranges
//! included.

use crate::config::ExecutorConfig;
use crate::executor::GraphExecutor;
use crate::fusion::Merge;
use crate::memory::Storage;
use std::collections::HashSet;
use std::sync::Arc;
use weft_graph::reorder::Strategy;
use weft_graph::{BufferId, Label, Node, Schedule};
use weft_ops::OpNode;

/// Plans kept per executor: a decode step and a prefill chunk size or two
/// for each sequence a server keeps (each sequence's cache is its own
/// buffers, so its steps are their own structure), most recent first.
pub(crate) const MAX_PLANS: usize = 64;

/// What a recording was turned into, and what it must equal to reuse it.
pub(crate) struct StepPlan {
    /// The recording before fusion (ranges widened), its fences, the pool
    /// buffers fusion could treat as dead, and the settings.
    pub nodes: Vec<Node>,
    pub payloads: Vec<OpNode>,
    pub fences: Vec<bool>,
    pub dead: HashSet<BufferId>,
    pub config: ExecutorConfig,
    pub strategy: Option<Strategy>,
    /// The fusion pass's merges and the schedule of the fused recording,
    /// with the fused nodes' labels and layers (for jobs and errors).
    pub merges: Vec<Vec<Merge>>,
    pub schedule: Schedule,
    pub labels: Vec<(Label, Option<u32>)>,
    /// CUDA: per command buffer its graph's key and the storage it uses
    /// (empty on the CPU, which resolves pointers every step).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub keys: Vec<u64>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub keep_alive: Vec<Vec<Arc<Storage>>>,
    /// CUDA: every buffer the graphs point into (a released and
    /// reallocated id would have new memory).
    pub buffers: Vec<(BufferId, Arc<Storage>)>,
}

impl StepPlan {
    /// Is a recording (ranges already widened) the same structure?
    pub(crate) fn matches(
        &self,
        exec: &GraphExecutor,
        nodes: &[Node],
        payloads: &[OpNode],
        fences: &[bool],
        dead: &HashSet<BufferId>,
        strategy: Option<Strategy>,
    ) -> bool {
        // Cheap and telling checks first: alternating structures differ
        // in their dead pool buffers already.
        self.nodes.len() == nodes.len()
            && self.strategy == strategy
            && &self.dead == dead
            && self.fences == fences
            && self.config == exec.config
            && self.nodes.iter().zip(nodes).all(|(a, b)| {
                a.op == b.op && a.layer == b.layer && a.reads == b.reads && a.writes == b.writes
            })
            && self
                .payloads
                .iter()
                .zip(payloads)
                .all(|(a, b)| same_payload(a, b))
            && self.buffers.iter().all(|(id, storage)| {
                exec.entry(*id)
                    .is_ok_and(|e| Arc::ptr_eq(&e.storage, storage))
            })
    }
}

/// Same op structure and tensors; attention's cache views may differ in
/// rows (the visible extent is a step value).
fn same_payload(a: &OpNode, b: &OpNode) -> bool {
    if !a.op.same_structure(&b.op) || a.outputs != b.outputs || a.inputs.len() != b.inputs.len() {
        return false;
    }
    let cache_view = a.op.attention_params().is_some();
    a.inputs
        .iter()
        .zip(&b.inputs)
        .enumerate()
        .all(|(k, (x, y))| {
            if cache_view && (k == 1 || k == 2) {
                x.buffer == y.buffer
                    && x.offset == y.offset
                    && x.dtype == y.dtype
                    && x.cols() == y.cols()
            } else {
                x == y
            }
        })
}
