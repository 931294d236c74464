//! The reorder pass: every node gets the lowest level that keeps it after all
//! earlier nodes it conflicts with.
//!
//! Two nodes conflict when they touch overlapping bytes of one buffer and at
//! least one writes (RAW, WAR, WAW). Assigning `level = 1 + max(level of
//! conflicting earlier nodes)` in recorded order is longest-path layering of
//! the conflict DAG: the number of levels equals the longest conflict chain,
//! which no schedule can beat. There is no look-ahead window; the per-buffer
//! interval maps keep it near-linear. Deterministic: the result depends only
//! on the recording.

use crate::baseline;
use crate::interval::AccessMap;
use crate::node::Node;
use serde::Serialize;
use std::ops::Range;

/// How levels are chosen inside a command buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// weft's pass: minimum barriers for the recorded ranges.
    Reorder,
    /// Recorded order, a barrier only where the next node conflicts with what
    /// ran since the last one (what eager execution needs).
    RecordedOrder,
    /// A greedy pass that only looks `n` unscheduled nodes ahead (hf2q's
    /// runtime used 64). Kept as a baseline.
    GreedyWindow(usize),
}

/// Figures for one command buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CommandBufferStats {
    pub nodes: usize,
    pub levels: usize,
    /// `levels - 1`: barriers inside this command buffer.
    pub barriers: usize,
    /// Nodes that run before a node recorded earlier than them.
    pub reordered: usize,
    pub bytes_touched: u64,
    pub first_layer: Option<u32>,
    pub last_layer: Option<u32>,
}

/// Levels of the nodes `nodes` (indices into the recording) of one command buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandBufferSchedule {
    /// Recording indices covered: command buffers are contiguous in recorded order.
    pub nodes: Range<usize>,
    /// Level of each node, 0-based, indexed by `node - nodes.start`.
    pub levels: Vec<u32>,
    /// Recording indices in execution order: by level, then recorded order.
    pub order: Vec<usize>,
    /// `order[level_starts[l]..level_starts[l + 1]]` is level `l`.
    pub level_starts: Vec<usize>,
    pub stats: CommandBufferStats,
}

impl CommandBufferSchedule {
    /// Number of levels.
    pub fn level_count(&self) -> usize {
        self.level_starts.len().saturating_sub(1)
    }

    /// Recording indices of level `l`, in recorded order.
    pub fn level(&self, l: usize) -> &[usize] {
        &self.order[self.level_starts[l]..self.level_starts[l + 1]]
    }
}

/// A whole recording's schedule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    pub command_buffers: Vec<CommandBufferSchedule>,
}

impl Schedule {
    /// Barriers inside command buffers, summed.
    pub fn barriers(&self) -> usize {
        self.command_buffers.iter().map(|c| c.stats.barriers).sum()
    }

    /// Levels summed over command buffers.
    pub fn levels(&self) -> usize {
        self.command_buffers.iter().map(|c| c.stats.levels).sum()
    }

    /// Reordered nodes summed over command buffers.
    pub fn reordered(&self) -> usize {
        self.command_buffers.iter().map(|c| c.stats.reordered).sum()
    }

    /// Number of nodes scheduled.
    pub fn nodes(&self) -> usize {
        self.command_buffers.iter().map(|c| c.stats.nodes).sum()
    }
}

/// Schedules `nodes`, cut into the contiguous command buffers `cuts`
/// (see [`crate::cut`]), with `strategy` inside each command buffer.
pub fn schedule(nodes: &[Node], cuts: &[Range<usize>], strategy: Strategy) -> Schedule {
    let mut map = AccessMap::default();
    schedule_by(nodes, cuts, |slice, _| match strategy {
        Strategy::Reorder => reorder_levels_with(slice, &mut map),
        Strategy::RecordedOrder => baseline::recorded_order_levels(slice),
        Strategy::GreedyWindow(w) => baseline::greedy_window_levels(slice, w),
    })
}

/// Schedules with caller-chosen levels: `levels(slice, range)` returns the
/// 0-based level of each node of one command buffer. The result is not
/// checked here; run [`crate::checker::check`] on it.
pub fn schedule_by(
    nodes: &[Node],
    cuts: &[Range<usize>],
    mut levels: impl FnMut(&[Node], Range<usize>) -> Vec<u32>,
) -> Schedule {
    let command_buffers = cuts
        .iter()
        .map(|cut| {
            let slice = &nodes[cut.clone()];
            build_command_buffer(slice, cut.clone(), levels(slice, cut.clone()))
        })
        .collect();
    Schedule { command_buffers }
}

/// weft's pass over one command buffer: 0-based levels, minimum count.
pub fn reorder_levels(nodes: &[Node]) -> Vec<u32> {
    reorder_levels_with(nodes, &mut AccessMap::default())
}

fn reorder_levels_with(nodes: &[Node], map: &mut AccessMap) -> Vec<u32> {
    map.clear();
    nodes
        .iter()
        .map(|node| {
            let level = 1 + conflict_level(map, node);
            note_node(map, node, level);
            level - 1
        })
        .collect()
}

/// Highest 1-based level among earlier accesses `node` conflicts with (0: none).
pub(crate) fn conflict_level(map: &AccessMap, node: &Node) -> u32 {
    let reads = node.reads.iter().map(|r| map.conflict_level(r, false));
    let writes = node.writes.iter().map(|r| map.conflict_level(r, true));
    reads.chain(writes).max().unwrap_or(0)
}

/// Records `node`'s accesses at 1-based `level`.
pub(crate) fn note_node(map: &mut AccessMap, node: &Node, level: u32) {
    for w in &node.writes {
        map.note_write(w, level);
    }
    for r in &node.reads {
        map.note_read(r, level);
    }
}

fn build_command_buffer(
    nodes: &[Node],
    range: Range<usize>,
    levels: Vec<u32>,
) -> CommandBufferSchedule {
    let level_count = levels.iter().max().map_or(0, |m| *m as usize + 1);
    // Counting sort by level keeps recorded order inside a level.
    let mut level_starts = vec![0usize; level_count + 1];
    for &l in &levels {
        level_starts[l as usize + 1] += 1;
    }
    for l in 0..level_count {
        level_starts[l + 1] += level_starts[l];
    }
    let mut fill = level_starts.clone();
    let mut order = vec![0usize; levels.len()];
    for (i, &l) in levels.iter().enumerate() {
        order[fill[l as usize]] = range.start + i;
        fill[l as usize] += 1;
    }
    let mut highest = 0u32;
    let mut reordered = 0;
    for &l in &levels {
        if l < highest {
            reordered += 1;
        }
        highest = highest.max(l);
    }
    let stats = CommandBufferStats {
        nodes: nodes.len(),
        levels: level_count,
        barriers: level_count.saturating_sub(1),
        reordered,
        bytes_touched: nodes.iter().map(Node::bytes_touched).sum(),
        first_layer: nodes.iter().filter_map(|n| n.layer).min(),
        last_layer: nodes.iter().filter_map(|n| n.layer).max(),
    };
    CommandBufferSchedule {
        nodes: range,
        levels,
        order,
        level_starts,
        stats,
    }
}
