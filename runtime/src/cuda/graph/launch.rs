//! Enqueuing a command buffer's levels on the streams, as the launch pass
//! (`crate::launches`) planned them: a level's launches on their streams
//! with a fork and a join on the main stream, a shared launch through
//! `CudaKernels::launch_group`, every other node through `Kernels::launch`
//! (eagerly or inside a capture).

use super::{CachedGraph, CudaCommandBuffer, CudaNode};
use crate::cuda::{driver, CudaBackend};
use crate::RuntimeError;
use std::sync::Arc;
use weft_kernels::cuda::cudarc::driver::{result, sys, CudaEvent, CudaStream};
use weft_kernels::{CudaTarget, Kernels};
use weft_ops::Op;

impl CudaBackend {
    /// Enqueues every node, level by level: a level's launches go to the
    /// streams the launch pass gave them, and the level ends with a join on
    /// the main stream.
    /// `host` is the graph's pinned staging, taken before any capture
    /// (taking it synchronizes, which a capturing stream refuses). The
    /// fork/join events are returned, to be dropped once the capture ends.
    pub(super) fn launch_levels(
        &self,
        cb: &CudaCommandBuffer,
        g: &CachedGraph,
        host: &[u8],
        capturing: bool,
    ) -> Result<Vec<CudaEvent>, RuntimeError> {
        let mut events = Vec::new();
        let mut scratch = g._scratch.ptr;
        if let Some(clock) = &g.clock {
            mark(&clock.origin, &self.main, capturing)?;
        }
        for (level, plan) in cb.levels.iter().zip(&g.launches) {
            // Scratch in node order, as `build` sized it.
            let scratch_at: Vec<u64> = level
                .clone()
                .map(|i| {
                    let at = scratch;
                    scratch += Kernels::scratch_bytes(&self.kernels, &cb.nodes[i].node)
                        .next_multiple_of(256) as u64;
                    at
                })
                .collect();
            let width = plan.width;
            if width > 1 {
                let fork = self.main.record_event(None).map_err(driver)?;
                for s in &self.branches[..width - 1] {
                    s.wait(&fork).map_err(driver)?;
                }
                events.push(fork);
            }
            for (k, launch) in plan.launches.iter().enumerate() {
                let stream: &Arc<CudaStream> = match plan.stream_of(k) {
                    0 => &self.main,
                    b => &self.branches[b - 1],
                };
                let step = |i: usize| g.step.ptr + 4 * g.step_offsets[i] as u64;
                match launch.nodes[..] {
                    [] => {}
                    [i] => {
                        let n = &cb.nodes[i];
                        if let Some(clock) = &g.clock {
                            mark(&clock.marks[i].0, stream, capturing)?;
                        }
                        self.launch_node(
                            stream,
                            n,
                            g.write_offsets[i].map(|(at, len)| &host[at..at + len]),
                            scratch_at[i - level.start],
                            step(i),
                            launch.early,
                        )?;
                        if let Some(clock) = &g.clock {
                            mark(&clock.marks[i].1, stream, capturing)?;
                        }
                    }
                    _ => self.launch_group(stream, cb, &launch.nodes, step)?,
                }
            }
            if width > 1 {
                for s in &self.branches[..width - 1] {
                    let join = s.record_event(None).map_err(driver)?;
                    self.main.wait(&join).map_err(driver)?;
                    events.push(join);
                }
            }
        }
        Ok(events)
    }

    /// Launches nodes `members` of `cb` as one kernel (a shared launch of
    /// the launch pass).
    fn launch_group(
        &self,
        stream: &Arc<CudaStream>,
        cb: &CudaCommandBuffer,
        members: &[usize],
        step: impl Fn(usize) -> u64,
    ) -> Result<(), RuntimeError> {
        let group: Vec<_> = members
            .iter()
            .map(|&i| {
                let n = &cb.nodes[i];
                let (rope, write, bias) = match &n.node.op {
                    Op::MatMulRows { rope, write, bias } => (rope.as_ref(), *write, *bias),
                    _ => (None, None, false),
                };
                weft_kernels::cuda::GroupMember {
                    rope,
                    write,
                    bias,
                    ins: &n.ins,
                    outs: &n.outs,
                    step: step(i),
                }
            })
            .collect();
        // SAFETY: every tensor was resolved to live device memory of its size.
        unsafe { self.kernels.launch_group(stream, &group) }.map_err(|e| {
            let n = &cb.nodes[members[0]];
            RuntimeError::Execution {
                op: n.node.op.name(),
                label: n.label.clone(),
                message: format!("in a launch of {} nodes: {e}", members.len()),
            }
        })
    }

    fn launch_node(
        &self,
        stream: &Arc<CudaStream>,
        n: &CudaNode,
        staged: Option<&[u8]>,
        scratch: u64,
        step: u64,
        early: bool,
    ) -> Result<(), RuntimeError> {
        let fail = |e: weft_ops::OpError| RuntimeError::Execution {
            op: n.node.op.name(),
            label: n.label.clone(),
            message: e.to_string(),
        };
        if let (Op::Write { data }, Some(src)) = (&n.node.op, staged) {
            // SAFETY: the output lies in a live device buffer; `src` is pinned
            // staging that lives as long as the graph.
            return unsafe {
                result::memcpy_htod_async(n.outs[0].ptr, &src[..data.len()], stream.cu_stream())
            }
            .map_err(driver);
        }
        // SAFETY: every tensor was resolved to live device memory of its size.
        unsafe {
            let mut at = CudaTarget {
                stream,
                scratch,
                step,
                early,
            };
            Kernels::launch(&self.kernels, &mut at, &n.node, &n.ins, &n.outs)
        }
        .map_err(fail)
    }
}

/// Records a timing event on `stream`; inside a capture it becomes an event
/// record node of the graph (a plain record would only mark a dependency).
fn mark(event: &CudaEvent, stream: &CudaStream, capturing: bool) -> Result<(), RuntimeError> {
    let flags = if capturing {
        sys::CUevent_record_flags_enum::CU_EVENT_RECORD_EXTERNAL as u32
    } else {
        sys::CUevent_record_flags_enum::CU_EVENT_RECORD_DEFAULT as u32
    };
    // SAFETY: both handles are live objects of this context.
    unsafe { sys::cuEventRecordWithFlags(event.cu_event(), stream.cu_stream(), flags) }
        .result()
        .map_err(driver)
}
