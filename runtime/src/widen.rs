//! Position-independent ranges. A decode step's cache write and attention
//! read depend on the position; a schedule made on their widest extent
//! (the whole destination, the whole cache capacity) orders every pair of
//! nodes that could conflict at any position, so it can be reused from
//! step to step (`plan`).

use weft_graph::{ByteRange, Node};
use weft_ops::{Op, OpNode, Shape, Tensor};

/// Makes a node's ranges independent of the step's position: a cache
/// write declares its whole destination, attention its cache's whole
/// capacity. Wider ranges only add conflicts, so a schedule of widened
/// nodes is valid at every position.
pub(crate) fn widen(node: &mut Node, payload: &OpNode) {
    if let Op::ProjAttention(_) = &payload.op {
        // Attention that also writes the caches it reads: the attention
        // output, then each cache whole.
        node.writes = payload.outputs.iter().map(Tensor::range).collect();
    }
    match &payload.op {
        op if op.writes_cache_rows() => {
            if let Some(dst) = payload.outputs.first() {
                node.writes = vec![dst.range()];
            }
        }
        op => {
            let Some(p) = op.attention_params() else {
                return;
            };
            for t in payload.inputs.iter().skip(1).take(2) {
                let cap = p.kv_capacity as usize;
                if cap <= t.rows() {
                    continue;
                }
                let Ok(full) =
                    Tensor::new(t.buffer, t.offset, t.dtype, Shape::new(&[cap, t.cols()]))
                else {
                    continue;
                };
                widen_read(&mut node.reads, t.range(), full.range());
            }
        }
    }
}

/// Replaces the read `narrow` by `wide` (or adds `wide`).
fn widen_read(reads: &mut Vec<ByteRange>, narrow: ByteRange, wide: ByteRange) {
    match reads.iter_mut().find(|r| **r == narrow) {
        Some(r) => *r = wide,
        None => reads.push(wide),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_graph::BufferId;
    use weft_ops::{AttentionParams, DType};

    fn node(p: &OpNode) -> Node {
        let (reads, writes) = p.ranges();
        Node::checked(p.op.name(), "n".into(), None, Some(reads), Some(writes)).unwrap()
    }

    #[test]
    fn cache_writes_and_attention_reads_cover_every_position() {
        let cache = Tensor::new(BufferId(1), 256, DType::F16, Shape::new(&[64, 32])).unwrap();
        let src = Tensor::new(BufferId(2), 0, DType::F32, Shape::new(&[1, 32])).unwrap();
        let set = OpNode::new(
            Op::SetRows {
                start: 5,
                ring: None,
            },
            vec![src],
            vec![cache],
        );
        let mut n = node(&set);
        assert_eq!(n.writes[0].len(), 64, "one f16 row before widening");
        widen(&mut n, &set);
        assert_eq!(n.writes, vec![cache.range()]);

        let q = Tensor::new(BufferId(3), 0, DType::F32, Shape::new(&[1, 64])).unwrap();
        let k = cache.rows_view(0, 6).unwrap();
        let v = Tensor::new(BufferId(4), 0, DType::F16, Shape::new(&[6, 32])).unwrap();
        let out = Tensor::new(BufferId(5), 0, DType::F32, Shape::new(&[1, 64])).unwrap();
        let params = AttentionParams {
            heads: 2,
            kv_heads: 1,
            head_dim: 32,
            scale: 0.1,
            q_position: 5,
            window: None,
            ring: None,
            softcap: 0.0,
            kv_capacity: 64,
            flash: true,
        };
        let attn = OpNode::new(Op::Attention(params), vec![q, k, v], vec![out]);
        let mut n = node(&attn);
        widen(&mut n, &attn);
        assert_eq!(n.reads[0], q.range());
        assert_eq!(n.reads[1], cache.range());
        assert_eq!(n.reads[2].len(), 64 * 32 * 2);
        assert_eq!(n.writes, vec![out.range()]);
        // Other ops keep their exact ranges.
        let add = OpNode::new(Op::Add, vec![q, q], vec![out]);
        let (mut a, b) = (node(&add), node(&add));
        widen(&mut a, &add);
        assert_eq!(a, b);
    }
}
