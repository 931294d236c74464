//! JSON dumps of a recording and its schedule.
//!
//! The schema, for tools that check a schedule on their own:
//! `{"buffers": [{"id", "bytes", "name"}], "nodes": [{"id", "op", "label",
//! "layer", "reads": [[buffer, start, end]], "writes": [...], "level",
//! "command_buffer"}], "command_buffers": [stats...]}`; ranges are half-open
//! and node ids are recorded order.

use crate::node::Node;
use crate::reorder::{CommandBufferStats, Schedule};
use crate::ByteRange;
use serde::{Deserialize, Serialize};

/// A buffer as dumps show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferInfo {
    pub id: u32,
    pub bytes: u64,
    pub name: String,
}

/// One node of a dump.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DumpNode {
    pub id: usize,
    pub op: String,
    pub label: String,
    pub layer: Option<u32>,
    pub reads: Vec<(u32, u64, u64)>,
    pub writes: Vec<(u32, u64, u64)>,
    pub level: u32,
    pub command_buffer: usize,
}

/// A recording with its schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dump {
    pub buffers: Vec<BufferInfo>,
    pub nodes: Vec<DumpNode>,
    #[serde(default)]
    pub command_buffers: Vec<DumpCommandBuffer>,
}

/// Per-command-buffer figures of a dump.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DumpCommandBuffer {
    pub index: usize,
    pub first_node: usize,
    pub nodes: usize,
    pub levels: usize,
    pub barriers: usize,
    pub reordered: usize,
    pub bytes_touched: u64,
    pub first_layer: Option<u32>,
    pub last_layer: Option<u32>,
}

/// Builds the dump of `nodes` scheduled by `schedule`.
pub fn build(nodes: &[Node], buffers: Vec<BufferInfo>, schedule: &Schedule) -> Dump {
    let mut placed = vec![(0usize, 0u32); nodes.len()];
    let mut command_buffers = Vec::new();
    for (index, cb) in schedule.command_buffers.iter().enumerate() {
        for (k, &level) in cb.levels.iter().enumerate() {
            placed[cb.nodes.start + k] = (index, level);
        }
        let CommandBufferStats {
            nodes,
            levels,
            barriers,
            reordered,
            bytes_touched,
            first_layer,
            last_layer,
        } = cb.stats.clone();
        command_buffers.push(DumpCommandBuffer {
            index,
            first_node: cb.nodes.start,
            nodes,
            levels,
            barriers,
            reordered,
            bytes_touched,
            first_layer,
            last_layer,
        });
    }
    let triple = |r: &ByteRange| (r.buffer.0, r.start, r.end);
    let nodes = nodes
        .iter()
        .enumerate()
        .map(|(id, n)| DumpNode {
            id,
            op: n.op.to_string(),
            label: n.label.to_string(),
            layer: n.layer,
            reads: n.reads.iter().map(triple).collect(),
            writes: n.writes.iter().map(triple).collect(),
            level: placed[id].1,
            command_buffer: placed[id].0,
        })
        .collect();
    Dump {
        buffers,
        nodes,
        command_buffers,
    }
}
