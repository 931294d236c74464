//! Property tests of the reorder pass against the independent checker and a
//! brute-force longest-chain oracle, plus a simulated execution showing that
//! running levels in any within-level order matches recorded order.

use proptest::prelude::*;
use weft_graph::checker::{check, longest_conflict_chain};
use weft_graph::cut::{cut, CutPolicy};
use weft_graph::reorder::{schedule, Strategy as Plan};
use weft_graph::{synth, BufferId, ByteRange, Node};

fn arb_range(buffers: u32, bytes: u64) -> impl Strategy<Value = ByteRange> {
    (0..buffers, 0..bytes - 1).prop_flat_map(move |(b, start)| {
        (start + 1..=bytes).prop_map(move |end| ByteRange::new(BufferId(b), start, end))
    })
}

fn arb_node(buffers: u32, bytes: u64) -> impl Strategy<Value = Node> {
    (
        proptest::collection::vec(arb_range(buffers, bytes), 0..3),
        proptest::collection::vec(arb_range(buffers, bytes), 1..3),
        0u32..4,
    )
        .prop_map(|(reads, writes, layer)| {
            Node::checked("op", "n".into(), Some(layer), Some(reads), Some(writes)).unwrap()
        })
}

fn arb_recording() -> impl Strategy<Value = Vec<Node>> {
    (1u32..5, 2u64..64).prop_flat_map(|(buffers, bytes)| {
        proptest::collection::vec(arb_node(buffers, bytes), 0..40)
    })
}

/// Executes `nodes` over byte buffers: each node hashes what it reads and its
/// index into every byte it writes. Any reordering that breaks a hazard
/// changes the result.
fn simulate(
    nodes: &[Node],
    order: impl Iterator<Item = usize>,
    buffers: u32,
    bytes: u64,
) -> Vec<Vec<u64>> {
    let mut mem = vec![vec![0u64; bytes as usize]; buffers as usize];
    for i in order {
        let n = &nodes[i];
        let mut h = 0xcbf2_9ce4_8422_2325u64 ^ i as u64;
        for r in &n.reads {
            for x in &mem[r.buffer.0 as usize][r.start as usize..r.end as usize] {
                h = (h ^ x).wrapping_mul(0x100_0000_01b3);
            }
        }
        for (k, w) in n.writes.iter().enumerate() {
            for (o, x) in mem[w.buffer.0 as usize][w.start as usize..w.end as usize]
                .iter_mut()
                .enumerate()
            {
                *x = h.wrapping_add((k * 1000 + o) as u64);
            }
        }
    }
    mem
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn reorder_is_correct_and_minimal(nodes in arb_recording(), k in 1u32..4) {
        let cuts = cut(&nodes, &CutPolicy { layers_per_cb: Some(k), ..Default::default() });
        let s = schedule(&nodes, &cuts, Plan::Reorder);
        check(&nodes, &s).unwrap();
        for (cb, range) in s.command_buffers.iter().zip(&cuts) {
            prop_assert_eq!(cb.stats.levels, longest_conflict_chain(&nodes[range.clone()]));
        }
        for baseline in [Plan::RecordedOrder, Plan::GreedyWindow(4), Plan::GreedyWindow(64)] {
            let b = schedule(&nodes, &cuts, baseline);
            check(&nodes, &b).unwrap();
            prop_assert!(b.barriers() >= s.barriers());
        }
    }

    #[test]
    fn levels_run_in_any_inner_order_match_recorded_order(nodes in arb_recording()) {
        let (buffers, bytes) = (5, 64);
        let one = cut(&nodes, &CutPolicy::default());
        let s = schedule(&nodes, &one, Plan::Reorder);
        let expected = simulate(&nodes, 0..nodes.len(), buffers, bytes);
        // Reverse each level: nodes in one level must commute.
        let mut reversed = Vec::new();
        for cb in &s.command_buffers {
            for l in 0..cb.level_count() {
                reversed.extend(cb.level(l).iter().rev());
            }
        }
        prop_assert_eq!(simulate(&nodes, reversed.into_iter(), buffers, bytes), expected);
    }
}

#[test]
fn checker_rejects_a_dropped_hazard() {
    let r = |b, s, e| ByteRange::new(BufferId(b), s, e);
    let nodes = vec![
        Node::checked("w", "a".into(), None, Some(vec![]), Some(vec![r(0, 0, 8)])).unwrap(),
        Node::checked(
            "r",
            "b".into(),
            None,
            Some(vec![r(0, 4, 6)]),
            Some(vec![r(1, 0, 8)]),
        )
        .unwrap(),
    ];
    let cuts = cut(&nodes, &CutPolicy::default());
    let mut s = schedule(&nodes, &cuts, Plan::Reorder);
    check(&nodes, &s).unwrap();
    assert_eq!(s.barriers(), 1);
    // Squash both into one level: the checker must refuse it.
    let cb = &mut s.command_buffers[0];
    cb.levels = vec![0, 0];
    cb.level_starts = vec![0, 2];
    let err = check(&nodes, &s).unwrap_err().to_string();
    assert!(err.contains("conflict"), "{err}");
    // Drop a node: refused too.
    let cb = &mut s.command_buffers[0];
    cb.order = vec![0];
    cb.levels = vec![0];
    cb.level_starts = vec![0, 1];
    assert!(check(&nodes, &s).is_err());
}

#[test]
fn llama_shape_decode_beats_baselines() {
    let syn = synth::llama_shape(&synth::LlamaShape::default());
    let cuts = cut(&syn.nodes, &CutPolicy::default());
    let weft = schedule(&syn.nodes, &cuts, Plan::Reorder);
    let eager = schedule(&syn.nodes, &cuts, Plan::RecordedOrder);
    let greedy = schedule(&syn.nodes, &cuts, Plan::GreedyWindow(64));
    check(&syn.nodes, &weft).unwrap();
    assert!(weft.barriers() <= greedy.barriers() && greedy.barriers() <= eager.barriers());
    assert!(weft.barriers() < eager.barriers());
}
