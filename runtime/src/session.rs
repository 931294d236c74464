//! Recording sessions: the [`Recorder`] model code records into, and the
//! checks every node passes when recorded (validation, memory bounds,
//! declared ranges, the device's support). `commit.rs` turns a recording
//! into submitted command buffers.

use crate::executor::GraphExecutor;
use crate::pool::PoolScope;
use crate::trace::host_slice;
use crate::RuntimeError;
use std::time::Instant;
use weft_graph::{ByteRange, Label, Node};
use weft_ops::{DType, OpError, OpNode, Recorder, Tensor};

/// How a session turns its recording into levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionMode {
    /// Recorded order; a barrier only where needed (and where asked for).
    Eager,
    /// Levels from the reorder pass (unless the executor's `reorder` is off).
    Recorded,
}

/// Measured time of one node (from `finish_with_timing`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct NodeTiming {
    pub op: &'static str,
    pub label: String,
    pub layer: Option<u32>,
    pub command_buffer: usize,
    pub level: u32,
    /// From the first piece's start to the last piece's end.
    pub micros: f64,
}

/// An open recording. Dropping it unfinished discards what it recorded.
pub struct GraphSession<'e> {
    pub(crate) exec: &'e mut GraphExecutor,
    pub(crate) mode: SessionMode,
    pub(crate) nodes: Vec<Node>,
    pub(crate) payloads: Vec<OpNode>,
    pub(crate) fences: Vec<bool>,
    layer: Option<u32>,
    fence_next: bool,
    scope_depth: usize,
    /// When recording began, and open pool scopes (for traces).
    pub(crate) started: Instant,
    open_scopes: Vec<(PoolScope, Instant)>,
}

impl<'e> GraphSession<'e> {
    pub(crate) fn new(exec: &'e mut GraphExecutor, mode: SessionMode) -> Self {
        let scope_depth = exec.pools.depth();
        // Only scopes this session ends count as dead for its fusion pass.
        exec.pools.take_ended();
        // Steps repeat: room for as many nodes as the last recording had.
        let room = exec.last_recording_len;
        Self {
            exec,
            mode,
            nodes: Vec::with_capacity(room),
            payloads: Vec::with_capacity(room),
            fences: Vec::with_capacity(room),
            layer: None,
            fence_next: false,
            scope_depth,
            started: Instant::now(),
            open_scopes: Vec::new(),
        }
    }

    pub fn mode(&self) -> SessionMode {
        self.mode
    }

    /// The layer the next nodes belong to (for command-buffer cuts and dumps).
    pub fn set_layer(&mut self, layer: Option<u32>) {
        self.layer = layer;
    }

    /// Nodes recorded so far.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The executor behind this session.
    pub fn executor(&mut self) -> &mut GraphExecutor {
        self.exec
    }

    /// An explicit barrier. Eager sessions honour it (a barrier before any
    /// node is a no-op); recorded sessions derive barriers from ranges and
    /// ignore it.
    pub fn barrier(&mut self) {
        if self.mode == SessionMode::Eager && !self.nodes.is_empty() {
            self.fence_next = true;
        }
    }

    /// Marks `t` as a named intermediate. When the executor collects taps
    /// (diagnostics: tensor dumps, reference comparisons), a copy into a
    /// buffer of its own is recorded and handed back by
    /// [`GraphExecutor::take_taps`] after the step; otherwise nothing happens.
    /// `name` is only formatted when taps are collected.
    pub fn tap(&mut self, name: impl std::fmt::Display, t: Tensor) -> Result<(), RuntimeError> {
        if self.exec.taps.is_none() {
            return Ok(());
        }
        let name = name.to_string();
        let copy = self
            .exec
            .alloc_tensor(DType::F32, t.shape.dims(), &format!("tap.{name}"))?;
        let node = OpNode::new(weft_ops::Op::Copy, vec![t], vec![copy]);
        let (reads, writes) = node.ranges();
        self.record_with_ranges(
            node,
            format!("tap.{name}").into(),
            Some(reads),
            Some(writes),
        )?;
        if let Some(taps) = self.exec.taps.as_mut() {
            taps.push((name.to_string(), copy));
        }
        Ok(())
    }

    /// Opens a pool scope; tensors allocated until the matching
    /// [`end_pool_scope`](Self::end_pool_scope) are recycled when it ends.
    pub fn begin_pool_scope(&mut self, kind: PoolScope) {
        self.exec.pools.begin(kind);
        self.open_scopes.push((kind, Instant::now()));
    }

    /// Ends the innermost scope opened in this session.
    pub fn end_pool_scope(&mut self) -> Result<PoolScope, RuntimeError> {
        if self.exec.pools.depth() <= self.scope_depth {
            return Err(RuntimeError::Usage(
                "end_pool_scope without a matching begin_pool_scope in this session".into(),
            ));
        }
        let kind = self
            .exec
            .pools
            .end_explicit()
            .ok_or_else(|| RuntimeError::Usage("no pool scope is open".into()))?;
        if let (Some((k, start)), Some(state)) = (self.open_scopes.pop(), &self.exec.trace) {
            let args = serde_json::json!({"bytes_in_use": self.exec.pools.stats.in_use});
            host_slice(
                &state.host,
                self.exec.epoch,
                start,
                &format!("pool scope {k:?}"),
                "pool",
                args,
            );
        }
        Ok(kind)
    }

    /// Records `node` with explicit ranges. `None` means "unknown": refused
    /// in a recorded session (naming the op and label); in an eager session
    /// the node gets a barrier before and after it.
    pub fn record_with_ranges(
        &mut self,
        node: OpNode,
        label: Label,
        reads: Option<Vec<ByteRange>>,
        writes: Option<Vec<ByteRange>>,
    ) -> Result<(), RuntimeError> {
        node.validate()?;
        self.record_validated(node, label, reads, writes)
    }

    /// `record_with_ranges` for a node that already passed `validate`.
    fn record_validated(
        &mut self,
        node: OpNode,
        label: Label,
        reads: Option<Vec<ByteRange>>,
        writes: Option<Vec<ByteRange>>,
    ) -> Result<(), RuntimeError> {
        let unknown = reads.is_none() || writes.is_none();
        let (reads, writes) = match (self.mode, unknown) {
            (SessionMode::Recorded, _) | (SessionMode::Eager, false) => (reads, writes),
            (SessionMode::Eager, true) => {
                let (r, w) = node.ranges();
                (Some(r), Some(w))
            }
        };
        let graph_node = Node::checked(node.op.name(), label, self.layer, reads, writes)?;
        self.check_memory(&node, &graph_node)?;
        self.supports(&node)?;
        self.fences.push(self.fence_next || unknown);
        self.fence_next = unknown;
        self.nodes.push(graph_node);
        self.payloads.push(node);
        Ok(())
    }

    /// Does the executor's device implement `node`?
    fn supports(&self, node: &OpNode) -> Result<(), RuntimeError> {
        Ok(self.exec.backend.accepts(node)?)
    }

    /// Every tensor lies inside a live buffer; nothing writes read-only memory;
    /// declared ranges cover the tensors (so kernels cannot touch undeclared bytes).
    fn check_memory(&self, node: &OpNode, graph_node: &Node) -> Result<(), RuntimeError> {
        for t in node.inputs.iter().chain(&node.outputs) {
            let e = self.exec.entry(t.buffer)?;
            if t.offset + t.bytes() > e.storage.len() as u64 {
                return Err(OpError::Record(format!(
                    "`{}` ({}): tensor {t:?} runs past the end of buffer `{}` ({} bytes)",
                    node.op.name(),
                    graph_node.label,
                    e.name,
                    e.storage.len()
                ))
                .into());
            }
        }
        for w in &graph_node.writes {
            let e = self.exec.entry(w.buffer)?;
            if !e.storage.writable() {
                return Err(OpError::Record(format!(
                    "`{}` ({}) writes read-only buffer `{}`",
                    node.op.name(),
                    graph_node.label,
                    e.name
                ))
                .into());
            }
        }
        let covered = |t: &Tensor, ranges: &[ByteRange]| {
            let r = t.range();
            ranges
                .iter()
                .any(|x| x.buffer == r.buffer && x.start <= r.start && r.end <= x.end)
        };
        let inputs_ok = node.inputs.iter().all(|t| covered(t, &graph_node.reads));
        if !inputs_ok && self.mode == SessionMode::Recorded && node.op.attention_params().is_none()
        {
            return Err(OpError::Record(format!(
                "`{}` ({}): declared reads do not cover its inputs",
                node.op.name(),
                graph_node.label
            ))
            .into());
        }
        Ok(())
    }

    /// Closes the pool scopes this session opened and left open.
    pub(crate) fn end_scopes(&mut self) {
        while self.exec.pools.depth() > self.scope_depth {
            self.exec.pools.end();
        }
    }

    /// Node `i`'s label and layer: from `labels` when given, else this
    /// session's node.
    pub(crate) fn label_of(
        &self,
        i: usize,
        labels: Option<&[(Label, Option<u32>)]>,
    ) -> (Label, Option<u32>) {
        match labels {
            Some(l) => l[i].clone(),
            None => (self.nodes[i].label.clone(), self.nodes[i].layer),
        }
    }

    /// Whether the node labelled `label` is the one fault injection fails.
    pub(crate) fn take_fault(&mut self, label: &str) -> bool {
        let Some(f) = &self.exec.config.diagnostics.fault else {
            return false;
        };
        if !label.contains(f.label.as_str()) {
            return false;
        }
        let hit = self.exec.fault_seen == f.after;
        self.exec.fault_seen += 1;
        if hit {
            self.exec.config.diagnostics.fault = None;
            self.exec.fault_seen = 0;
        }
        hit
    }
}

impl Recorder for GraphSession<'_> {
    fn alloc(&mut self, dtype: DType, dims: &[usize]) -> Result<Tensor, OpError> {
        self.exec
            .pool_alloc(dtype, dims)
            .map_err(|e| OpError::Record(e.to_string()))
    }

    fn record(&mut self, node: OpNode, label: Label) -> Result<(), OpError> {
        let (reads, writes) = node.ranges();
        self.record_validated(node, label, Some(reads), Some(writes))
            .map_err(|e| match e {
                RuntimeError::Op(op) => op,
                other => OpError::Record(other.to_string()),
            })
    }
}

impl Drop for GraphSession<'_> {
    /// Dropping an unfinished session discards its recording (nothing was
    /// submitted) and closes the pool scopes it opened.
    fn drop(&mut self) {
        self.end_scopes();
    }
}
