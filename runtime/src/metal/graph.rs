//! Command buffers on Metal: one weft command buffer is one Metal command
//! buffer with one concurrent compute encoder. Levels are encoded in
//! order with a memory barrier (`MTLBarrierScopeBuffers`) between
//! consecutive levels and none inside a level: weft's schedule already
//! separates every conflicting pair, so mlx-native's own barrier tracking
//! and reordering stay off (weft never calls its tracked dispatches).
//!
//! The one exception: a matmul whose low-precision activations have no
//! valid f32 image (see `mod.rs`) gets a prologue that rebuilds it; the
//! prologues of a level are encoded after the level's barrier, followed by
//! one more barrier (counted in the barrier counter). Recordings from
//! weft's models never need it: their matmuls read rows their
//! `QuantizeRows` wrote.
//!
//! `enqueue` encodes and commits without waiting; the returned
//! [`MetalWork`] keeps every buffer the command buffer binds (and its
//! arena) alive until it completes, and `wait` reports the first failure:
//! a kernel's status word by node label, or the command buffer's error.

use super::MetalBackend;
use crate::executor::GraphExecutor;
use crate::memory::Storage;
use crate::RuntimeError;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use weft_graph::{CommandBufferSchedule, Node};
use weft_kernels::metal::mlx_native::metal::MTLCommandBufferStatus;
use weft_kernels::metal::mlx_native::{CommandEncoder, MlxBuffer};
use weft_kernels::metal::{
    read_u32s, status_message, Arena, MetalKernels, MetalTensor, MlxDType, NodeAux,
};
use weft_kernels::{Kernels, MetalTarget};
use weft_ops::{Op, OpNode, Tensor};

/// A node resolved to Metal buffers.
pub(crate) struct MetalNode {
    pub node: OpNode,
    pub ins: Vec<MetalTensor>,
    pub outs: Vec<MetalTensor>,
    /// Storage behind input 0 and output 0 (activation images).
    pub in0: Option<Arc<Storage>>,
    pub out0: Option<Arc<Storage>>,
    /// Every byte range the node writes, with its storage.
    pub writes: Vec<(Arc<Storage>, u64, u64)>,
    pub label: String,
    pub fail: bool,
}

/// One command buffer ready for the device: nodes in execution order, levels.
pub(crate) struct MetalCommandBuffer {
    pub nodes: Vec<MetalNode>,
    pub levels: Vec<Range<usize>>,
    pub keep_alive: Vec<Arc<Storage>>,
}

struct WorkState {
    encoder: Option<CommandEncoder>,
    error: Option<RuntimeError>,
    /// One status word per node, written by kernels that validate on the GPU.
    status: Option<MlxBuffer>,
    labels: Vec<(&'static str, String)>,
    label: String,
    arena: Option<Arena>,
    pool: Arc<Mutex<Vec<Arena>>>,
    keep_alive: Vec<Arc<Storage>>,
    completed: bool,
}

/// A submitted command buffer.
pub(crate) struct MetalWork {
    state: Mutex<WorkState>,
}

impl WorkState {
    /// Waits for the GPU (once), turns failures into errors by label and
    /// releases what the command buffer held.
    fn complete(&mut self) {
        if self.completed {
            return;
        }
        self.completed = true;
        if let Some(enc) = &self.encoder {
            match enc.wait_until_completed() {
                Err(e) => {
                    self.error.get_or_insert(RuntimeError::Execution {
                        op: "metal",
                        label: self.label.clone(),
                        message: format!("the command buffer failed: {e}"),
                    });
                }
                Ok(()) => self.check_status(),
            }
        }
        self.status = None;
        self.keep_alive.clear();
        if let Some(mut arena) = self.arena.take() {
            arena.reset();
            self.pool
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(arena);
        }
    }

    fn check_status(&mut self) {
        let Some(status) = &self.status else {
            return;
        };
        // SAFETY: the command buffer has completed, so nothing writes the
        // status words any more; the view holds one word per node.
        let words = unsafe { read_u32s(status, self.labels.len()) };
        if let Some((i, code)) = words.iter().enumerate().find(|(_, c)| **c != 0) {
            let (op, label) = &self.labels[i];
            self.error.get_or_insert(RuntimeError::Execution {
                op,
                label: label.clone(),
                message: status_message(*code),
            });
        }
    }
}

impl MetalWork {
    fn new(state: WorkState) -> Arc<MetalWork> {
        Arc::new(MetalWork {
            state: Mutex::new(state),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WorkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for completion; the first failure is returned once.
    pub(crate) fn wait(&self) -> Result<(), RuntimeError> {
        let mut s = self.lock();
        s.complete();
        s.error.take().map_or(Ok(()), Err)
    }

    /// Waits for completion, leaving any failure for `wait`.
    pub(crate) fn wait_done(&self) {
        self.lock().complete();
    }

    pub(crate) fn is_done(&self) -> bool {
        Self::done(&self.lock())
    }

    /// `is_done` without blocking: work another thread is waiting on counts
    /// as running.
    pub(crate) fn is_done_now(&self) -> bool {
        self.state.try_lock().is_ok_and(|s| Self::done(&s))
    }

    fn done(s: &WorkState) -> bool {
        match (&s.encoder, s.completed) {
            (_, true) | (None, _) => true,
            (Some(enc), false) => matches!(
                enc.metal_command_buffer().status(),
                MTLCommandBufferStatus::Completed | MTLCommandBufferStatus::Error
            ),
        }
    }
}

impl Drop for MetalWork {
    /// Dropping submitted work still waits for it: the buffers it binds and
    /// its arena must outlive the GPU's use of them.
    fn drop(&mut self) {
        self.lock().complete();
    }
}

fn node_error(n: &MetalNode) -> impl Fn(weft_ops::OpError) -> RuntimeError + '_ {
    move |e| RuntimeError::Execution {
        op: n.node.op.name(),
        label: n.label.clone(),
        message: e.to_string(),
    }
}

/// The label of a command buffer: its first and last nodes.
fn span_label(nodes: &[MetalNode]) -> String {
    match (nodes.first(), nodes.last()) {
        (Some(a), Some(b)) => format!("{} .. {} ({} nodes)", a.label, b.label, nodes.len()),
        _ => "empty command buffer".into(),
    }
}

impl MetalBackend {
    /// Encodes and commits `cb` without waiting; returns the in-flight
    /// work and the number of memory barriers encoded.
    pub(crate) fn enqueue(&self, cb: MetalCommandBuffer) -> (Arc<MetalWork>, u64) {
        let label = span_label(&cb.nodes);
        let mut state = WorkState {
            encoder: None,
            error: None,
            status: None,
            labels: cb
                .nodes
                .iter()
                .map(|n| (n.node.op.name(), n.label.clone()))
                .collect(),
            label,
            arena: None,
            pool: self.arena_pool(),
            keep_alive: Vec::new(),
            completed: false,
        };
        if let Some(n) = cb.nodes.iter().find(|n| n.fail) {
            state.error = Some(RuntimeError::Execution {
                op: n.node.op.name(),
                label: n.label.clone(),
                message: "injected fault".into(),
            });
            state.keep_alive = cb.keep_alive;
            return (MetalWork::new(state), 0);
        }
        let mut arena = self.take_arena();
        let encoded = self.encode(&cb, &mut arena);
        state.keep_alive = cb.keep_alive;
        state.arena = Some(arena);
        match encoded {
            Ok((mut encoder, status, barriers)) => {
                encoder.commit_labeled(&state.label);
                state.encoder = Some(encoder);
                state.status = Some(status);
                let work = MetalWork::new(state);
                self.track(&work);
                (work, barriers)
            }
            Err(e) => {
                state.error = Some(e);
                (MetalWork::new(state), 0)
            }
        }
    }

    /// Encodes every level; on failure, images validated by this command
    /// buffer are invalidated again (it never runs).
    fn encode(
        &self,
        cb: &MetalCommandBuffer,
        arena: &mut Arena,
    ) -> Result<(CommandEncoder, MlxBuffer, u64), RuntimeError> {
        let mut enc = self
            .device()
            .command_encoder()
            .map_err(|e| super::device_error("cannot open a command buffer", e))?;
        let status = arena
            .zeroed(4 * cb.nodes.len().max(1), MlxDType::U32)
            .map_err(|e| super::device_error("cannot allocate status words", e))?;
        let mut validated: Vec<(Arc<Storage>, u64, u64)> = Vec::new();
        let mut barriers = 0;
        for (li, level) in cb.levels.iter().enumerate() {
            if li > 0 {
                enc.memory_barrier();
                barriers += 1;
            }
            let result = self.encode_level(cb, level.clone(), &mut enc, arena, &status);
            let (prologue, auxes) = match result {
                Ok(r) => r,
                Err(e) => {
                    for (s, start, end) in validated {
                        invalidate(&s, start, end);
                    }
                    return Err(e);
                }
            };
            barriers += prologue;
            // What this level wrote: images it did not write are stale now.
            for (n, aux) in cb.nodes[level.clone()].iter().zip(&auxes) {
                for (s, start, end) in &n.writes {
                    invalidate(s, *start, *end);
                }
                let image = aux.companion_out.is_some();
                if let (Op::QuantizeRows, Some(s), true) = (&n.node.op, &n.out0, image) {
                    if let Some(m) = s.metal() {
                        let t = n.outs[0].tensor;
                        m.validate(&t);
                        validated.push((Arc::clone(s), t.offset, t.offset + t.bytes()));
                    }
                }
            }
        }
        Ok((enc, status, barriers))
    }

    /// Encodes one level (prologues, a barrier if there were any, then the
    /// nodes); returns the barriers it added and each node's inputs.
    fn encode_level(
        &self,
        cb: &MetalCommandBuffer,
        level: Range<usize>,
        enc: &mut CommandEncoder,
        arena: &mut Arena,
        status: &MlxBuffer,
    ) -> Result<(u64, Vec<NodeAux>), RuntimeError> {
        let kernels: &MetalKernels = &self.kernels;
        let mut auxes = Vec::with_capacity(level.len());
        let mut prologues = false;
        for i in level.clone() {
            let n = &cb.nodes[i];
            let mut aux = NodeAux {
                status: Some((status.clone(), i as u32)),
                ..NodeAux::default()
            };
            match &n.node.op {
                Op::QuantizeRows => {
                    aux.companion_out = n
                        .out0
                        .as_ref()
                        .and_then(|s| s.metal())
                        .and_then(|m| m.image_for_write(self.device(), &n.outs[0].tensor));
                }
                Op::MatMul if MetalKernels::needs_f32_activations(&n.node) => {
                    aux.x_f32 = n
                        .in0
                        .as_ref()
                        .and_then(|s| s.metal())
                        .and_then(|m| m.image_for_read(&n.ins[0].tensor));
                    if aux.x_f32.is_none() {
                        let image = kernels
                            .encode_prologue(enc, arena, &n.node, &n.ins[0])
                            .map_err(node_error(n))?;
                        aux.x_f32 = Some(image);
                        prologues = true;
                    }
                }
                _ => {}
            }
            auxes.push(aux);
        }
        if prologues {
            enc.memory_barrier();
        }
        for (i, aux) in level.zip(&auxes) {
            let n = &cb.nodes[i];
            let mut at = MetalTarget {
                enc: &mut *enc,
                arena: &mut *arena,
                aux,
            };
            // SAFETY: every tensor was resolved to a live Metal buffer the
            // command buffer keeps, and the level's nodes do not conflict.
            unsafe { Kernels::launch(kernels, &mut at, &n.node, &n.ins, &n.outs) }
                .map_err(node_error(n))?;
        }
        Ok((u64::from(prologues), auxes))
    }
}

fn invalidate(s: &Storage, start: u64, end: u64) {
    if let Some(m) = s.metal() {
        m.invalidate(start, end);
    }
}

/// Resolves the nodes of one scheduled command buffer to Metal buffers,
/// in execution order. `faults[k]` marks node `cb.order[k]` for an
/// injected failure.
pub(crate) fn prepare(
    exec: &GraphExecutor,
    nodes: &[Node],
    cb: &CommandBufferSchedule,
    payloads: &mut [Option<OpNode>],
    faults: &[bool],
) -> Result<MetalCommandBuffer, RuntimeError> {
    let mut keep = BTreeMap::new();
    let mut storage_of = |buffer: weft_graph::BufferId| -> Result<Arc<Storage>, RuntimeError> {
        let e = exec.entry(buffer)?;
        if e.storage.metal().is_none() {
            return Err(RuntimeError::Usage(format!(
                "buffer `{}` is not Metal memory on a Metal executor",
                e.name
            )));
        }
        Ok(Arc::clone(
            keep.entry(buffer).or_insert_with(|| Arc::clone(&e.storage)),
        ))
    };
    let mut prepared = Vec::with_capacity(cb.order.len());
    for (k, &i) in cb.order.iter().enumerate() {
        let node = payloads[i]
            .take()
            .ok_or_else(|| RuntimeError::Usage(format!("node {i} scheduled twice")))?;
        let mut resolve = |t: &Tensor| -> Result<(MetalTensor, Arc<Storage>), RuntimeError> {
            let storage = storage_of(t.buffer)?;
            let buffer = storage
                .metal()
                .map(|m| m.buffer.clone())
                .ok_or_else(|| RuntimeError::Usage("buffer is not Metal memory".into()))?;
            Ok((MetalTensor { buffer, tensor: *t }, storage))
        };
        let (ins, in_storage): (Vec<_>, Vec<_>) = node
            .inputs
            .iter()
            .map(&mut resolve)
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .unzip();
        let (outs, out_storage): (Vec<_>, Vec<_>) = node
            .outputs
            .iter()
            .map(&mut resolve)
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .unzip();
        let writes = nodes[i]
            .writes
            .iter()
            .map(|r| Ok((storage_of(r.buffer)?, r.start, r.end)))
            .collect::<Result<Vec<_>, RuntimeError>>()?;
        prepared.push(MetalNode {
            node,
            ins,
            outs,
            in0: in_storage.into_iter().next(),
            out0: out_storage.into_iter().next(),
            writes,
            label: nodes[i].label.to_string(),
            fail: faults.get(k).copied().unwrap_or(false),
        });
    }
    let levels = (0..cb.level_count())
        .map(|l| cb.level_starts[l]..cb.level_starts[l + 1])
        .collect();
    Ok(MetalCommandBuffer {
        nodes: prepared,
        levels,
        keep_alive: keep.into_values().collect(),
    })
}
