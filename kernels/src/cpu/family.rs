//! Dispatch of the family-module ops ([`weft_ops::OpFamily`]) on the CPU (their kernels live in
//! `tail_rope.rs`, `hyper.rs`, `compress.rs`, `sink_attention.rs` and
//! `moe.rs`): how each splits into work items, and which piece runs.

use super::{compress, hyper, moe, rows_per_item, sink_attention, tail_rope};
use super::{HostTensor, WorkSplit};
use weft_ops::{Op, OpError, OpNode};

/// Does the CPU implement this family-module node?
pub(super) fn supports(node: &OpNode) -> Result<(), OpError> {
    match &node.op {
        Op::MatMulId => moe::supports(&node.inputs[1]),
        _ => Ok(()),
    }
}

/// How a family-module node splits across `threads` threads.
pub(super) fn split(node: &OpNode, threads: usize) -> WorkSplit {
    let by_rows = |rows: usize| WorkSplit::new(rows, rows_per_item(rows, threads));
    match &node.op {
        Op::SinkAttention(p) => {
            let units = node.inputs[0].rows() * p.heads;
            WorkSplit::new(units, units.div_ceil(threads * 4).max(1))
        }
        Op::MatMulId => moe::split(&node.inputs[1], threads),
        Op::Compress(p) => by_rows(p.rows as usize),
        Op::IndexerTopK(_) => WorkSplit::new(node.inputs[0].rows(), 1),
        _ => by_rows(node.inputs[0].rows()),
    }
}

/// Runs piece `units` of a family-module node.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn run_item(
    node: &OpNode,
    ins: &[HostTensor],
    outs: &[HostTensor],
    units: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let out = &outs[0];
    match &node.op {
        Op::TailRope(p) => tail_rope::tail_rope(&ins[0], &ins[1], out, p, units),
        Op::HcMix(p) => hyper::hc_mix(ins, out, p, units),
        Op::HcCollapse { hc, norm_eps } => hyper::hc_collapse(ins, out, *hc, *norm_eps, units),
        Op::HcExpand { hc } => hyper::hc_expand(&ins[0], &ins[1], &ins[2], out, *hc, units),
        Op::Compress(p) => compress::compress(ins, out, p, units),
        Op::IndexerTopK(p) => compress::indexer_topk(&ins[0], &ins[1], &ins[2], out, p, units),
        Op::SinkAttention(p) => sink_attention::sink_attention(ins, out, p, units),
        Op::MatMulId => moe::matmul_id(&ins[0], &ins[1], &ins[2], out, units),
        Op::MoeRoute(p) => moe::route(ins, out, p, units),
        Op::MoeWeights(p) => moe::weights(&ins[0], &ins[1], out, p, units),
        Op::SwigluClamp { limit } => moe::swiglu_clamp(&ins[0], &ins[1], out, *limit, units),
        Op::MoeCombine => moe::combine(ins, out, units),
        other => Err(OpError::Unsupported {
            op: other.name(),
            what: "the CPU's family dispatch".into(),
        }),
    }
}

/// The i32 values of a tensor.
///
/// # Safety
/// As [`HostTensor::bytes`]; the pointer must be 4-byte aligned.
pub(super) unsafe fn i32s<'a>(t: &HostTensor) -> &'a [i32] {
    std::slice::from_raw_parts(t.ptr as *const i32, t.tensor.shape.elements())
}
