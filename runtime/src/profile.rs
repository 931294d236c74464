//! Profiles: time per stage and per kernel, from a trace.
//!
//! A node's time is from the start of its first piece to the end of its
//! last. Nodes of one level run concurrently, so node times add up to more
//! than wall time when levels hold several nodes; shares are of summed node
//! time. Timing never changes the schedule: pieces are timed inside levels.

use crate::trace::Trace;
use crate::Counters;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Aggregate of one group (a stage or an op).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Row {
    pub name: String,
    pub count: usize,
    pub total_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub share: f64,
}

/// A profile of a traced run.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Profile {
    pub stages: Vec<Row>,
    pub kernels: Vec<Row>,
    pub counters: Counters,
    /// Device streams the nodes ran on (0: the CPU's workers).
    pub streams: usize,
}

/// The stage a node belongs to, from its label (model-agnostic heuristics
/// over the names weft's models use; anything else is "other").
pub fn stage_of(label: &str, op: &str) -> &'static str {
    let l = label.to_ascii_lowercase();
    if l.contains("norm") {
        "norm"
    } else if l.contains("attn")
        || l.contains("rope")
        || l.contains("cache")
        || op == "attention"
        || op == "rope"
    {
        "attention"
    } else if l.contains("ffn") || l.contains("mlp") || l.contains("expert") || l.contains("moe") {
        "ffn"
    } else if l.contains("embd") || l.contains("token_ids") || l.contains("positions") {
        "embedding / inputs"
    } else if l.starts_with("output") || l.contains("logits") {
        "output head"
    } else {
        "other"
    }
}

impl Profile {
    /// Builds the profile of `trace` with `counters` (the run's counters).
    pub fn from_trace(trace: &Trace, counters: Counters) -> Profile {
        let total: f64 = trace.nodes.iter().map(|n| n.micros).sum();
        let group = |key: &dyn Fn(&crate::trace::NodeSpan) -> String| {
            let mut map: BTreeMap<String, Row> = BTreeMap::new();
            for n in &trace.nodes {
                let k = key(n);
                let row = map.entry(k.clone()).or_insert(Row {
                    name: k,
                    min_us: f64::INFINITY,
                    ..Default::default()
                });
                row.count += 1;
                row.total_us += n.micros;
                row.min_us = row.min_us.min(n.micros);
                row.max_us = row.max_us.max(n.micros);
            }
            let mut rows: Vec<Row> = map.into_values().collect();
            for r in &mut rows {
                r.share = if total > 0.0 { r.total_us / total } else { 0.0 };
            }
            rows.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
            rows
        };
        Profile {
            stages: group(&|n| stage_of(&n.label, n.op).to_string()),
            kernels: group(&|n| n.op.to_string()),
            counters,
            streams: trace.streams,
        }
    }

    /// A plain-text table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let how = if self.streams > 0 {
            "device events before and after every node inside the command buffers' graphs (the same levels and branches, plus the events)"
        } else {
            "pieces timed inside levels"
        };
        let _ = writeln!(s, "per-node timing: {how}; the schedule is unchanged (no single-layer command buffers needed)");
        for (title, rows) in [("stage", &self.stages), ("kernel", &self.kernels)] {
            let _ = writeln!(
                s,
                "\n{title:<20} {:>8} {:>12} {:>10} {:>10} {:>7}",
                "count", "total ms", "min us", "max us", "share"
            );
            for r in rows {
                let _ = writeln!(
                    s,
                    "{:<20} {:>8} {:>12.3} {:>10.1} {:>10.1} {:>6.1}%",
                    r.name,
                    r.count,
                    r.total_us / 1e3,
                    r.min_us,
                    r.max_us,
                    r.share * 100.0
                );
            }
        }
        let c = &self.counters;
        let _ = writeln!(
            s,
            "\ncounters: dispatches {} | barriers {} | command buffers {} | commits {} (planned {}) | waits {} | pool allocations {}",
            c.dispatches, c.barriers, c.command_buffers, c.commits, c.planned_commits, c.waits, c.pool_allocations
        );
        s
    }
}
