//! The independent schedule checker.
//!
//! Deliberately simple and separate from the reorder pass (it shares no code
//! with it beyond `Node::conflicts_with`'s two-line overlap rule): every pair
//! of nodes is compared, and the conflicts become a petgraph `DiGraph` (an
//! edge from each node to every later node it conflicts with) whose
//! topological order gives the longest conflict chain, the fewest levels
//! any correct schedule can have. The reorder pass reaches the same number
//! through per-buffer interval maps; this is the library-backed second
//! implementation it is measured against. Quadratic, which is fine for
//! tests and debug builds.

use crate::node::Node;
use crate::reorder::Schedule;
use crate::GraphError;
use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};

/// What the checker saw on a schedule it accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    pub nodes: usize,
    pub conflicting_pairs: usize,
}

/// Confirms that `schedule` runs every node of `nodes` exactly once and that
/// every conflicting pair keeps its recorded order across a barrier or a
/// command-buffer boundary.
pub fn check(nodes: &[Node], schedule: &Schedule) -> Result<CheckReport, GraphError> {
    // Where each node runs: (command buffer, level).
    let mut place: Vec<Option<(usize, u32)>> = vec![None; nodes.len()];
    for (cb_index, cb) in schedule.command_buffers.iter().enumerate() {
        if cb.levels.len() != cb.nodes.len() {
            return fail(format!(
                "command buffer {cb_index} has {} levels for {} nodes",
                cb.levels.len(),
                cb.nodes.len()
            ));
        }
        for l in 0..cb.level_count() {
            for &i in cb.level(l) {
                if i >= nodes.len() || !cb.nodes.contains(&i) {
                    return fail(format!(
                        "command buffer {cb_index} runs node {i}, which it does not cover"
                    ));
                }
                if place[i].is_some() {
                    return fail(format!("node {i} ({}) is scheduled twice", nodes[i].label));
                }
                if cb.levels[i - cb.nodes.start] != l as u32 {
                    return fail(format!(
                        "node {i} runs in level {l} but is listed at level {}",
                        cb.levels[i - cb.nodes.start]
                    ));
                }
                place[i] = Some((cb_index, l as u32));
            }
        }
    }
    if let Some(lost) = place.iter().position(Option::is_none) {
        return fail(format!(
            "node {lost} ({} `{}`) is never scheduled",
            nodes[lost].op, nodes[lost].label
        ));
    }
    let graph = conflict_graph(nodes);
    for edge in graph.raw_edges() {
        let (i, j) = (graph[edge.source()], graph[edge.target()]);
        if place[i] >= place[j] {
            return fail(format!(
                "node {i} ({} `{}`) and node {j} ({} `{}`) conflict but node {j} is not behind a barrier after node {i}: {:?} vs {:?}",
                nodes[i].op, nodes[i].label, nodes[j].op, nodes[j].label, place[i], place[j]
            ));
        }
    }
    Ok(CheckReport {
        nodes: nodes.len(),
        conflicting_pairs: graph.edge_count(),
    })
}

/// The conflicts of `nodes` as a graph: node weights are the recorded
/// indices (graph index `k` is node `k`), and an edge runs from each node
/// to every later node it conflicts with, by comparing every pair.
pub fn conflict_graph(nodes: &[Node]) -> DiGraph<usize, ()> {
    let mut graph = DiGraph::with_capacity(nodes.len(), nodes.len());
    for i in 0..nodes.len() {
        graph.add_node(i);
    }
    for j in 0..nodes.len() {
        for i in 0..j {
            if nodes[i].conflicts_with(&nodes[j]) {
                graph.add_edge(NodeIndex::new(i), NodeIndex::new(j), ());
            }
        }
    }
    graph
}

/// The longest chain of conflicting nodes in `nodes`: the lower bound on
/// levels for any correct schedule. The conflict graph is checked to be
/// acyclic (its edges follow the recorded order, so a cycle would be a
/// broken graph) and walked in topological order.
pub fn longest_conflict_chain(nodes: &[Node]) -> usize {
    let graph = conflict_graph(nodes);
    let order = match toposort(&graph, None) {
        Ok(order) => order,
        Err(cycle) => unreachable!(
            "conflict edges run forward in recorded order, yet node {} is on a cycle",
            graph[cycle.node_id()]
        ),
    };
    let mut depth = vec![1usize; nodes.len()];
    for v in order {
        let here = depth[v.index()];
        for w in graph.neighbors(v) {
            depth[w.index()] = depth[w.index()].max(here + 1);
        }
    }
    depth.into_iter().max().unwrap_or(0)
}

fn fail<T>(message: String) -> Result<T, GraphError> {
    Err(GraphError::Check(message))
}
