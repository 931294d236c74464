//! The CUDA side of the backend seam: device memory for the executor, and
//! submission: each scheduled command buffer becomes a CUDA graph launch
//! (captured once per structure, then replayed with this step's values),
//! and a kept plan replays its graphs without preparing them.

use super::{CudaBackend, CudaCommandBuffer, CudaNode, CudaWork};
use crate::backend::{Backend, PlanParts};
use crate::commit::{node_labels, plan_differs};
use crate::counters::LiveCounters;
use crate::memory::{HostBytes, Storage};
use crate::plan::StepPlan;
use crate::session::{GraphSession, NodeTiming};
use crate::submission::InFlight;
use crate::trace::{DeviceSpan, TraceState};
use crate::RuntimeError;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_graph::{BufferId, Label, Node, Schedule};
use weft_kernels::Kernels;
use weft_ops::{OpError, OpNode, Tensor};

/// The buffers a CUDA command buffer points into, by id.
type UsedBuffers = Vec<(BufferId, Arc<crate::memory::Storage>)>;

impl Backend for CudaBackend {
    fn alloc_storage(&self, len: usize, _name: &str) -> Result<Storage, RuntimeError> {
        Ok(Storage::device(self.alloc(len)?))
    }

    /// Weights are uploaded once.
    fn wrap_bytes(&self, bytes: Arc<dyn HostBytes>, _name: &str) -> Result<Storage, RuntimeError> {
        let host = bytes.host_bytes();
        let buffer = self.alloc(host.len())?;
        self.upload(buffer.ptr, host)?;
        Ok(Storage::device(buffer))
    }

    fn wait_all(&self) -> Result<(), RuntimeError> {
        self.synchronize()
    }

    fn read_device(
        &self,
        storage: &Storage,
        offset: usize,
        len: usize,
    ) -> Option<Result<Vec<u8>, RuntimeError>> {
        let ptr = storage.device_ptr()?;
        Some(self.download_now(ptr + offset as u64, len))
    }

    fn write_device(
        &self,
        storage: &Storage,
        offset: u64,
        data: &[u8],
    ) -> Option<Result<(), RuntimeError>> {
        let ptr = storage.device_ptr()?;
        Some(self.upload(ptr + offset, data))
    }

    fn graph_stats(&self) -> Option<(u64, u64, u64)> {
        Some(self.graph_counts())
    }

    fn device_busy(&self) -> Option<Duration> {
        let ns = self.busy_ns.load(std::sync::atomic::Ordering::Relaxed);
        Some(Duration::from_nanos(ns))
    }

    fn device_name(&self) -> Option<String> {
        Some(self.name())
    }

    fn device_spans(&self, trace: &mut TraceState, epoch: Instant) -> Vec<DeviceSpan> {
        let mut device = Vec::new();
        let works = std::mem::take(&mut trace.cuda);
        if let (false, Ok((_, origin))) = (works.is_empty(), self.clock_origin()) {
            let zero = origin.saturating_duration_since(epoch).as_secs_f64() * 1e6;
            for (cb, work) in works {
                device.extend(work.node_spans(cb, zero));
            }
        }
        device
    }

    fn supports(&self, node: &OpNode) -> Result<(), OpError> {
        Kernels::supports(&self.kernels, node)
    }

    /// Cache writes of uploaded bytes are carried out by the graph itself.
    fn accepts(&self, node: &OpNode) -> Result<(), OpError> {
        if matches!(node.op, weft_ops::Op::Write { .. }) {
            return Ok(());
        }
        Kernels::supports(&self.kernels, node)
    }

    fn plans_steps(&self) -> bool {
        true
    }

    /// A plan whose graphs are all still cached.
    fn plan_usable(&self, plan: &StepPlan) -> bool {
        plan.keys.iter().all(|&k| self.has_graph(k))
    }

    fn submit(
        &self,
        session: &mut GraphSession<'_>,
        s: &Schedule,
        payloads: &mut [Option<OpNode>],
        timed: bool,
        submit_start: (Instant, Instant),
    ) -> Result<(InFlight, Option<PlanParts>), RuntimeError> {
        let mut works = Vec::with_capacity(s.command_buffers.len());
        let mut keys = Vec::with_capacity(s.command_buffers.len());
        let mut keep_alive = Vec::with_capacity(s.command_buffers.len());
        let mut buffers = BTreeMap::new();
        for cb in &s.command_buffers {
            let (mut prepared, used) = session.prepare_cuda(cb, payloads, None)?;
            prepared.timed = timed;
            keep_alive.push(prepared.keep_alive.clone());
            buffers.extend(used);
            let (work, key) = self.enqueue(prepared);
            works.push(work);
            keys.push(key);
            session.count_command_buffer(cb);
        }
        let keys: Option<Vec<u64>> = keys.into_iter().collect();
        let parts = keys.map(|keys| PlanParts {
            keys,
            keep_alive,
            buffers: buffers.into_iter().collect(),
        });
        Ok((session.finish_cuda(works, s, Some(submit_start)), parts))
    }

    /// Replays a plan's graphs with this recording's step values.
    fn replay(
        &self,
        session: &mut GraphSession<'_>,
        plan: &StepPlan,
        payloads: Vec<OpNode>,
    ) -> Result<InFlight, RuntimeError> {
        let mut works = Vec::with_capacity(plan.keys.len());
        let mut values = Vec::new();
        for (k, cb) in plan.schedule.command_buffers.iter().enumerate() {
            values.clear();
            let mut writes = Vec::new();
            for (at, &i) in cb.order.iter().enumerate() {
                let node = &payloads[i];
                values.extend(self.kernels.step_scalars(node));
                if let weft_ops::Op::Write { data } = &node.op {
                    writes.push((at, &data[..]));
                }
            }
            let work = self
                .replay_graph(plan.keys[k], &values, &writes, plan.keep_alive[k].clone())
                .ok_or_else(|| RuntimeError::Usage("a step plan's graph was dropped".into()))?;
            works.push(work);
            session.count_command_buffer(cb);
        }
        LiveCounters::add(&session.exec.counters.planned_commits, 1);
        Ok(session.finish_cuda(works, &plan.schedule, None))
    }

    /// The same graph per command buffer: prepare the fresh command
    /// buffers and compare keys.
    fn check_plan(
        &self,
        session: &mut GraphSession<'_>,
        plan: &StepPlan,
        nodes: &[Node],
        payloads: Vec<OpNode>,
        fresh: &Schedule,
    ) -> Result<(), RuntimeError> {
        let labels = node_labels(nodes);
        let mut fresh_payloads: Vec<Option<OpNode>> = payloads.into_iter().map(Some).collect();
        let mut keys = Vec::with_capacity(fresh.command_buffers.len());
        for cb in &fresh.command_buffers {
            let (prepared, _) = session.prepare_cuda(cb, &mut fresh_payloads, Some(&labels))?;
            keys.push(self.key_of(&prepared));
        }
        if keys != plan.keys {
            return Err(plan_differs("graph preparation"));
        }
        Ok(())
    }
}

impl GraphSession<'_> {
    fn count_command_buffer(&self, cb: &weft_graph::CommandBufferSchedule) {
        let c = &self.exec.counters;
        LiveCounters::add(&c.dispatches, cb.nodes.len() as u64);
        LiveCounters::add(&c.barriers, cb.level_count().saturating_sub(1) as u64);
    }

    /// Counters, pool scopes and the trace after a CUDA submission.
    fn finish_cuda(
        &mut self,
        works: Vec<Arc<CudaWork>>,
        s: &Schedule,
        submit_start: Option<(Instant, Instant)>,
    ) -> InFlight {
        let counters = Arc::clone(&self.exec.counters);
        LiveCounters::add(&counters.commits, 1);
        LiveCounters::add(&counters.command_buffers, works.len() as u64);
        self.end_scopes();
        // The host track (record, fuse + schedule, submit, drain); the
        // device's streams come from the timed works when the trace is taken.
        let trace = submit_start.and_then(|at| self.note_trace(&[], s, at));
        if let Some(state) = self.exec.trace.as_mut() {
            let first = state.next_cb;
            for (k, w) in works.iter().enumerate() {
                state.cuda.push((first + k as u64, Arc::clone(w)));
            }
            state.next_cb += works.len() as u64;
        }
        let mut inflight = InFlight::new(Vec::new(), counters, trace);
        inflight.cuda = works;
        inflight
    }

    /// One scheduled command buffer resolved to device pointers, with the
    /// buffers it points into.
    /// `labels`: the nodes' labels and layers by index, when they are not
    /// this session's (as in [`prepare_job`](Self::prepare_job)).
    fn prepare_cuda(
        &mut self,
        cb: &weft_graph::CommandBufferSchedule,
        payloads: &mut [Option<OpNode>],
        labels: Option<&[(Label, Option<u32>)]>,
    ) -> Result<(CudaCommandBuffer, UsedBuffers), RuntimeError> {
        use weft_kernels::cuda::DeviceTensor;
        let mut keep = BTreeMap::new();
        let mut nodes = Vec::with_capacity(cb.order.len());
        // Buffers some node of this command buffer, or of any before it,
        // writes: every other input (the weights) is constant while it runs
        // (DeviceTensor::constant).
        for &i in &cb.order {
            for t in payloads[i].iter().flat_map(|n| &n.outputs) {
                if let Some(Some(e)) = self.exec.buffers.get_mut(t.buffer.0 as usize) {
                    e.written = true;
                }
            }
        }
        for &i in &cb.order {
            let node = payloads[i]
                .take()
                .ok_or_else(|| RuntimeError::Usage(format!("node {i} scheduled twice")))?;
            let mut resolve = |t: &Tensor| -> Result<DeviceTensor, RuntimeError> {
                let e = self.exec.entry(t.buffer)?;
                keep.entry(t.buffer)
                    .or_insert_with(|| Arc::clone(&e.storage));
                let base = e.storage.device_ptr().ok_or_else(|| {
                    RuntimeError::Usage(format!(
                        "buffer `{}` is host memory on a CUDA executor",
                        e.name
                    ))
                })?;
                Ok(DeviceTensor {
                    ptr: base + t.offset,
                    tensor: *t,
                    constant: !e.written,
                })
            };
            let mut ins = node
                .inputs
                .iter()
                .map(&mut resolve)
                .collect::<Result<Vec<_>, _>>()?;
            let outs = node
                .outputs
                .iter()
                .map(&mut resolve)
                .collect::<Result<Vec<_>, _>>()?;
            // Decode replays: attention sees the whole cache; the visible
            // extent comes from the step scalars.
            if let Some(p) = node.op.attention_params() {
                if p.kv_capacity as usize > ins[1].tensor.rows() {
                    for t in &mut ins[1..3] {
                        let dims = [p.kv_capacity as usize, t.tensor.cols()];
                        t.tensor = Tensor::new(
                            t.tensor.buffer,
                            t.tensor.offset,
                            t.tensor.dtype,
                            weft_ops::Shape::new(&dims),
                        )?;
                    }
                }
            }
            let (label, layer) = self.label_of(i, labels);
            let label = label.to_string();
            let fail = self.take_fault(&label);
            nodes.push(CudaNode {
                node,
                ins,
                outs,
                label,
                layer,
                fail,
            });
        }
        let levels = (0..cb.level_count())
            .map(|l| cb.level_starts[l]..cb.level_starts[l + 1])
            .collect();
        let used: Vec<_> = keep.into_iter().collect();
        let cb = CudaCommandBuffer {
            nodes,
            levels,
            keep_alive: used.iter().map(|(_, s)| Arc::clone(s)).collect(),
            timed: false,
        };
        Ok((cb, used))
    }
}

/// Each node's device time from timed CUDA work, by command buffer.
pub(crate) fn node_timings(works: &[Arc<CudaWork>]) -> Vec<NodeTiming> {
    let mut timings = Vec::new();
    for (cb, w) in works.iter().enumerate() {
        timings.extend(
            w.node_spans(cb as u64, 0.0)
                .into_iter()
                .map(|t| NodeTiming {
                    op: t.op,
                    label: t.label,
                    layer: t.layer,
                    command_buffer: cb,
                    level: t.level,
                    micros: t.dur_us,
                }),
        );
    }
    timings
}
