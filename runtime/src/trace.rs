//! Execution traces in Chrome / Perfetto trace-event JSON.
//!
//! While tracing is on, every command buffer runs timed: each worker notes
//! when it ran which piece of which node. A trace then shows one track per
//! worker thread (a slice per node, named by its label, with op, layer,
//! level and command buffer), a track of command buffers (submitted to
//! completed), and the host track: recording, scheduling and submission of
//! each step, drains, and pool scopes. Enough to answer "where did this
//! token's time go". On a GPU the worker tracks are the device's streams:
//! every node's device time, read from events around it in the graph.

use crate::cpu::threadpool::Job;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Track ids: the host thread, the command-buffer track, then workers.
pub(crate) const HOST_TRACK: u64 = 0;
const CB_TRACK: u64 = 1;
const FIRST_WORKER_TRACK: u64 = 10;
const FIRST_STREAM_TRACK: u64 = 1000;

/// One node's time on a device stream, from the device's own clock.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceSpan {
    pub label: String,
    pub op: &'static str,
    pub layer: Option<u32>,
    pub level: u32,
    pub command_buffer: u64,
    pub stream: usize,
    /// Microseconds since the trace's epoch.
    pub start_us: f64,
    pub dur_us: f64,
}

/// One complete ("X") event.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    pub name: String,
    pub cat: &'static str,
    pub track: u64,
    pub start_us: f64,
    pub dur_us: f64,
    pub args: Value,
}

/// Host-side events, shared with in-flight handles.
pub(crate) type HostSink = Arc<Mutex<Vec<TraceEvent>>>;

/// What an executor collects while tracing.
pub(crate) struct TraceState {
    pub host: HostSink,
    pub jobs: Vec<(u64, Arc<Job>)>,
    /// Timed device command buffers (CUDA).
    #[cfg(feature = "cuda")]
    pub cuda: Vec<(u64, Arc<crate::cuda::CudaWork>)>,
    pub next_cb: u64,
}

impl TraceState {
    pub(crate) fn new() -> Self {
        Self {
            host: Arc::new(Mutex::new(Vec::new())),
            jobs: Vec::new(),
            #[cfg(feature = "cuda")]
            cuda: Vec::new(),
            next_cb: 0,
        }
    }
}

/// Notes a host slice from `start` (an instant) to now.
pub(crate) fn host_slice(
    sink: &HostSink,
    epoch: Instant,
    start: Instant,
    name: &str,
    cat: &'static str,
    args: Value,
) {
    host_span(sink, epoch, start, Instant::now(), name, cat, args);
}

/// Notes a host slice from `start` to `end`.
pub(crate) fn host_span(
    sink: &HostSink,
    epoch: Instant,
    start: Instant,
    end: Instant,
    name: &str,
    cat: &'static str,
    args: Value,
) {
    let start_us = start.duration_since(epoch).as_secs_f64() * 1e6;
    let dur_us = end.saturating_duration_since(start).as_secs_f64() * 1e6;
    let mut events = sink.lock().unwrap_or_else(|p| p.into_inner());
    events.push(TraceEvent {
        name: name.to_string(),
        cat,
        track: HOST_TRACK,
        start_us,
        dur_us,
        args,
    });
}

/// A finished trace.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub events: Vec<TraceEvent>,
    /// Timed nodes (for profiles): op, label, layer, microseconds.
    pub nodes: Vec<NodeSpan>,
    pub threads: usize,
    /// Device streams with traced nodes (GPU backends).
    pub streams: usize,
}

/// The span of one node in one command buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSpan {
    pub op: &'static str,
    pub label: String,
    pub layer: Option<u32>,
    pub micros: f64,
}

impl Trace {
    /// Builds the trace of completed `jobs` plus the host events.
    /// Builds the trace of completed `jobs` (CPU) and `device` spans (GPU)
    /// plus the host events.
    pub(crate) fn build(
        host: Vec<TraceEvent>,
        jobs: &[(u64, Arc<Job>)],
        threads: usize,
        device: Vec<DeviceSpan>,
    ) -> Trace {
        let mut events = host;
        let mut nodes = Vec::new();
        for (cb, job) in jobs {
            job_events(*cb, job, &mut events, &mut nodes);
        }
        let streams = device.iter().map(|d| d.stream + 1).max().unwrap_or(0);
        device_events(device, &mut events, &mut nodes);
        events.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
        Trace {
            events,
            nodes,
            threads,
            streams,
        }
    }

    /// Chrome trace-event JSON (opens in Perfetto or chrome://tracing).
    pub fn to_chrome_json(&self) -> String {
        let mut out: Vec<Value> = Vec::with_capacity(self.events.len() + self.threads + 2);
        let name = |tid: u64, n: String| json!({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": n}});
        out.push(json!({"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "weft"}}));
        out.push(name(HOST_TRACK, "host: record / submit / drain".into()));
        out.push(name(CB_TRACK, "command buffers".into()));
        for t in 0..self.threads {
            out.push(name(
                FIRST_WORKER_TRACK + t as u64,
                format!("cpu worker {t}"),
            ));
        }
        for k in 0..self.streams {
            out.push(name(
                FIRST_STREAM_TRACK + k as u64,
                format!("device stream {k}"),
            ));
        }
        for e in &self.events {
            out.push(json!({"ph": "X", "pid": 1, "tid": e.track, "name": e.name, "cat": e.cat, "ts": e.start_us, "dur": e.dur_us, "args": e.args}));
        }
        serde_json::to_string(&json!({"traceEvents": out, "displayTimeUnit": "ms"}))
            .unwrap_or_default()
    }
}

/// Slices of one job: its command-buffer slice, and per worker the merged
/// pieces of each node.
fn job_events(cb: u64, job: &Job, events: &mut Vec<TraceEvent>, nodes: &mut Vec<NodeSpan>) {
    let lock =
        |m: &Mutex<Option<std::time::Duration>>| *m.lock().unwrap_or_else(|p| p.into_inner());
    if let (Some(s), Some(f)) = (lock(&job.started), lock(&job.finished)) {
        events.push(TraceEvent {
            name: format!("command buffer {cb}"),
            cat: "command_buffer",
            track: CB_TRACK,
            start_us: s.as_secs_f64() * 1e6,
            dur_us: (f - s).as_secs_f64() * 1e6,
            args: json!({"nodes": job.nodes.len(), "levels": job.levels.len()}),
        });
    }
    let mut level_of = vec![0usize; job.nodes.len()];
    for (l, level) in job.levels.iter().enumerate() {
        for n in level.nodes.clone() {
            level_of[n] = l;
        }
    }
    let work = job.events.lock().unwrap_or_else(|p| p.into_inner());
    // Per (node, thread): first start and last end.
    let mut spans: std::collections::BTreeMap<(usize, usize), (f64, f64)> =
        std::collections::BTreeMap::new();
    let mut node_span: Vec<Option<(f64, f64)>> = vec![None; job.nodes.len()];
    for ev in work.iter() {
        let (s, e) = (ev.start.as_secs_f64() * 1e6, ev.end.as_secs_f64() * 1e6);
        let span = spans.entry((ev.node, ev.thread)).or_insert((s, e));
        *span = (span.0.min(s), span.1.max(e));
        let whole = node_span[ev.node].get_or_insert((s, e));
        *whole = (whole.0.min(s), whole.1.max(e));
    }
    for ((n, thread), (s, e)) in spans {
        let node = &job.nodes[n];
        events.push(TraceEvent {
            name: node.label.to_string(),
            cat: node.node.op.name(),
            track: FIRST_WORKER_TRACK + thread as u64,
            start_us: s,
            dur_us: e - s,
            args: json!({"op": node.node.op.name(), "layer": node.layer, "level": level_of[n], "command_buffer": cb}),
        });
    }
    for (n, span) in node_span.into_iter().enumerate() {
        if let Some((s, e)) = span {
            let node = &job.nodes[n];
            nodes.push(NodeSpan {
                op: node.node.op.name(),
                label: node.label.to_string(),
                layer: node.layer,
                micros: e - s,
            });
        }
    }
}

/// Slices of device nodes, one track per stream, and each command buffer's
/// device span (its first node's start to its last node's end).
fn device_events(device: Vec<DeviceSpan>, events: &mut Vec<TraceEvent>, nodes: &mut Vec<NodeSpan>) {
    let mut cbs: std::collections::BTreeMap<u64, (f64, f64, usize)> = Default::default();
    for d in device {
        let end = d.start_us + d.dur_us;
        let cb = cbs.entry(d.command_buffer).or_insert((d.start_us, end, 0));
        *cb = (cb.0.min(d.start_us), cb.1.max(end), cb.2 + 1);
        events.push(TraceEvent {
            name: d.label.clone(),
            cat: d.op,
            track: FIRST_STREAM_TRACK + d.stream as u64,
            start_us: d.start_us,
            dur_us: d.dur_us,
            args: json!({"op": d.op, "layer": d.layer, "level": d.level, "command_buffer": d.command_buffer, "stream": d.stream}),
        });
        nodes.push(NodeSpan {
            op: d.op,
            label: d.label,
            layer: d.layer,
            micros: d.dur_us,
        });
    }
    for (cb, (start, end, n)) in cbs {
        events.push(TraceEvent {
            name: format!("command buffer {cb} (device)"),
            cat: "command_buffer",
            track: CB_TRACK,
            start_us: start,
            dur_us: end - start,
            args: json!({"nodes": n}),
        });
    }
}
