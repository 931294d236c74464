//! Dispatch of the family-module ops ([`crate::OpFamily`]) to their
//! references, one module per family: f32 values, f64 sums and softmaxes.

use super::{compress, hyper, matmul_id, moe, sink_attention, tail_rope};
use super::{f32_bytes, HostMemory};
use crate::op::{Op, OpNode};
use crate::OpError;

/// Runs an op of a family module; returns the bytes of its output.
pub(super) fn run(node: &OpNode, mem: &HostMemory) -> Result<Vec<u8>, OpError> {
    let ins = &node.inputs;
    let out = &node.outputs[0];
    match &node.op {
        Op::TailRope(p) => tail_rope::tail_rope(mem, &ins[0], &ins[1], p),
        Op::HcMix(p) => hyper::hc_mix(mem, ins, p),
        Op::HcCollapse { hc, norm_eps } => hyper::hc_collapse(mem, ins, *hc, *norm_eps),
        Op::HcExpand { hc } => hyper::hc_expand(mem, &ins[0], &ins[1], &ins[2], *hc),
        Op::Compress(p) => compress::compress(mem, &ins[0], &ins[1], &ins[2], &ins[3], out, p),
        Op::IndexerTopK(p) => compress::indexer_topk(mem, &ins[0], &ins[1], &ins[2], p),
        Op::SinkAttention(p) => sink_attention::sink_attention(mem, ins, p),
        Op::MatMulId => matmul_id::matmul_id(mem, &ins[0], &ins[1], &ins[2]),
        Op::MoeRoute(p) => moe::moe_route(mem, ins, p),
        Op::MoeWeights(p) => moe::moe_weights(mem, &ins[0], &ins[1], p),
        Op::SwigluClamp { limit } => {
            let (g, u) = (mem.to_f32(&ins[0])?, mem.to_f32(&ins[1])?);
            Ok(f32_bytes(
                g.iter()
                    .zip(&u)
                    .map(|(&g, &u)| moe::swiglu_clamp(g, u, *limit))
                    .collect(),
            ))
        }
        Op::MoeCombine => moe::moe_combine(mem, ins),
        other => Err(OpError::Unsupported {
            op: other.name(),
            what: "the family reference".into(),
        }),
    }
}
