//! The builder API model code records with.
//!
//! A runtime session implements [`Recorder`] (allocate a tensor from the
//! current pool scope; record one node). Every [`Builder`] method checks its
//! op's rules, allocates its outputs and records one node per dispatch, each
//! with its own exact ranges. Model code only ever calls these methods.

use crate::dtype::DType;
use crate::op::{AttentionParams, Op, OpNode, RopeParams};
use crate::tensor::Tensor;
use crate::OpError;
use std::sync::Arc;
use weft_graph::Label;

mod family;
pub use family::FamilyBuilder;

/// What a session offers the builder.
pub trait Recorder {
    /// A fresh tensor from the current pool scope.
    fn alloc(&mut self, dtype: DType, dims: &[usize]) -> Result<Tensor, OpError>;
    /// Records one node. `node` has already passed [`OpNode::validate`].
    fn record(&mut self, node: OpNode, label: Label) -> Result<(), OpError>;
}

/// Builder methods, available on every [`Recorder`].
///
/// Each method validates its inputs (shapes and types, per
/// [`OpNode::validate`]), allocates its output from the recorder and records
/// one node with its exact byte ranges; it computes nothing itself. A
/// Gemma-style feed-forward block, run here by the reference
/// [`Interpreter`](crate::reference::Interpreter) (in a model the recorder
/// is a runtime session):
///
/// ```
/// use weft_ops::reference::Interpreter;
/// use weft_ops::Builder;
///
/// let (n, d, f) = (3, 8, 16);
/// let mut s = Interpreter::default();
/// let x = s.input_f32(&[n, d], &vec![0.5; n * d])?;
/// let norm = s.input_f32(&[d], &vec![1.0; d])?;
/// let gate = s.input_f32(&[f, d], &vec![0.01; f * d])?;
/// let up = s.input_f32(&[f, d], &vec![0.02; f * d])?;
/// let down = s.input_f32(&[d, f], &vec![0.03; d * f])?;
///
/// let h = s.rms_norm(x, norm, 1e-6, "ffn_norm")?;
/// let g = s.matmul(h, gate, "ffn_gate")?; // [n, f] = h @ gate^T
/// let u = s.matmul(h, up, "ffn_up")?;
/// let m = s.gelu_mul(g, u, "ffn_geglu")?;
/// let y = s.matmul(m, down, "ffn_down")?;
/// s.add_into(x, y, "ffn_residual")?; // x += y, in place
///
/// // Per-head norms: the same bytes seen as [rows * heads, head_dim].
/// let heads = s.reshape_rows(x, 2)?;
/// let head_norm = s.input_f32(&[d / 2], &vec![1.0; d / 2])?;
/// let normed = s.rms_norm(heads, head_norm, 1e-6, "head_norm")?;
/// assert_eq!(normed.shape.dims(), &[2 * n, d / 2]);
/// assert_eq!(s.read_f32(&x)?.len(), n * d);
/// # Ok::<(), weft_ops::OpError>(())
/// ```
pub trait Builder: Recorder {
    /// Validates and records `op` over `inputs` into `outputs`.
    fn push(
        &mut self,
        op: Op,
        inputs: Vec<Tensor>,
        outputs: Vec<Tensor>,
        label: impl Into<Label>,
    ) -> Result<(), OpError> {
        let node = OpNode::new(op, inputs, outputs);
        node.validate()?;
        self.record(node, label.into())
    }

    /// Records `op` with one freshly allocated output.
    fn push_new(
        &mut self,
        op: Op,
        inputs: Vec<Tensor>,
        dtype: DType,
        dims: &[usize],
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let out = self.alloc(dtype, dims)?;
        self.push(op, inputs, vec![out], label)?;
        Ok(out)
    }

    /// `x` (`[rows, parts * k]`) seen as `[rows * parts, k]`: the same bytes,
    /// no node recorded. Lets a row-wise op (an RMS norm) run per head.
    fn reshape_rows(&mut self, x: Tensor, parts: usize) -> Result<Tensor, OpError> {
        if parts == 0 || !x.cols().is_multiple_of(parts) {
            return Err(OpError::Shape(format!(
                "cannot split rows of {} into {parts} equal parts",
                x.cols()
            )));
        }
        x.reshape(&[x.rows() * parts, x.cols() / parts])
    }

    /// Embedding lookup: rows `ids` of `table`, as f32.
    fn get_rows(
        &mut self,
        table: Tensor,
        ids: Tensor,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let dims = [ids.shape.elements(), table.cols()];
        self.push_new(Op::GetRows, vec![table, ids], DType::F32, &dims, label)
    }

    /// Quantizes `x` into the activation format `w`'s matmul takes, or returns
    /// `x` when that format is f32. Share the result between matmuls with the
    /// same input (Q, K and V) to quantize once.
    fn activations_for(
        &mut self,
        x: Tensor,
        weight_dtype: DType,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let act = crate::quant::vec_dot_type(weight_dtype);
        if act == x.dtype {
            return Ok(x);
        }
        let dims = x.shape;
        self.push_new(Op::QuantizeRows, vec![x], act, dims.dims(), label)
    }

    /// `x @ w^T`; quantizes `x` first when `w` needs it and `x` is f32.
    fn matmul(&mut self, x: Tensor, w: Tensor, label: impl Into<Label>) -> Result<Tensor, OpError> {
        let label = label.into();
        let x = if crate::quant::vec_dot_type(w.dtype) == x.dtype {
            x
        } else {
            self.activations_for(x, w.dtype, format!("{label}.act"))?
        };
        let dims = [x.rows(), w.rows()];
        self.push_new(Op::MatMul, vec![x, w], DType::F32, &dims, label)
    }

    /// RMS norm times `weight`.
    fn rms_norm(
        &mut self,
        x: Tensor,
        weight: Tensor,
        eps: f32,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        self.push_new(
            Op::RmsNorm { eps },
            vec![x, weight],
            DType::F32,
            x.shape.dims(),
            label,
        )
    }

    /// `a + b` (b: same shape or one row).
    fn add(&mut self, a: Tensor, b: Tensor, label: impl Into<Label>) -> Result<Tensor, OpError> {
        self.push_new(Op::Add, vec![a, b], DType::F32, a.shape.dims(), label)
    }

    /// `a + b` written into `a` (in place: a persistent residual stream).
    fn add_into(&mut self, a: Tensor, b: Tensor, label: impl Into<Label>) -> Result<(), OpError> {
        self.push(Op::Add, vec![a, b], vec![a], label)
    }

    /// `a * b` (b: same shape or one row).
    fn mul(&mut self, a: Tensor, b: Tensor, label: impl Into<Label>) -> Result<Tensor, OpError> {
        self.push_new(Op::Mul, vec![a, b], DType::F32, a.shape.dims(), label)
    }

    /// `x * factor`.
    fn scale(
        &mut self,
        x: Tensor,
        factor: f32,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        self.push_new(
            Op::Scale { factor },
            vec![x],
            DType::F32,
            x.shape.dims(),
            label,
        )
    }

    /// Rotary embedding of `x [n, heads * head_dim]` at `positions i32 [n]`.
    fn rope(
        &mut self,
        x: Tensor,
        positions: Tensor,
        params: RopeParams,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        self.push_new(
            Op::Rope(params),
            vec![x, positions],
            DType::F32,
            x.shape.dims(),
            label,
        )
    }

    /// [`Builder::rope`] with each pair's angle divided by its frequency
    /// factor (`factors f32 [n_dims / 2]`, Llama 3's `rope_freqs.weight`).
    fn rope_factors(
        &mut self,
        x: Tensor,
        positions: Tensor,
        factors: Tensor,
        params: RopeParams,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        self.push_new(
            Op::RopeFactors(params),
            vec![x, positions, factors],
            DType::F32,
            x.shape.dims(),
            label,
        )
    }

    /// The ids `i32 [n, k]` of each row's `k` largest router probabilities.
    fn moe_top_k(
        &mut self,
        probs: Tensor,
        k: usize,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        self.push_new(
            Op::MoeTopK { k },
            vec![probs],
            DType::I32,
            &[probs.rows(), k],
            label,
        )
    }

    /// The probabilities `f32 [n, k]` of the experts `ids`, renormalised
    /// over them when `normalize`.
    fn moe_gather(
        &mut self,
        probs: Tensor,
        ids: Tensor,
        normalize: bool,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let dims = ids.shape;
        self.push_new(
            Op::MoeGather { normalize },
            vec![probs, ids],
            DType::F32,
            dims.dims(),
            label,
        )
    }

    /// Row softmax of `x * scale`.
    fn softmax(
        &mut self,
        x: Tensor,
        scale: f32,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        self.push_new(
            Op::Softmax { scale },
            vec![x],
            DType::F32,
            x.shape.dims(),
            label,
        )
    }

    /// Causal grouped-query attention of `q` over the cache views `k`, `v`.
    fn attention(
        &mut self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        params: AttentionParams,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        self.push_new(
            Op::Attention(params),
            vec![q, k, v],
            DType::F32,
            q.shape.dims(),
            label,
        )
    }

    /// `silu(gate) * up`.
    fn silu_mul(
        &mut self,
        gate: Tensor,
        up: Tensor,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        self.push_new(
            Op::SiluMul,
            vec![gate, up],
            DType::F32,
            gate.shape.dims(),
            label,
        )
    }

    /// `gelu(x)` (tanh form; see [`Op::Gelu`] for the precision backends keep).
    fn gelu(&mut self, x: Tensor, label: impl Into<Label>) -> Result<Tensor, OpError> {
        self.push_new(Op::Gelu, vec![x], DType::F32, x.shape.dims(), label)
    }

    /// `gelu(gate) * up`: the gated feed-forward of Gemma-style models (GEGLU).
    fn gelu_mul(
        &mut self,
        gate: Tensor,
        up: Tensor,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        self.push_new(
            Op::GeluMul,
            vec![gate, up],
            DType::F32,
            gate.shape.dims(),
            label,
        )
    }

    /// LayerNorm of each row of `x`, times `weight`, plus `bias`
    /// (both `[cols]`). Without a bias, pass a zero tensor.
    fn layer_norm(
        &mut self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor,
        eps: f32,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        self.push_new(
            Op::LayerNorm { eps },
            vec![x, weight, bias],
            DType::F32,
            x.shape.dims(),
            label,
        )
    }

    /// `x @ w^T + bias` (a linear layer with bias: [`Builder::matmul`] then
    /// [`Builder::add`] with the one-row `bias` broadcast over the rows).
    fn linear(
        &mut self,
        x: Tensor,
        w: Tensor,
        bias: Option<Tensor>,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        let label = label.into();
        let y = self.matmul(x, w, label.clone())?;
        match bias {
            Some(b) => {
                self.add_into(y, b, format!("{label}.bias"))?;
                Ok(y)
            }
            None => Ok(y),
        }
    }

    /// Writes the rows of `src` into `dst` at `start..` (ring slots when `ring` is set).
    fn set_rows(
        &mut self,
        src: Tensor,
        dst: Tensor,
        start: u32,
        ring: Option<u32>,
        label: impl Into<Label>,
    ) -> Result<(), OpError> {
        self.push(Op::SetRows { start, ring }, vec![src], vec![dst], label)
    }

    /// Index of each row's maximum.
    fn argmax(&mut self, x: Tensor, label: impl Into<Label>) -> Result<Tensor, OpError> {
        self.push_new(Op::Argmax, vec![x], DType::I32, &[x.rows()], label)
    }

    /// Converts `x` to `dtype`.
    fn copy_to(
        &mut self,
        x: Tensor,
        dtype: DType,
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        self.push_new(Op::Copy, vec![x], dtype, x.shape.dims(), label)
    }

    /// A tensor holding `data` (host bytes, copied at record time and written
    /// when the command buffer runs, so it is ordered with the work around it).
    fn upload(
        &mut self,
        dtype: DType,
        dims: &[usize],
        data: &[u8],
        label: impl Into<Label>,
    ) -> Result<Tensor, OpError> {
        self.push_new(
            Op::Write {
                data: Arc::from(data),
            },
            vec![],
            dtype,
            dims,
            label,
        )
    }

    /// `i32` values as a tensor (token ids, positions).
    fn upload_i32(&mut self, values: &[i32], label: impl Into<Label>) -> Result<Tensor, OpError> {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        self.upload(DType::I32, &[values.len()], bytes, label)
    }
}

impl<R: Recorder + ?Sized> Builder for R {}
