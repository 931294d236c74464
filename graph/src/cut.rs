//! Cutting a recording into command buffers.
//!
//! A command buffer boundary is a full barrier, so fewer, larger command
//! buffers give the reorder pass more room; smaller ones let a GPU start
//! earlier. The cut is made by layer count and/or caps on nodes and bytes.

use crate::node::Node;
use std::ops::Range;

/// Where to cut. `None` everywhere: one command buffer for the whole recording.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CutPolicy {
    /// Layers per command buffer (layer `l` goes to group `l / k`).
    pub layers_per_cb: Option<u32>,
    /// Most nodes in one command buffer.
    pub max_nodes: Option<usize>,
    /// Most bytes named by the ranges of one command buffer's nodes.
    pub max_bytes: Option<u64>,
}

/// Contiguous command-buffer ranges covering `0..nodes.len()`. Nodes without
/// a layer stay with the command buffer before them (or the first one).
pub fn cut(nodes: &[Node], policy: &CutPolicy) -> Vec<Range<usize>> {
    let mut cuts = Vec::new();
    let mut start = 0;
    let mut group: Option<u32> = None;
    let mut bytes = 0u64;
    for (i, node) in nodes.iter().enumerate() {
        let node_group = match (policy.layers_per_cb, node.layer) {
            (Some(k), Some(layer)) => Some(layer / k.max(1)),
            _ => None,
        };
        let node_bytes = node.bytes_touched();
        let new_group = matches!((group, node_group), (Some(g), Some(n)) if g != n);
        let too_many = policy.max_nodes.is_some_and(|m| i - start >= m.max(1));
        let too_big = policy.max_bytes.is_some_and(|m| bytes + node_bytes > m);
        if i > start && (new_group || too_many || too_big) {
            cuts.push(start..i);
            start = i;
            bytes = 0;
        }
        if node_group.is_some() {
            group = node_group;
        }
        bytes += node_bytes;
    }
    if start < nodes.len() {
        cuts.push(start..nodes.len());
    }
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BufferId, ByteRange};

    fn node(layer: Option<u32>) -> Node {
        let w = ByteRange::new(BufferId(0), 0, 4);
        Node::checked("x", "x".into(), layer, Some(vec![]), Some(vec![w])).unwrap()
    }

    #[test]
    fn cuts_by_layer_group_and_node_cap() {
        let nodes: Vec<Node> = [None, Some(0), Some(0), Some(1), Some(2), Some(3), None]
            .into_iter()
            .map(node)
            .collect();
        let policy = CutPolicy {
            layers_per_cb: Some(2),
            ..Default::default()
        };
        assert_eq!(cut(&nodes, &policy), vec![0..4, 4..7]);
        let policy = CutPolicy {
            max_nodes: Some(3),
            ..Default::default()
        };
        assert_eq!(cut(&nodes, &policy), vec![0..3, 3..6, 6..7]);
        assert_eq!(cut(&nodes, &CutPolicy::default()), vec![0..7]);
        assert!(cut(&[], &CutPolicy::default()).is_empty());
    }
}
