//! The launch pass: after scheduling, each level of a command buffer
//! becomes the launches a backend makes and the streams they go to, so the
//! backend only launches.
//!
//! Invariants:
//! - Nodes of one [`weft_ops::launch::SharedLaunchKey`] go in one launch, up
//!   to what the kernels take ([`weft_kernels::Kernels::shared_launch_limit`]),
//!   in the order of each launch's first node; every other node is a launch
//!   of its own. A shared launch computes each node's bits as its own launch
//!   does, so the pass changes no result.
//! - A level's launches go round-robin to `min(launches, streams)` streams.
//! - A single-node launch of a level on one stream is marked early when the
//!   next level is one node and the kernels say so of the pair
//!   ([`weft_kernels::Kernels::launches_early`]).
//! - A timed command buffer keeps a launch per node (each node has its own
//!   events) and shares none.

use std::ops::Range;
use weft_ops::OpNode;

/// One launch: the nodes it computes (indices in the command buffer, in
/// order), and whether it starts before its stream's previous kernel ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Launch {
    pub nodes: Vec<usize>,
    pub early: bool,
}

/// One level's launches and the number of streams they spread over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LevelLaunches {
    pub launches: Vec<Launch>,
    pub width: usize,
}

impl LevelLaunches {
    /// The stream launch `k` goes to (0: the main stream).
    pub fn stream_of(&self, k: usize) -> usize {
        k % self.width
    }
}

/// What the pass asks of the device.
pub(crate) struct LaunchRules<'a> {
    /// Streams a level may spread over (at least 1).
    pub streams: usize,
    /// Whether nodes may share launches (false for timed command buffers).
    pub share: bool,
    /// How many nodes of one key a launch of this node takes (1: alone).
    pub limit: &'a dyn Fn(&OpNode) -> usize,
    /// Whether a node followed on its stream by the other launches early.
    pub early: &'a dyn Fn(&OpNode, &OpNode) -> bool,
}

/// The launches of every level of a command buffer whose nodes are
/// `nodes`, in execution order, and whose levels are `levels`.
pub(crate) fn plan(
    nodes: &[&OpNode],
    levels: &[Range<usize>],
    rules: &LaunchRules<'_>,
) -> Vec<LevelLaunches> {
    levels
        .iter()
        .enumerate()
        .map(|(li, level)| {
            let mut launches = level_launches(nodes, level.clone(), rules);
            let width = launches.len().min(rules.streams.max(1)).max(1);
            let next = levels
                .get(li + 1)
                .filter(|l| l.len() == 1)
                .map(|l| nodes[l.start]);
            if let (1, Some(next)) = (width, next) {
                for l in &mut launches {
                    if let [i] = l.nodes[..] {
                        l.early = (rules.early)(nodes[i], next);
                    }
                }
            }
            LevelLaunches { launches, width }
        })
        .collect()
}

fn level_launches(nodes: &[&OpNode], level: Range<usize>, rules: &LaunchRules<'_>) -> Vec<Launch> {
    let mut launches: Vec<Launch> = Vec::with_capacity(level.len());
    // Keys with a launch still open to more nodes: (key, launch, limit).
    let mut open = Vec::new();
    for i in level {
        let alone = Launch {
            nodes: vec![i],
            early: false,
        };
        let key = rules.share.then(|| nodes[i].shared_launch_key()).flatten();
        let limit = key.map_or(1, |_| (rules.limit)(nodes[i]));
        let (Some(key), 2..) = (key, limit) else {
            launches.push(alone);
            continue;
        };
        match open.iter().position(|&(k, _, _)| k == key) {
            Some(o) => {
                let (_, at, limit) = open[o];
                let l: &mut Launch = &mut launches[at];
                l.nodes.push(i);
                if l.nodes.len() >= limit {
                    open.swap_remove(o);
                }
            }
            None => {
                open.push((key, launches.len(), limit));
                launches.push(alone);
            }
        }
    }
    launches
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_graph::BufferId;
    use weft_ops::{DType, Op, Shape, Tensor};

    fn t(buffer: u32, offset: u64, dtype: DType, dims: &[usize]) -> Tensor {
        Tensor::new(BufferId(buffer), offset, dtype, Shape::new(dims)).unwrap()
    }

    /// A one-row matmul reading activation row `x` of buffer 1.
    fn matvec(x: u64, w: DType) -> OpNode {
        let out = t(9, 0, DType::F32, &[1, 32]);
        OpNode::new(
            Op::MatMul,
            vec![t(1, x, DType::Q8_0, &[1, 64]), t(2, 0, w, &[32, 64])],
            vec![out],
        )
    }

    fn norm() -> OpNode {
        let x = t(3, 0, DType::F32, &[1, 64]);
        OpNode::new(Op::RmsNorm { eps: 1e-6 }, vec![x], vec![x])
    }

    fn rules(streams: usize, share: bool) -> LaunchRules<'static> {
        LaunchRules {
            streams,
            share,
            limit: &|n| {
                if n.shared_launch_key().is_some() {
                    3
                } else {
                    1
                }
            },
            early: &|n, next| matches!(n.op, Op::RmsNorm { .. }) && matches!(next.op, Op::MatMul),
        }
    }

    fn nodes_of(plan: &[LevelLaunches]) -> Vec<Vec<Vec<usize>>> {
        plan.iter()
            .map(|l| l.launches.iter().map(|x| x.nodes.clone()).collect())
            .collect()
    }

    #[test]
    fn one_activation_shares_launches_up_to_the_limit_in_first_node_order() {
        let nodes = [
            matvec(0, DType::Q4_0),
            norm(),
            matvec(0, DType::Q4_0),
            matvec(64, DType::Q4_0),
            matvec(0, DType::Q8_0),
            matvec(0, DType::Q4_0),
            matvec(0, DType::Q4_0),
        ];
        let refs: Vec<&OpNode> = nodes.iter().collect();
        let plan = plan(&refs, std::slice::from_ref(&(0..7)), &rules(4, true));
        assert_eq!(
            nodes_of(&plan),
            [vec![vec![0, 2, 5], vec![1], vec![3], vec![4], vec![6]]]
        );
        assert_eq!(plan[0].width, 4);
        assert_eq!(plan[0].stream_of(4), 0);
        // Every node is in exactly one launch.
        let mut all: Vec<usize> = plan[0]
            .launches
            .iter()
            .flat_map(|l| l.nodes.clone())
            .collect();
        all.sort();
        assert_eq!(all, (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn timed_command_buffers_launch_every_node_alone() {
        let nodes = [matvec(0, DType::Q4_0), matvec(0, DType::Q4_0)];
        let refs: Vec<&OpNode> = nodes.iter().collect();
        let plan = plan(&refs, std::slice::from_ref(&(0..2)), &rules(4, false));
        assert_eq!(nodes_of(&plan), [vec![vec![0], vec![1]]]);
        assert_eq!(plan[0].width, 2);
    }

    #[test]
    fn early_marks_need_one_stream_and_a_single_next_node() {
        let nodes = [
            norm(),
            matvec(0, DType::Q4_0),
            norm(),
            norm(),
            matvec(0, DType::Q4_0),
        ];
        let refs: Vec<&OpNode> = nodes.iter().collect();
        let levels = [0..1, 1..2, 2..4, 4..5];
        let early = |p: &[LevelLaunches]| -> Vec<bool> {
            p.iter()
                .flat_map(|l| l.launches.iter().map(|x| x.early))
                .collect()
        };
        // Level 2 has two launches on two streams: not early.
        let p = plan(&refs, &levels, &rules(4, true));
        assert_eq!(early(&p), [true, false, false, false, false]);
        // On one stream every norm before a lone matmul is.
        let p = plan(&refs, &levels, &rules(1, true));
        assert_eq!(early(&p), [true, false, true, true, false]);
    }
}
