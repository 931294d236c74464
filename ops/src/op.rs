//! The op set: one enum, each variant with its parameters, its shape/dtype
//! rules ([`OpNode::validate`]) and the byte ranges it reads and writes
//! ([`OpNode::ranges`]).
//!
//! Adding an op (the checklist `docs/model-authors.md` walks through):
//! (1) a variant here with its name in [`Op::name`] (and its ranges in
//! [`OpNode::ranges`] if it does not touch its tensors whole), (2) its
//! shape/dtype rules in `rules.rs`, (3) a builder method in `builder.rs`,
//! (4) its reference in `reference/`, (5) a kernel in every backend that
//! supports it (`weft-kernels/src/<backend>/`, a dispatch arm in its
//! `mod.rs`), (6) a case in the cross-backend harness
//! (`kernels/tests/ops_vs_reference.rs`).

use crate::dtype::DType;
use crate::tensor::Tensor;
use crate::OpError;
use std::sync::Arc;
use weft_graph::ByteRange;

/// Rotary embedding layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(2i, 2i+1)` rotate together (GGUF llama layout).
    Normal,
    /// Halves `(i, i + n_dims/2)` rotate together (GPT-NeoX layout).
    Neox,
}

/// Where a fused node writes its rows as `set_rows` would: cache row
/// `start` on (modulo `ring` when the cache is a ring).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowsWrite {
    /// As in [`Op::SetRows`].
    pub start: u32,
    /// As in [`Op::SetRows`].
    pub ring: Option<u32>,
}

/// Rotary embedding parameters (YaRN-capable; defaults are plain RoPE).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Which elements rotate together.
    pub mode: RopeMode,
    /// Number of rotated dimensions per head (<= head size; the rest pass through).
    pub n_dims: usize,
    /// Elements per head; a row holds `cols / head_dim` heads.
    pub head_dim: usize,
    /// Frequency base: pair `i` turns by `position * base^(-2i / n_dims)`.
    pub base: f32,
    /// Linear position scaling (1 / scaling factor).
    pub freq_scale: f32,
    /// YaRN extrapolation mix (0: off).
    pub ext_factor: f32,
    /// Magnitude scale applied to cos and sin (1: none).
    pub attn_factor: f32,
    /// YaRN: rotations per context above which dimensions extrapolate.
    pub beta_fast: f32,
    /// YaRN: rotations per context below which dimensions interpolate.
    pub beta_slow: f32,
    /// Training context length, used by YaRN.
    pub orig_ctx: u32,
}

impl RopeParams {
    /// Plain RoPE over `n_dims` of `head_dim` with `base`.
    pub fn plain(mode: RopeMode, head_dim: usize, n_dims: usize, base: f32) -> Self {
        Self {
            mode,
            n_dims,
            head_dim,
            base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            orig_ctx: 0,
        }
    }
}

/// Causal grouped-query attention over a KV cache view.
///
/// Query row `i` sits at position `q_position + i`. The cache view holds
/// `kv_rows` rows; without a ring, row `r` holds position `r` and rows
/// `0..q_position + n` are valid. With a ring of `R` rows, slot `s` holds the
/// latest position `p < q_position + n` with `p % R == s`. A query at `p`
/// sees cached position `c` when `c <= p` and, with a window `W`, `p - c < W`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Query heads per row of `q`.
    pub heads: usize,
    /// Key/value heads per cache row; query head `h` reads kv head
    /// `h / (heads / kv_heads)`.
    pub kv_heads: usize,
    /// Elements per head (keys, values and queries alike).
    pub head_dim: usize,
    /// Factor applied to every `q . k` score before the softmax.
    pub scale: f32,
    /// Position of the first query row.
    pub q_position: u32,
    /// Sliding window: a query at `p` sees positions `> p - window`.
    pub window: Option<u32>,
    /// Ring size when the cache view is a ring (see above).
    pub ring: Option<u32>,
    /// Logit soft-capping `c * tanh(s / c)` (0: off).
    pub softcap: f32,
    /// Rows of the whole cache behind the view (0: the view's rows). Only
    /// used to mirror llama.cpp's kernel choice, which depends on its padded
    /// cache view; results are the same maths either way.
    pub kv_capacity: u32,
    /// Round as llama.cpp's flash-attention kernels do (true: the default
    /// of its tools), or as its attention with flash attention off (false:
    /// f16 score and value matmuls around a softmax, llama-cpp-python's
    /// default). The same maths; backends that only have the first refuse
    /// the second.
    pub flash: bool,
}

/// A cache-writing decode projection absorbed into [`Op::ProjAttention`]:
/// its rotation (if any) and where its row is written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProjWrite {
    /// As in [`Op::MatMulRows`].
    pub rope: Option<RopeParams>,
    /// As in [`Op::MatMulRows`].
    pub write: RowsWrite,
}

/// Parameters of [`Op::ProjAttention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProjAttentionParams {
    /// The attention (as in [`Op::AttentionQuantize`]).
    pub attn: AttentionParams,
    /// The query projection's rotation.
    pub q_rope: RopeParams,
    /// The key projection, when absorbed (its output is the key cache).
    pub k: Option<ProjWrite>,
    /// The value projection, when absorbed (its output is the value cache).
    pub v: Option<ProjWrite>,
}

impl ProjAttentionParams {
    /// The same parameters with the values that change per decode step
    /// (query position, cache rows written) cleared.
    pub fn structural(&self) -> Self {
        let clear = |p: Option<ProjWrite>| {
            p.map(|p| ProjWrite {
                write: RowsWrite {
                    start: 0,
                    ring: p.write.ring,
                },
                ..p
            })
        };
        Self {
            attn: AttentionParams {
                q_position: 0,
                ..self.attn
            },
            k: clear(self.k),
            v: clear(self.v),
            ..*self
        }
    }
}

/// One op with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `out[i] = dequant(table[ids[i]])`: inputs `table [rows, cols]` (any
    /// supported type), `ids i32 [n]`; output `f32 [n, cols]`.
    GetRows,
    /// Quantizes `f32 [n, k]` rows to the output's activation format.
    QuantizeRows,
    /// `out = x @ w^T`: inputs `x [n, k]` (f32, or already in `w`'s
    /// activation format), `w [m, k]`; output `f32 [n, m]`.
    MatMul,
    /// `out = x / sqrt(mean(x^2) + eps) * w`: inputs `x f32 [n, d]`, `w f32 [d]`.
    RmsNorm {
        /// Added to the mean square inside the square root.
        eps: f32,
    },
    /// `out = a + b`; `b` has `a`'s shape or a single row broadcast over rows.
    Add,
    /// `out = a * b`, broadcasting like `Add`.
    Mul,
    /// `out = x * factor`.
    Scale {
        /// The multiplier.
        factor: f32,
    },
    /// Rotary embedding: inputs `x f32 [n, heads * head_dim]`, `positions i32 [n]`.
    Rope(RopeParams),
    /// Rotary embedding with a per-pair frequency divisor: inputs `x f32
    /// [n, heads * head_dim]`, `positions i32 [n]`, `factors f32
    /// [n_dims / 2]`. Pair `i` turns by the angle [`Op::Rope`] gives it
    /// with `position * base^(-2i / n_dims)` divided by `factors[i]`
    /// (llama.cpp's `freq_factors`: Llama 3's `rope_freqs.weight`).
    RopeFactors(RopeParams),
    /// Row softmax of `x * scale`.
    Softmax {
        /// Applied to `x` before the softmax.
        scale: f32,
    },
    /// Attention: inputs `q f32 [n, heads * head_dim]`, `k`, `v` (f16 or f32,
    /// `[kv_rows, kv_heads * head_dim]`); output `f32 [n, heads * head_dim]`.
    Attention(AttentionParams),
    /// `out = silu(gate) * up`.
    SiluMul,
    /// `out = gelu(x)`, GELU in its tanh form
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`. Backends may
    /// evaluate it like ggml (input rounded to f16, a 65,536-entry table,
    /// `x` itself from 10 up, 0 below -10): within 2^-10 relative of the
    /// formula where the result is not tiny.
    Gelu,
    /// `out = gelu(gate) * up` (GEGLU; `gelu` as in [`Op::Gelu`]).
    GeluMul,
    /// `out = (x - mean(x)) / sqrt(var(x) + eps) * w + b` per row: inputs
    /// `x f32 [n, d]`, `w f32 [d]`, `b f32 [d]` (LayerNorm with bias).
    LayerNorm {
        /// Added to the variance inside the square root.
        eps: f32,
    },
    /// Writes `src f32 [n, d]` into rows `start..start + n` of `dst` (ring
    /// slots `p % ring` when `ring` is set), converting to `dst`'s type. The
    /// output tensor is the whole destination; only those rows are written.
    SetRows {
        /// Position of the first source row.
        start: u32,
        /// Ring size of the destination, if it is a ring.
        ring: Option<u32>,
    },
    /// Index of the largest value of each row (ties: lowest index); output `i32 [n]`.
    Argmax,
    /// Copies with type conversion (f32 <-> f16/bf16).
    Copy,
    /// Fused `rms_norm` then `quantize` (made by the fusion pass, never
    /// recorded directly): inputs `x`, `w`; output `x`'s normalised rows in
    /// an activation format. Same bits as the two ops.
    RmsNormQuantize {
        /// As in [`Op::RmsNorm`].
        eps: f32,
    },
    /// Fused `silu_mul` then `quantize`: inputs `gate`, `up`; output the
    /// quantized product.
    SiluMulQuantize,
    /// Fused `rope` then `set_rows`: inputs `x`, `positions`; output the
    /// cache, whose rows are written as `set_rows` writes them.
    RopeSetRows {
        /// The rotation.
        rope: RopeParams,
        /// As in [`Op::SetRows`].
        start: u32,
        /// As in [`Op::SetRows`].
        ring: Option<u32>,
    },
    /// Fused in-place `add` then `rms_norm` then `quantize`: inputs `x`,
    /// `b`, `w`; outputs `x` (overwritten with `x + b`) and the quantized
    /// normalised sum.
    AddRmsNormQuantize {
        /// As in [`Op::RmsNorm`].
        eps: f32,
    },
    /// Fused `rms_norm` of `b` (a post-norm), then the in-place residual
    /// `add` of it, then `rms_norm` and `quantize` (Gemma's post-attention
    /// and post-feed-forward norms with the next pre-norm): inputs `x`,
    /// `b`, `w_b`, `w`; outputs `x` (overwritten with `x + rms_norm(b) *
    /// w_b`) and the quantized normalised sum.
    NormAddRmsNormQuantize {
        /// `b`'s norm's epsilon.
        eps_b: f32,
        /// The sum's norm's epsilon.
        eps: f32,
    },
    /// Fused `matmul` then what reads its rows: a bias added in place (when
    /// `bias` is set), `rope` (when `rope` is set) and/or `set_rows` into a
    /// cache (when `write` is set; the output is the cache). Inputs `x`,
    /// `w`, then `positions` with a rope, then the one-row `bias`.
    MatMulRows {
        /// The rotation applied to the product, if any.
        rope: Option<RopeParams>,
        /// The cache rows the product is written to, if any.
        write: Option<RowsWrite>,
        /// A bias row is added to the product before the rotation.
        bias: bool,
    },
    /// Fused gate projection, `silu_mul` and `quantize` (a feed-forward's
    /// middle): inputs `x`, `w_gate` and the up projection's output `u`
    /// (`up` false) or its weights `w_up` (`up` true: both products in one
    /// node); output `quantize(silu(x @ w_gate^T) * u)`.
    MatMulSiluQuantize {
        /// The up projection is computed by the node (inputs `x`, `w_gate`,
        /// `w_up`) rather than read (inputs `x`, `w_gate`, `u`).
        up: bool,
    },
    /// Fused `attention` then `quantize`: inputs `q`, `k`, `v`; output the
    /// attention rows in an activation format (what the output projection
    /// reads).
    AttentionQuantize(AttentionParams),
    /// Fused decode attention with the projections it reads (made by the
    /// fusion pass for a backend that offers it, never recorded): the query
    /// projection with its rotation (`matmul+rope`), the key and value
    /// projections written into their caches when absorbed (`matmul+rope+
    /// set_rows`, `matmul+set_rows`), then `attention+quantize`. Inputs `x`
    /// (the activation row), the key and value cache views attention reads,
    /// `w_q`, `positions`, then `w_k` (when `k` is set) and `w_v` (when `v`
    /// is set); outputs the quantized attention rows, then the key cache
    /// and the value cache as absorbed. Same bits as the chain.
    ProjAttention(Box<ProjAttentionParams>),
    /// Writes host bytes captured at record time into the output.
    Write {
        /// The bytes, exactly the output's size.
        data: Arc<[u8]>,
    },
    /// DeepSeek-V4 rotary embedding of the last `n_dims` of each head
    /// (interleaved pairs, YaRN frequencies, optionally inverse): inputs
    /// `x f32 [n, heads * head_dim]`, `positions i32 [n]`. See
    /// [`crate::family::TailRopeParams`].
    TailRope(crate::family::TailRopeParams),
    /// Hyper-connection coefficients (pre, post, Sinkhorn comb) from the
    /// mixer's outputs: inputs `m f32 [n, mix]`, `scale f32 [3]` (`[1]` for
    /// the head), `base f32 [mix]`; output `f32 [n, mix]`. See
    /// [`crate::family::HcMixParams`].
    HcMix(crate::family::HcMixParams),
    /// Collapse of `hc` streams: `y = sum_k coeffs[k] x[k]`; inputs `x
    /// f32 [n, hc * d]`, `coeffs f32 [n, c >= hc]` (the first `hc` columns
    /// are used) and, with `norm_eps`, a weight `f32 [d]`: the output is
    /// then `rms_norm(y) * weight`; output `f32 [n, d]`.
    HcCollapse {
        /// Number of streams.
        hc: usize,
        /// RMS-normalise the collapsed row with this epsilon (and the weight input).
        norm_eps: Option<f32>,
    },
    /// Hyper-connection post-mix: stream `j` of the output is `post[j] f +
    /// sum_a comb[a][j] x[a]`; inputs `x f32 [n, hc * d]`, `f f32 [n, d]`,
    /// `coeffs f32 [n, (2 + hc) hc]` (as [`Op::HcMix`] writes them);
    /// output `f32 [n, hc * d]`.
    HcExpand {
        /// Number of streams.
        hc: usize,
    },
    /// The KV compressor's gated pooling. See [`crate::family::CompressParams`].
    Compress(crate::family::CompressParams),
    /// Indexer scores and top-k over compressed rows. See
    /// [`crate::family::IndexerParams`].
    IndexerTopK(crate::family::IndexerParams),
    /// Attention with sinks over a window ring plus compressed rows. See
    /// [`crate::family::SinkAttentionParams`].
    SinkAttention(crate::family::SinkAttentionParams),
    /// Indexed (expert) matmul: `out[i, s] = w[ids[i, s]] @ x_row(i, s)`;
    /// inputs `x [n, k]` or `[n * slots, k]` (f32), `w [e, m, k]` (any
    /// weight type), `ids i32 [n, slots]`; output `f32 [n, slots * m]`.
    /// `x_row(i, s)` is row `i` of an `[n, k]` input and row `i * slots +
    /// s` of an `[n * slots, k]` one.
    MatMulId,
    /// MoE expert selection; output `i32 [n, k]`. See
    /// [`crate::family::MoeRouteParams`].
    MoeRoute(crate::family::MoeRouteParams),
    /// MoE weights of the selected experts; output `f32 [n, k]`. See
    /// [`crate::family::MoeWeightsParams`].
    MoeWeights(crate::family::MoeWeightsParams),
    /// Clamped SwiGLU: `silu(min(gate, limit)) * clamp(up, -limit, limit)`.
    SwigluClamp {
        /// The clamp limit.
        limit: f32,
    },
    /// Weighted sum of expert outputs: inputs `y f32 [n, k * d]`, `weights
    /// f32 [n, k]`; output `f32 [n, d]`.
    MoeCombine,
    /// Top-k selection of a MoE router's probabilities (softmax gating):
    /// input `probs f32 [n, E]`, output `i32 [n, k]`, the ids of each row's
    /// `k` largest values in descending order, ties to the lower id.
    MoeTopK {
        /// Experts per token.
        k: usize,
    },
    /// The router probabilities of the selected experts: inputs `probs f32
    /// [n, E]`, `ids i32 [n, k]`; output `f32 [n, k]`, `probs[ids]`, with
    /// `normalize` divided by their sum (summed in order, clamped below at
    /// 2^-14 as llama.cpp does).
    MoeGather {
        /// Renormalise over the selected experts.
        normalize: bool,
    },
}

impl Op {
    /// The op with the values that change from one decode step to the next
    /// cleared: attention's query position (also sink attention's and the
    /// indexer's), a cache write's first row (also the compressor's first
    /// pooled row), a host write's bytes (its length is its output's).
    /// This is the one place those values are named: step plans compare
    /// recordings by it ([`same_structure`](Self::same_structure)), a
    /// backend keys its captured graphs by it and reads those values per
    /// step.
    pub fn structural(&self) -> Op {
        use crate::family::{CompressParams, IndexerParams, SinkAttentionParams};
        let rows = |w: &RowsWrite| RowsWrite {
            start: 0,
            ring: w.ring,
        };
        match self {
            Op::Write { .. } => Op::Write {
                data: Arc::from(Vec::new()),
            },
            Op::Attention(p) => Op::Attention(AttentionParams {
                q_position: 0,
                ..*p
            }),
            Op::AttentionQuantize(p) => Op::AttentionQuantize(AttentionParams {
                q_position: 0,
                ..*p
            }),
            Op::ProjAttention(p) => Op::ProjAttention(Box::new(p.structural())),
            Op::SetRows { ring, .. } => Op::SetRows {
                start: 0,
                ring: *ring,
            },
            Op::RopeSetRows { rope, ring, .. } => Op::RopeSetRows {
                rope: *rope,
                start: 0,
                ring: *ring,
            },
            Op::MatMulRows { rope, write, bias } => Op::MatMulRows {
                rope: *rope,
                write: write.as_ref().map(rows),
                bias: *bias,
            },
            Op::SinkAttention(p) => Op::SinkAttention(SinkAttentionParams {
                q_position: 0,
                ..*p
            }),
            Op::IndexerTopK(p) => Op::IndexerTopK(IndexerParams {
                q_position: 0,
                ..*p
            }),
            Op::Compress(p) => Op::Compress(CompressParams { first_row: 0, ..*p }),
            other => other.clone(),
        }
    }

    /// Whether [`structural`](Self::structural) clears anything of this op.
    fn has_step_values(&self) -> bool {
        matches!(
            self,
            Op::Write { .. }
                | Op::Attention(_)
                | Op::AttentionQuantize(_)
                | Op::ProjAttention(_)
                | Op::SetRows { .. }
                | Op::RopeSetRows { .. }
                | Op::MatMulRows { write: Some(_), .. }
                | Op::SinkAttention(_)
                | Op::IndexerTopK(_)
                | Op::Compress(_)
        )
    }

    /// Equal up to the values that change from one decode step to the next
    /// (those [`structural`](Self::structural) clears; host writes of equal
    /// length). Step plans compare recordings with it.
    pub fn same_structure(&self, other: &Op) -> bool {
        match (self, other) {
            (Op::Write { data: x }, Op::Write { data: y }) => x.len() == y.len(),
            (Op::ProjAttention(p), Op::ProjAttention(q)) => p.structural() == q.structural(),
            _ if self.has_step_values() => self.structural() == other.structural(),
            _ => self == other,
        }
    }

    /// Whether the op writes rows of a cache (`set_rows`, alone or fused;
    /// the compressor's rows of a row table): its first row is a step
    /// value, and it writes only some rows of its destination, so it
    /// retires no earlier write of it.
    pub fn writes_cache_rows(&self) -> bool {
        matches!(
            self,
            Op::SetRows { .. }
                | Op::RopeSetRows { .. }
                | Op::MatMulRows { write: Some(_), .. }
                | Op::Compress(_)
        )
    }

    /// The attention parameters of an attention op, fused or not.
    pub fn attention_params(&self) -> Option<&AttentionParams> {
        match self {
            Op::Attention(p) | Op::AttentionQuantize(p) => Some(p),
            Op::ProjAttention(p) => Some(&p.attn),
            _ => None,
        }
    }

    /// Short name used in labels, dumps and profiles.
    pub fn name(&self) -> &'static str {
        match self {
            Op::GetRows => "get_rows",
            Op::QuantizeRows => "quantize",
            Op::MatMul => "matmul",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Add => "add",
            Op::Mul => "mul",
            Op::Scale { .. } => "scale",
            Op::Rope(_) => "rope",
            Op::RopeFactors(_) => "rope_factors",
            Op::Softmax { .. } => "softmax",
            Op::Attention(_) => "attention",
            Op::SiluMul => "silu_mul",
            Op::Gelu => "gelu",
            Op::GeluMul => "gelu_mul",
            Op::LayerNorm { .. } => "layer_norm",
            Op::SetRows { .. } => "set_rows",
            Op::Argmax => "argmax",
            Op::Copy => "copy",
            Op::Write { .. } => "write",
            Op::TailRope(_) => "tail_rope",
            Op::HcMix(_) => "hc_mix",
            Op::HcCollapse { .. } => "hc_collapse",
            Op::HcExpand { .. } => "hc_expand",
            Op::Compress(_) => "compress",
            Op::IndexerTopK(_) => "indexer_topk",
            Op::SinkAttention(_) => "sink_attention",
            Op::MatMulId => "matmul_id",
            Op::MoeRoute(_) => "moe_route",
            Op::MoeWeights(_) => "moe_weights",
            Op::SwigluClamp { .. } => "swiglu_clamp",
            Op::MoeCombine => "moe_combine",
            Op::MoeTopK { .. } => "moe_top_k",
            Op::MoeGather { .. } => "moe_gather",
            Op::RmsNormQuantize { .. } => "rms_norm+quantize",
            Op::SiluMulQuantize => "silu_mul+quantize",
            Op::RopeSetRows { .. } => "rope+set_rows",
            Op::AddRmsNormQuantize { .. } => "add+rms_norm+quantize",
            Op::NormAddRmsNormQuantize { .. } => "rms_norm+add+rms_norm+quantize",
            Op::AttentionQuantize(_) => "attention+quantize",
            Op::ProjAttention(_) => "qkv+attention+quantize",
            Op::MatMulSiluQuantize { up: false } => "matmul+silu_mul+quantize",
            Op::MatMulSiluQuantize { up: true } => "gate_up+silu_mul+quantize",
            Op::MatMulRows { rope, write, bias } => {
                match (*bias, rope.is_some(), write.is_some()) {
                    (false, true, true) => "matmul+rope+set_rows",
                    (false, true, false) => "matmul+rope",
                    (false, false, true) => "matmul+set_rows",
                    (false, false, false) => "matmul",
                    (true, true, true) => "matmul+bias+rope+set_rows",
                    (true, true, false) => "matmul+bias+rope",
                    (true, false, true) => "matmul+bias+set_rows",
                    (true, false, false) => "matmul+bias",
                }
            }
        }
    }
}

/// An op applied to tensors: what a node of a recording computes.
#[derive(Clone, Debug, PartialEq)]
pub struct OpNode {
    /// What the node computes.
    pub op: Op,
    /// Tensors it reads, in the order its op documents.
    pub inputs: Vec<Tensor>,
    /// Tensors it writes (one for every op today).
    pub outputs: Vec<Tensor>,
}

impl OpNode {
    /// A node; check it with [`OpNode::validate`] before recording.
    pub fn new(op: Op, inputs: Vec<Tensor>, outputs: Vec<Tensor>) -> Self {
        Self {
            op,
            inputs,
            outputs,
        }
    }

    /// Exact byte ranges read and written. Most ops touch their tensors
    /// whole; `SetRows` writes only the destination rows it fills.
    pub fn ranges(&self) -> (Vec<ByteRange>, Vec<ByteRange>) {
        let reads = self.inputs.iter().map(Tensor::range).collect();
        let writes = match (&self.op, self.outputs.first(), self.inputs.first()) {
            (Op::SetRows { start, ring }, Some(dst), Some(src))
            | (Op::RopeSetRows { start, ring, .. }, Some(dst), Some(src)) => {
                set_rows_ranges(dst, src.rows(), *start, *ring)
            }
            (Op::MatMulRows { write: Some(w), .. }, Some(dst), Some(x)) => {
                set_rows_ranges(dst, x.rows(), w.start, w.ring)
            }
            (Op::ProjAttention(p), Some(out), Some(x)) => {
                let mut writes = vec![out.range()];
                let caches = [p.k, p.v].into_iter().flatten();
                for (pw, dst) in caches.zip(&self.outputs[1..]) {
                    writes.extend(set_rows_ranges(
                        dst,
                        x.rows(),
                        pw.write.start,
                        pw.write.ring,
                    ));
                }
                writes
            }
            _ => self.outputs.iter().map(Tensor::range).collect(),
        };
        (reads, writes)
    }

    /// Checks arity, shapes and types. Builder methods call this before recording.
    pub fn validate(&self) -> Result<(), OpError> {
        crate::rules::validate(self)
    }
}

/// Destination rows written by `SetRows`, coalesced into contiguous runs.
fn set_rows_ranges(dst: &Tensor, n: usize, start: u32, ring: Option<u32>) -> Vec<ByteRange> {
    let row = dst.row_bytes() as u64;
    let slot = |p: u64| match ring {
        Some(r) if r > 0 => p % r as u64,
        _ => p,
    };
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for i in 0..n as u64 {
        let s = slot(start as u64 + i);
        match runs.last_mut() {
            Some((_, end)) if *end == s => *end += 1,
            _ => runs.push((s, s + 1)),
        }
    }
    runs.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in runs {
        match merged.last_mut() {
            Some((_, end)) if *end >= s => *end = (*end).max(e),
            _ => merged.push((s, e)),
        }
    }
    merged
        .into_iter()
        .map(|(s, e)| ByteRange::new(dst.buffer, dst.offset + s * row, dst.offset + e * row))
        .collect()
}

/// True for the plain float types kernels read as values.
pub fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::SinkAttentionParams;

    fn attention(q_position: u32, window: Option<u32>) -> AttentionParams {
        AttentionParams {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            scale: 0.5,
            q_position,
            window,
            ring: None,
            softcap: 0.0,
            kv_capacity: 0,
            flash: true,
        }
    }

    /// Per-step values are the only thing `structural` clears: ops that
    /// differ in one compare equal, ops that differ in anything else do not.
    #[test]
    fn structure_ignores_step_values_only() {
        let sink = |q_position, window| {
            Op::SinkAttention(SinkAttentionParams {
                heads: 4,
                head_dim: 8,
                scale: 0.5,
                q_position,
                window,
                ring: 8,
                ratio: 0,
                top_k: 0,
                out_rope: None,
            })
        };
        let rows = |start, ring| Op::MatMulRows {
            rope: None,
            write: Some(RowsWrite { start, ring }),
            bias: false,
        };
        let same = [
            (
                Op::Attention(attention(3, None)),
                Op::Attention(attention(9, None)),
            ),
            (
                Op::SetRows {
                    start: 1,
                    ring: None,
                },
                Op::SetRows {
                    start: 7,
                    ring: None,
                },
            ),
            (rows(2, Some(8)), rows(5, Some(8))),
            (sink(1, 4), sink(6, 4)),
            (
                Op::Write {
                    data: Arc::from(vec![1u8, 2]),
                },
                Op::Write {
                    data: Arc::from(vec![3u8, 4]),
                },
            ),
        ];
        for (a, b) in &same {
            assert!(a.same_structure(b), "{a:?} vs {b:?}");
            assert_eq!(a.structural(), b.structural());
        }
        let different = [
            (
                Op::Attention(attention(3, None)),
                Op::Attention(attention(3, Some(4))),
            ),
            (
                Op::SetRows {
                    start: 1,
                    ring: None,
                },
                Op::SetRows {
                    start: 1,
                    ring: Some(8),
                },
            ),
            (rows(2, Some(8)), rows(2, None)),
            (
                rows(2, None),
                Op::MatMulRows {
                    rope: None,
                    write: None,
                    bias: false,
                },
            ),
            (sink(1, 4), sink(1, 5)),
            (
                Op::Write {
                    data: Arc::from(vec![1u8]),
                },
                Op::Write {
                    data: Arc::from(vec![1u8, 2]),
                },
            ),
            (Op::MatMul, Op::Argmax),
        ];
        for (a, b) in &different {
            assert!(!a.same_structure(b), "{a:?} vs {b:?}");
            assert!(!b.same_structure(a), "{b:?} vs {a:?}");
        }
    }
}
