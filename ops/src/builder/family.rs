//! Builder methods of the family-module ops (see [`crate::family`]), available
//! on every [`Recorder`](crate::Recorder) through [`FamilyBuilder`].

use super::Builder;
use crate::dtype::DType;
use crate::family::{
    CompressParams, HcMixParams, IndexerParams, MoeRouteParams, MoeWeightsParams,
    SinkAttentionParams, TailRopeParams,
};
use crate::op::Op;
use crate::tensor::Tensor;
use crate::OpError;
use weft_graph::Label;

/// Recording the family-module ops; each method checks the op's rules,
/// allocates its output and records one node.
pub trait FamilyBuilder: Builder {
    /// Rotary embedding of the last `p.n_dims` of each head of `x` at `positions`.
    fn tail_rope(
        &mut self,
        x: Tensor,
        positions: Tensor,
        p: TailRopeParams,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let dims = x.shape;
        self.push_new(
            Op::TailRope(p),
            vec![x, positions],
            DType::F32,
            dims.dims(),
            label,
        )
    }

    /// Hyper-connection coefficients from the mixer outputs `m`; with
    /// `p.norm_eps`, `streams` (the mixer's input) must be given and `m` is
    /// divided by its RMS first.
    fn hc_mix(
        &mut self,
        m: Tensor,
        scale: Tensor,
        base: Tensor,
        streams: Option<Tensor>,
        p: HcMixParams,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let dims = m.shape;
        let mut inputs = vec![m, scale, base];
        inputs.extend(streams);
        self.push_new(Op::HcMix(p), inputs, DType::F32, dims.dims(), label)
    }

    /// `sum_k coeffs[k] x[k]` over the `hc` streams of `x`, then (with
    /// `norm`: weight and epsilon) its RMS norm.
    fn hc_collapse(
        &mut self,
        x: Tensor,
        coeffs: Tensor,
        hc: usize,
        norm: Option<(Tensor, f32)>,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let dims = [x.rows(), x.cols() / hc.max(1)];
        let mut inputs = vec![x, coeffs];
        inputs.extend(norm.map(|n| n.0));
        let op = Op::HcCollapse {
            hc,
            norm_eps: norm.map(|n| n.1),
        };
        self.push_new(op, inputs, DType::F32, &dims, label)
    }

    /// The post-mix: new streams from the old ones and the sublayer output `f`.
    fn hc_expand(
        &mut self,
        x: Tensor,
        f: Tensor,
        coeffs: Tensor,
        hc: usize,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let dims = x.shape;
        self.push_new(
            Op::HcExpand { hc },
            vec![x, f, coeffs],
            DType::F32,
            dims.dims(),
            label,
        )
    }

    /// Pools, normalises and rotates `p.rows` compressor rows from the
    /// `kv`/`gate` rings into rows `p.first_row..` of `out` (a whole row
    /// table; its other rows are left as they are).
    #[allow(clippy::too_many_arguments)]
    fn compress_into(
        &mut self,
        kv: Tensor,
        gate: Tensor,
        ape: Tensor,
        norm: Tensor,
        p: CompressParams,
        out: Tensor,
        label: impl Into<Label>,
    ) -> Result<(), OpError> {
        self.push(Op::Compress(p), vec![kv, gate, ape, norm], vec![out], label)
    }

    /// The indexer's top-k rows per query (`i32 [n, top_k]`).
    fn indexer_topk(
        &mut self,
        q: Tensor,
        weights: Tensor,
        keys: Tensor,
        p: IndexerParams,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let dims = [q.rows(), p.top_k];
        self.push_new(
            Op::IndexerTopK(p),
            vec![q, weights, keys],
            DType::I32,
            &dims,
            label,
        )
    }

    /// Attention with sinks over the `window` ring plus compressed `rows`
    /// (all visible ones, or `selection`'s).
    #[allow(clippy::too_many_arguments)]
    fn sink_attention(
        &mut self,
        q: Tensor,
        window: Tensor,
        rows: Tensor,
        sinks: Tensor,
        selection: Option<Tensor>,
        p: SinkAttentionParams,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let mut inputs = vec![q, window, rows, sinks];
        inputs.extend(selection);
        let dims = q.shape;
        self.push_new(Op::SinkAttention(p), inputs, DType::F32, dims.dims(), label)
    }

    /// Indexed matmul: `w[ids[i, s]] @ x_row(i, s)`, output `[n, slots * m]`.
    fn matmul_id(
        &mut self,
        x: Tensor,
        w: Tensor,
        ids: Tensor,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let m = w.shape.dims().get(1).copied().unwrap_or(0);
        let dims = [ids.rows(), ids.cols() * m];
        self.push_new(Op::MatMulId, vec![x, w, ids], DType::F32, &dims, label)
    }

    /// Expert ids `i32 [n, k]`; `extra` is `[bias]` (top-k) or `[table, tokens]` (hash).
    fn moe_route(
        &mut self,
        logits: Tensor,
        extra: &[Tensor],
        p: MoeRouteParams,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let mut inputs = vec![logits];
        inputs.extend_from_slice(extra);
        let dims = [logits.rows(), p.k];
        self.push_new(Op::MoeRoute(p), inputs, DType::I32, &dims, label)
    }

    /// Weights `f32 [n, k]` of the experts `ids`.
    fn moe_weights(
        &mut self,
        logits: Tensor,
        ids: Tensor,
        p: MoeWeightsParams,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let dims = ids.shape;
        self.push_new(
            Op::MoeWeights(p),
            vec![logits, ids],
            DType::F32,
            dims.dims(),
            label,
        )
    }

    /// `silu(min(gate, limit)) * clamp(up, -limit, limit)`.
    fn swiglu_clamp(
        &mut self,
        gate: Tensor,
        up: Tensor,
        limit: f32,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let dims = gate.shape;
        self.push_new(
            Op::SwigluClamp { limit },
            vec![gate, up],
            DType::F32,
            dims.dims(),
            label,
        )
    }

    /// `sum_j weights[j] y[j] (+ shared)` per row (`y [n, k * d]`, output `[n, d]`).
    fn moe_combine(
        &mut self,
        y: Tensor,
        weights: Tensor,
        shared: Option<Tensor>,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let dims = [y.rows(), y.cols() / weights.cols().max(1)];
        let mut inputs = vec![y, weights];
        inputs.extend(shared);
        self.push_new(Op::MoeCombine, inputs, DType::F32, &dims, label)
    }
}

impl<R: Builder + ?Sized> FamilyBuilder for R {}
