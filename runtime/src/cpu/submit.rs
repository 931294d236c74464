//! CPU submission: a scheduled command buffer resolved to host tensors
//! and handed to the thread pool as one job.

use super::threadpool::{Job, Level, PreparedNode};
use crate::counters::LiveCounters;
use crate::session::{GraphSession, NodeTiming};
use crate::submission::InFlight;
use crate::RuntimeError;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;
use weft_graph::{Label, Schedule};
use weft_kernels::cpu::{self, HostTensor};
use weft_ops::{OpNode, Tensor};

impl GraphSession<'_> {
    /// CPU jobs for every command buffer of `s`.
    pub(super) fn prepare_jobs(
        &mut self,
        s: &Schedule,
        payloads: &mut [Option<OpNode>],
        timed: bool,
        labels: Option<&[(Label, Option<u32>)]>,
    ) -> Result<Vec<Arc<Job>>, RuntimeError> {
        let failed = Arc::new(AtomicBool::new(false));
        s.command_buffers
            .iter()
            .map(|cb| {
                Ok(Arc::new(
                    self.prepare_job(cb, payloads, &failed, timed, labels)?,
                ))
            })
            .collect()
    }

    /// Submits CPU jobs: counters, the worker pool, pool scopes, the trace.
    pub(super) fn finish_cpu(
        &mut self,
        jobs: Vec<Arc<Job>>,
        s: &Schedule,
        submit_start: Option<(Instant, Instant)>,
    ) -> InFlight {
        let counters = Arc::clone(&self.exec.counters);
        LiveCounters::add(&counters.commits, 1);
        LiveCounters::add(&counters.command_buffers, jobs.len() as u64);
        for job in &jobs {
            self.exec.pool.submit(Arc::clone(job));
        }
        self.exec.last_jobs = jobs.clone();
        self.end_scopes();
        let trace = submit_start.and_then(|at| self.note_trace(&jobs, s, at));
        InFlight::new(jobs, counters, trace)
    }

    fn prepare_job(
        &mut self,
        cb: &weft_graph::CommandBufferSchedule,
        payloads: &mut [Option<OpNode>],
        failed: &Arc<AtomicBool>,
        timed: bool,
        labels: Option<&[(Label, Option<u32>)]>,
    ) -> Result<Job, RuntimeError> {
        let threads = self.exec.threads();
        let mut keep = BTreeMap::new();
        let mut prepared = Vec::with_capacity(cb.order.len());
        for &i in &cb.order {
            let node = payloads[i]
                .take()
                .ok_or_else(|| RuntimeError::Usage(format!("node {i} scheduled twice")))?;
            let mut resolve = |t: &Tensor| -> Result<HostTensor, RuntimeError> {
                let e = self.exec.entry(t.buffer)?;
                keep.entry(t.buffer)
                    .or_insert_with(|| Arc::clone(&e.storage));
                let base = e.storage.host_ptr().ok_or_else(|| {
                    RuntimeError::Usage(format!(
                        "buffer `{}` is device memory on a CPU executor",
                        e.name
                    ))
                })?;
                // SAFETY: the offset was checked against the buffer's length when recorded.
                let ptr = unsafe { base.add(t.offset as usize) };
                Ok(HostTensor { ptr, tensor: *t })
            };
            let ins = node
                .inputs
                .iter()
                .map(&mut resolve)
                .collect::<Result<Vec<_>, _>>()?;
            let outs = node
                .outputs
                .iter()
                .map(&mut resolve)
                .collect::<Result<Vec<_>, _>>()?;
            let split = cpu::work_split_for(&node, threads, self.exec.config.numerics);
            let (label, layer) = self.label_of(i, labels);
            let fail = self.take_fault(&label);
            prepared.push(PreparedNode {
                node,
                ins,
                outs,
                split,
                label,
                layer,
                fail,
            });
        }
        let levels = (0..cb.level_count())
            .map(|l| Level::new(cb.level_starts[l]..cb.level_starts[l + 1], &prepared))
            .collect();
        Ok(Job::new(
            prepared,
            levels,
            keep.into_values().collect(),
            Arc::clone(failed),
            timed,
            self.exec.epoch,
        ))
    }
}

/// Each node's time from a timed submission's jobs.
pub(crate) fn collect_timings(jobs: &[Arc<Job>]) -> Vec<NodeTiming> {
    let mut out = Vec::new();
    for (cb, job) in jobs.iter().enumerate() {
        let mut spans: Vec<Option<(f64, f64)>> = vec![None; job.nodes.len()];
        for ev in job.events.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let (s, e) = (ev.start.as_secs_f64(), ev.end.as_secs_f64());
            let span = spans[ev.node].get_or_insert((s, e));
            span.0 = span.0.min(s);
            span.1 = span.1.max(e);
        }
        for (li, level) in job.levels.iter().enumerate() {
            for n in level.nodes.clone() {
                let node = &job.nodes[n];
                out.push(NodeTiming {
                    op: node.node.op.name(),
                    label: node.label.to_string(),
                    layer: node.layer,
                    command_buffer: cb,
                    level: li as u32,
                    micros: spans[n].map_or(0.0, |(s, e)| (e - s) * 1e6),
                });
            }
        }
    }
    out
}
