//! Baseline schedulers, kept to measure what the reorder pass gains.
//!
//! - recorded order: what eager execution needs (a barrier only where the next
//!   node conflicts with something since the last barrier);
//! - greedy window: a level is filled from the first `w` unscheduled nodes
//!   only, like hf2q's 64-node look-ahead.

use crate::interval::AccessMap;
use crate::node::Node;
use crate::reorder::{conflict_level, note_node};

/// Levels for eager execution in recorded order (0-based).
pub fn recorded_order_levels(nodes: &[Node]) -> Vec<u32> {
    recorded_order_levels_fenced(nodes, &[])
}

/// Recorded-order levels where `fences[i]` forces a barrier before node `i`
/// (an explicit `barrier()`, or a node whose ranges are unknown).
pub fn recorded_order_levels_fenced(nodes: &[Node], fences: &[bool]) -> Vec<u32> {
    let mut map = AccessMap::default();
    let mut current = 1u32;
    let mut since_barrier = 0usize;
    nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            // Every earlier node sits at a level <= current; a conflict with
            // the current level forces a barrier.
            let fenced = fences.get(i).copied().unwrap_or(false) && since_barrier > 0;
            if fenced || conflict_level(&map, node) == current {
                current += 1;
                since_barrier = 0;
            }
            since_barrier += 1;
            note_node(&mut map, node, current);
            current - 1
        })
        .collect()
}

/// Levels of a greedy pass with a look-ahead of `window` unscheduled nodes.
///
/// Each level takes, from the first `window` unscheduled nodes, every node that
/// conflicts with none of the window's nodes recorded before it (those are
/// either still waiting or running in this very level).
pub fn greedy_window_levels(nodes: &[Node], window: usize) -> Vec<u32> {
    let window = window.max(1);
    let mut levels = vec![u32::MAX; nodes.len()];
    let mut pending: Vec<usize> = (0..nodes.len()).collect();
    let mut level = 0u32;
    while !pending.is_empty() {
        let take = pending.len().min(window);
        let mut placed = vec![false; take];
        for j in 0..take {
            let nj = &nodes[pending[j]];
            if (0..j).all(|i| !nodes[pending[i]].conflicts_with(nj)) {
                placed[j] = true;
                levels[pending[j]] = level;
            }
        }
        let mut k = 0;
        pending.retain(|_| {
            let keep = k >= take || !placed[k];
            k += 1;
            keep
        });
        level += 1;
    }
    levels
}
