//! The fusion pass: before scheduling, a node whose output only one later
//! node reads is merged into that node when weft has a fused op for the
//! pair (`weft_ops::fused`) and the device implements it.
//!
//! Safe by construction: the intermediate must be dead (written into a
//! pool scope the model ended, and read by nobody but the consumer), or
//! kept by the fused op; and moving the first node down to the consumer
//! must cross no node touching its inputs or outputs. The fused op
//! computes the same bits as the pair, so fusion changes no result, only
//! the number of nodes and levels. It runs to a fixed point, so chains of
//! three (add, rms_norm, quantize) fuse too.

use std::collections::HashSet;
use weft_graph::{BufferId, ByteRange, Node};
use weft_ops::OpNode;

/// Merges fusable pairs of `nodes`/`payloads` in place; returns how many
/// nodes were removed. `check`: validate every fused node (a fused op's
/// rules are its parts', which were validated when recorded, so this
/// checks the pass itself; on in debug builds and tests, like the
/// schedule checker).
pub(crate) fn fuse(
    nodes: &mut Vec<Node>,
    payloads: &mut Vec<OpNode>,
    dead: &HashSet<BufferId>,
    supports: &dyn Fn(&OpNode) -> bool,
    check: bool,
) -> usize {
    let mut removed = 0;
    loop {
        let pairs = candidates(nodes, payloads, dead, supports, check);
        if pairs.is_empty() {
            return removed;
        }
        let mut gone = vec![false; nodes.len()];
        for (i, j, fused) in pairs {
            if gone[i] || gone[j] {
                continue;
            }
            let label = format!("{}+{}", nodes[i].label, nodes[j].label);
            let (reads, writes) = fused.ranges();
            nodes[j] = Node {
                op: fused.op.name(),
                label: label.into(),
                layer: nodes[j].layer.or(nodes[i].layer),
                reads,
                writes,
            };
            payloads[j] = fused;
            gone[i] = true;
            removed += 1;
        }
        let mut k = 0;
        nodes.retain(|_| {
            k += 1;
            !gone[k - 1]
        });
        let mut k = 0;
        payloads.retain(|_| {
            k += 1;
            !gone[k - 1]
        });
    }
}

/// `(i, j, fused)`: node `i` can merge into its only reader `j`.
fn candidates(
    nodes: &[Node],
    payloads: &[OpNode],
    dead: &HashSet<BufferId>,
    supports: &dyn Fn(&OpNode) -> bool,
    check: bool,
) -> Vec<(usize, usize, OpNode)> {
    let readers = readers(nodes, payloads);
    let mut out = Vec::new();
    for (i, r) in readers.iter().enumerate() {
        // The consumer is the first reader; later readers are fine only
        // when the fused op still writes the intermediate.
        let Some(&j) = r.iter().min() else { continue };
        let keep = r.len() > 1 || !nodes[i].writes.iter().all(|w| dead.contains(&w.buffer));
        let Some(fused) = weft_ops::fused::fuse_pair(&payloads[i], &payloads[j], keep) else {
            continue;
        };
        if (check && fused.validate().is_err()) || !supports(&fused) || !movable(nodes, i, j) {
            continue;
        }
        out.push((i, j, fused));
    }
    out
}

/// For each node that can start a fused pair, the later nodes that read
/// bytes it was the last to write (empty for every other node: their
/// writes only retire older data).
fn readers(nodes: &[Node], payloads: &[OpNode]) -> Vec<Vec<usize>> {
    // Last writes per buffer, indexed by buffer id (ids are slot indices).
    let mut last: Vec<Vec<(ByteRange, usize)>> = Vec::new();
    let mut readers = vec![Vec::new(); nodes.len()];
    for (k, n) in nodes.iter().enumerate() {
        for r in &n.reads {
            for (w, i) in last.get(r.buffer.0 as usize).into_iter().flatten() {
                if w.overlaps(r) && readers[*i].last() != Some(&k) {
                    readers[*i].push(k);
                }
            }
        }
        for w in &n.writes {
            let b = w.buffer.0 as usize;
            if b >= last.len() {
                last.resize_with(b + 1, Vec::new);
            }
            let list = &mut last[b];
            // Writes fully covered by this one are no longer anyone's data.
            list.retain(|(old, _)| !(w.start <= old.start && old.end <= w.end));
            if weft_ops::fused::starts_pair(&payloads[k].op) {
                list.push((*w, k));
            }
        }
    }
    readers
}

/// Can node `i` move down to `j`'s place? No node in between may write what
/// `i` reads, or touch what `i` writes.
fn movable(nodes: &[Node], i: usize, j: usize) -> bool {
    let a = &nodes[i];
    nodes[i + 1..j].iter().all(|b| {
        let hits =
            |x: &[ByteRange], y: &[ByteRange]| x.iter().any(|p| y.iter().any(|q| p.overlaps(q)));
        !hits(&b.writes, &a.reads) && !hits(&b.writes, &a.writes) && !hits(&b.reads, &a.writes)
    })
}
