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

/// One merge of the pass: node `first` into its reader `second` (indices
/// in the recording as it was at that round), keeping the intermediate or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Merge {
    pub first: usize,
    pub second: usize,
    pub keep: bool,
}

/// Merges fusable pairs of `nodes`/`payloads` in place; returns the merges
/// of each round (replayable on a recording of the same structure with
/// [`replay`]). `check`: validate every fused node (a fused op's
/// rules are its parts', which were validated when recorded, so this
/// checks the pass itself; on in debug builds and tests, like the
/// schedule checker).
/// `widen`: give fused nodes position-independent ranges
/// ([`crate::widen::widen`]), as the caller gave the recorded ones.
pub(crate) fn fuse(
    nodes: &mut Vec<Node>,
    payloads: &mut Vec<OpNode>,
    dead: &HashSet<BufferId>,
    supports: &dyn Fn(&OpNode) -> bool,
    check: bool,
    widen: bool,
) -> Vec<Vec<Merge>> {
    let mut rounds = Vec::new();
    loop {
        let pairs = candidates(nodes, payloads, dead, supports, check);
        if pairs.is_empty() {
            return rounds;
        }
        // A node merged in this round (removed, or replaced by a fused
        // node) takes no other pair until the next round: pairs were
        // found on the payloads as they were before the round.
        let mut touched = vec![false; nodes.len()];
        let mut gone = vec![false; nodes.len()];
        let mut round = Vec::new();
        for (i, j, keep, fused) in pairs {
            if touched[i] || touched[j] {
                continue;
            }
            touched[i] = true;
            touched[j] = true;
            round.push(Merge {
                first: i,
                second: j,
                keep,
            });
            let label = format!("{}+{}", nodes[i].label, nodes[j].label);
            let (reads, writes) = fused.ranges();
            nodes[j] = Node {
                op: fused.op.name(),
                label: label.into(),
                layer: nodes[j].layer.or(nodes[i].layer),
                reads,
                writes,
            };
            if widen {
                crate::widen::widen(&mut nodes[j], &fused);
            }
            payloads[j] = fused;
            gone[i] = true;
        }
        rounds.push(round);
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

/// Applies the merges [`fuse`] made on a recording of the same structure
/// to `payloads` (the nodes' ranges are not needed: the schedule is reused
/// too). `None` if a merge does not apply, which a caller treats as "not
/// the same structure".
pub(crate) fn replay(payloads: Vec<OpNode>, rounds: &[Vec<Merge>]) -> Option<Vec<OpNode>> {
    let mut payloads: Vec<Option<OpNode>> = payloads.into_iter().map(Some).collect();
    for round in rounds {
        for m in round {
            let first = payloads.get(m.first)?.as_ref()?;
            let second = payloads.get(m.second)?.as_ref()?;
            let fused = weft_ops::fused::fuse_pair(first, second, m.keep)?;
            payloads[m.second] = Some(fused);
            payloads[m.first] = None;
        }
        payloads.retain(Option::is_some);
    }
    payloads.into_iter().collect()
}

/// `(i, j, keep, fused)`: node `i` can merge into its only reader `j`.
fn candidates(
    nodes: &[Node],
    payloads: &[OpNode],
    dead: &HashSet<BufferId>,
    supports: &dyn Fn(&OpNode) -> bool,
    check: bool,
) -> Vec<(usize, usize, bool, OpNode)> {
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
        out.push((i, j, keep, fused));
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
            // Writes fully covered by this one are no longer anyone's data
            // (a cache write's range may be widened beyond the rows it
            // writes, so it retires nothing).
            // (The fused attention writes cache rows too, beside its output.)
            let cache_rows = payloads[k].op.writes_cache_rows()
                || matches!(payloads[k].op, weft_ops::Op::ProjAttention(_));
            if !cache_rows {
                list.retain(|(old, _)| !(w.start <= old.start && old.end <= w.end));
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use weft_ops::{DType, Op, Shape, Tensor};

    fn t(buffer: u32, dtype: DType, dims: &[usize]) -> Tensor {
        Tensor::new(BufferId(buffer), 0, dtype, Shape::new(dims)).unwrap()
    }

    /// A decode step's attention over two query heads of 64 at position 3.
    fn decode_attention() -> weft_ops::AttentionParams {
        weft_ops::AttentionParams {
            heads: 2,
            kv_heads: 1,
            head_dim: 64,
            scale: 0.125,
            q_position: 3,
            window: None,
            ring: None,
            softcap: 0.0,
            kv_capacity: 16,
            flash: true,
        }
    }

    /// The recording's nodes for `payloads`, with their exact ranges.
    fn graph_nodes(payloads: &[OpNode]) -> Vec<Node> {
        payloads
            .iter()
            .map(|p| {
                let (reads, writes) = p.ranges();
                Node::checked(p.op.name(), "n".into(), None, Some(reads), Some(writes)).unwrap()
            })
            .collect()
    }

    /// add (in place), rms_norm, quantize: two rounds of merges, and
    /// replaying them on the unfused payloads gives the fused ones.
    #[test]
    fn merges_replay_onto_an_equal_recording() {
        let (x, b, w) = (
            t(0, DType::F32, &[1, 64]),
            t(1, DType::F32, &[1, 64]),
            t(2, DType::F32, &[64]),
        );
        let (h, q) = (t(3, DType::F32, &[1, 64]), t(4, DType::Q8_0, &[1, 64]));
        let payloads = vec![
            OpNode::new(Op::Add, vec![x, b], vec![x]),
            OpNode::new(Op::RmsNorm { eps: 1e-6 }, vec![x, w], vec![h]),
            OpNode::new(Op::QuantizeRows, vec![h], vec![q]),
        ];
        let mut nodes = graph_nodes(&payloads);
        let mut fused = payloads.clone();
        let dead: HashSet<BufferId> = [BufferId(3)].into();
        let rounds = fuse(&mut nodes, &mut fused, &dead, &|_| true, true, false);
        assert_eq!(rounds.len(), 2);
        assert_eq!(fused.len(), 1);
        assert!(matches!(fused[0].op, Op::AddRmsNormQuantize { .. }));
        assert_eq!(replay(payloads.clone(), &rounds), Some(fused));
        // A recording of another structure does not take the merges.
        assert_eq!(replay(payloads[1..].to_vec(), &rounds), None);
    }

    /// A layer's q, k and v projections (rope, cache writes) and its
    /// attention+quantize become one node when the backend offers it: the
    /// query first (its row is dead), then the cache writers (kept).
    #[test]
    fn projections_fold_into_attention() {
        use weft_ops::{RopeMode, RopeParams, RowsWrite};
        let x = t(0, DType::Q8_1, &[1, 64]);
        let (wq, wk, wv) = (
            t(1, DType::Q4_1, &[128, 64]),
            t(2, DType::Q4_1, &[64, 64]),
            t(3, DType::Q4_1, &[64, 64]),
        );
        let pos = t(4, DType::I32, &[1]);
        let q = t(5, DType::F32, &[1, 128]);
        let (kc, vc) = (t(6, DType::F16, &[16, 64]), t(7, DType::F16, &[16, 64]));
        let out = t(8, DType::Q8_1, &[1, 128]);
        let rope = RopeParams::plain(RopeMode::Normal, 64, 64, 10000.0);
        let write = Some(RowsWrite {
            start: 3,
            ring: None,
        });
        let attn = decode_attention();
        let payloads = vec![
            OpNode::new(
                Op::MatMulRows {
                    rope: Some(rope),
                    write: None,
                    bias: false,
                },
                vec![x, wq, pos],
                vec![q],
            ),
            OpNode::new(
                Op::MatMulRows {
                    rope: Some(rope),
                    write,
                    bias: false,
                },
                vec![x, wk, pos],
                vec![kc],
            ),
            OpNode::new(
                Op::MatMulRows {
                    rope: None,
                    write,
                    bias: false,
                },
                vec![x, wv],
                vec![vc],
            ),
            OpNode::new(
                Op::AttentionQuantize(attn),
                vec![q, kc.rows_view(0, 4).unwrap(), vc.rows_view(0, 4).unwrap()],
                vec![out],
            ),
        ];
        let mut nodes = graph_nodes(&payloads);
        let mut fused = payloads.clone();
        let dead: HashSet<BufferId> = [BufferId(5)].into();
        let rounds = fuse(&mut nodes, &mut fused, &dead, &|_| true, true, true);
        assert_eq!(fused.len(), 1, "{fused:?}");
        let Op::ProjAttention(p) = &fused[0].op else {
            panic!("not fused: {:?}", fused[0].op)
        };
        assert!(p.k.is_some() && p.v.is_some());
        assert_eq!(fused[0].outputs, vec![out, kc, vc]);
        assert_eq!(&fused[0].inputs[5..], &[wk, wv]);
        assert_eq!(replay(payloads.clone(), &rounds), Some(fused.clone()));
        // Its chain is the recorded nodes (the query row in scratch).
        let parts = weft_ops::fused::decompose(&fused[0], |d, dims| {
            Tensor::new(BufferId(5), 0, d, Shape::new(dims))
        })
        .unwrap()
        .unwrap();
        assert_eq!(parts, payloads);
        // A backend without the fused node keeps them apart.
        let mut kept = payloads.clone();
        let mut n2 = graph_nodes(&payloads);
        let no_proj = |n: &OpNode| !matches!(n.op, Op::ProjAttention(_));
        fuse(&mut n2, &mut kept, &dead, &no_proj, true, true);
        assert_eq!(kept, payloads);
    }

    /// Qwen's q, k and v projections add a bias row in place before their
    /// rope and cache writes: each chain becomes one `matmul_rows` node
    /// with its bias, and a biased query does not fold into attention (the
    /// fused attention takes no biases).
    #[test]
    fn biased_projections_fuse_into_matmul_rows() {
        use weft_ops::{RopeMode, RopeParams};
        let x = t(0, DType::Q8_0, &[1, 64]);
        let (wq, wk, wv) = (
            t(1, DType::Q5_0, &[128, 64]),
            t(2, DType::Q5_0, &[64, 64]),
            t(3, DType::Q5_0, &[64, 64]),
        );
        let (bq, bk, bv) = (
            t(4, DType::F32, &[128]),
            t(5, DType::F32, &[64]),
            t(6, DType::F32, &[64]),
        );
        let pos = t(7, DType::I32, &[1]);
        let (q, k, v) = (
            t(8, DType::F32, &[1, 128]),
            t(9, DType::F32, &[1, 64]),
            t(10, DType::F32, &[1, 64]),
        );
        let (qr, kr) = (t(11, DType::F32, &[1, 128]), t(12, DType::F32, &[1, 64]));
        let (kc, vc) = (t(13, DType::F16, &[16, 64]), t(14, DType::F16, &[16, 64]));
        let out = t(15, DType::Q8_0, &[1, 128]);
        let rope = RopeParams::plain(RopeMode::Neox, 64, 64, 1e6);
        let attn = decode_attention();
        let set = Op::SetRows {
            start: 3,
            ring: None,
        };
        let payloads = vec![
            OpNode::new(Op::MatMul, vec![x, wq], vec![q]),
            OpNode::new(Op::Add, vec![q, bq], vec![q]),
            OpNode::new(Op::MatMul, vec![x, wk], vec![k]),
            OpNode::new(Op::Add, vec![k, bk], vec![k]),
            OpNode::new(Op::Rope(rope), vec![q, pos], vec![qr]),
            OpNode::new(Op::MatMul, vec![x, wv], vec![v]),
            OpNode::new(Op::Add, vec![v, bv], vec![v]),
            OpNode::new(Op::Rope(rope), vec![k, pos], vec![kr]),
            OpNode::new(set.clone(), vec![kr], vec![kc]),
            OpNode::new(set, vec![v], vec![vc]),
            OpNode::new(
                Op::AttentionQuantize(attn),
                vec![qr, kc.rows_view(0, 4).unwrap(), vc.rows_view(0, 4).unwrap()],
                vec![out],
            ),
        ];
        let mut nodes = graph_nodes(&payloads);
        let mut fused = payloads.clone();
        let dead: HashSet<BufferId> = (8..=12).map(BufferId).collect();
        let rounds = fuse(&mut nodes, &mut fused, &dead, &|_| true, true, true);
        let names: Vec<&str> = fused.iter().map(|n| n.op.name()).collect();
        assert_eq!(
            names,
            [
                "matmul+bias+rope",
                "matmul+bias+rope+set_rows",
                "matmul+bias+set_rows",
                "attention+quantize"
            ],
            "{fused:?}"
        );
        assert_eq!(fused[0].inputs, vec![x, wq, pos, bq]);
        assert_eq!(fused[1].inputs, vec![x, wk, pos, bk]);
        assert_eq!(fused[2].inputs, vec![x, wv, bv]);
        assert_eq!(replay(payloads, &rounds), Some(fused));
    }

    /// Gemma's post-norm, residual add, next norm and quantize become one
    /// node: the norm-quantize pair, then the add, then the post-norm.
    #[test]
    fn post_norm_folds_into_the_next_norm() {
        let (x, o) = (t(0, DType::F32, &[1, 64]), t(1, DType::F32, &[1, 64]));
        let (wp, w) = (t(2, DType::F32, &[64]), t(3, DType::F32, &[64]));
        let (hp, h) = (t(4, DType::F32, &[1, 64]), t(5, DType::F32, &[1, 64]));
        let q = t(6, DType::Q8_0, &[1, 64]);
        let payloads = vec![
            OpNode::new(Op::RmsNorm { eps: 1e-6 }, vec![o, wp], vec![hp]),
            OpNode::new(Op::Add, vec![x, hp], vec![x]),
            OpNode::new(Op::RmsNorm { eps: 1e-6 }, vec![x, w], vec![h]),
            OpNode::new(Op::QuantizeRows, vec![h], vec![q]),
        ];
        let mut nodes = graph_nodes(&payloads);
        let mut fused = payloads.clone();
        let dead: HashSet<BufferId> = [BufferId(4), BufferId(5)].into();
        let rounds = fuse(&mut nodes, &mut fused, &dead, &|_| true, true, false);
        assert_eq!(fused.len(), 1, "{fused:?}");
        assert!(matches!(fused[0].op, Op::NormAddRmsNormQuantize { .. }));
        assert_eq!(fused[0].inputs, vec![x, o, wp, w]);
        assert_eq!(fused[0].outputs, vec![x, q]);
        assert_eq!(replay(payloads, &rounds), Some(fused));
    }
}
