//! Op families: the ops whose kernels live in a module of their own per
//! kind of work (hyper connections, compression, routing, sink attention,
//! ...), grouped once here. Backends and the reference dispatch these ops
//! by family, so no one else writes the variant list out:
//! [`family_ops!`](crate::family_ops) in a match arm stands for all of
//! them (the match stays exhaustive), [`Op::family`] names an op's family.
//! Each family's parameters live in a module named for the family.

mod compress;
mod hyper;
mod moe;
mod sink_attention;
mod tail_rope;

pub use compress::{CompressParams, IndexerParams};
pub use hyper::HcMixParams;
pub use moe::{MoeRouteParams, MoeSelect, MoeWeightsParams};
pub use sink_attention::SinkAttentionParams;
pub use tail_rope::{TailRopeParams, YarnScaling};

use crate::Op;

/// The kind of work an op of a family module does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpFamily {
    /// Rotary embedding of the trailing dimensions of each head (`TailRope`).
    TailRope,
    /// Hyper-connection stream mixing (`HcMix`, `HcCollapse`, `HcExpand`).
    HyperConnection,
    /// KV compression and the indexer's top-k (`Compress`, `IndexerTopK`).
    Compression,
    /// Attention with a learned sink (`SinkAttention`).
    SinkAttention,
    /// Expert routing, gating and combination (`MoeRoute`, `MoeWeights`,
    /// `SwigluClamp`, `MoeCombine`).
    Routing,
    /// A matmul per expert over the rows routed to it (`MatMulId`).
    ExpertMatMul,
}

/// A match pattern covering every op of a family module (see [`OpFamily`]).
#[macro_export]
macro_rules! family_ops {
    () => {
        $crate::Op::TailRope(_)
            | $crate::Op::HcMix(_)
            | $crate::Op::HcCollapse { .. }
            | $crate::Op::HcExpand { .. }
            | $crate::Op::Compress(_)
            | $crate::Op::IndexerTopK(_)
            | $crate::Op::SinkAttention(_)
            | $crate::Op::MatMulId
            | $crate::Op::MoeRoute(_)
            | $crate::Op::MoeWeights(_)
            | $crate::Op::SwigluClamp { .. }
            | $crate::Op::MoeCombine
    };
}

impl Op {
    /// The family module this op's kernels live in, or `None` for the ops
    /// the backends implement directly.
    pub fn family(&self) -> Option<OpFamily> {
        Some(match self {
            Op::TailRope(_) => OpFamily::TailRope,
            Op::HcMix(_) | Op::HcCollapse { .. } | Op::HcExpand { .. } => OpFamily::HyperConnection,
            Op::Compress(_) | Op::IndexerTopK(_) => OpFamily::Compression,
            Op::SinkAttention(_) => OpFamily::SinkAttention,
            Op::MoeRoute(_) | Op::MoeWeights(_) | Op::SwigluClamp { .. } | Op::MoeCombine => {
                OpFamily::Routing
            }
            Op::MatMulId => OpFamily::ExpertMatMul,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `family_ops!` and `Op::family` name the same ops.
    #[test]
    fn the_pattern_and_the_families_agree() {
        let ops = [
            Op::MatMulId,
            Op::MoeCombine,
            Op::GetRows,
            Op::MatMul,
            Op::Argmax,
            Op::SiluMul,
        ];
        for op in ops {
            let in_pattern = matches!(op, family_ops!());
            assert_eq!(in_pattern, op.family().is_some(), "{op:?}");
        }
    }
}
