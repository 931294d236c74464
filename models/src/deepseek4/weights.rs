//! DeepSeek-V4 weights as tensors: names, shapes and types as the public
//! DeepSeek-V4 GGUFs (antirez/ds4, llama.cpp's `deepseek4`) store them,
//! checked on load. Weights are views of the mapped file, except:
//!
//! - the compressor position biases (`*_compressor_ape`), which the
//!   compressor op reads as f32, are widened to f32 copies;
//! - with [`LoadOptions::widen_f16`] (the default, and exact numerics'),
//!   every F16 matrix is widened to an f32 copy, so its matmul takes f32
//!   activations. Matmuls of F16 weights round the activations to f16 (as
//!   llama.cpp does), about 5e-4 relative per product, which the
//!   fixtures' 1e-3 tolerance on logits does not leave room for. F16
//!   matrices are the small ones (mixers, compressors, indexer, router).
//!   Fast numerics keeps them F16 ([`LoadOptions::for_numerics`]): half
//!   the bytes a decode token reads of them, and tensor-core prefill
//!   products on CUDA.
//!
//! Routed experts may be any type the expert matmul takes (F32, F16, BF16,
//! Q8_0, Q4_K, Q2_K, IQ2_XXS, MXFP4, ...); the attention and shared-expert
//! matrices any type the CPU matmul takes.

use super::config::Dsv4Config;
use crate::weights::WeightMap;
use crate::ModelError;
use weft_ops::{DType, Shape, Tensor};
use weft_runtime::GraphExecutor;

/// How weights are loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Widen F16 matrices to f32 copies (exact f32 activations).
    pub widen_f16: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { widen_f16: true }
    }
}

impl LoadOptions {
    /// The options of a model run in `numerics`: F16 matrices widened in
    /// exact numerics, kept F16 in fast numerics.
    pub fn for_numerics(numerics: weft_runtime::Numerics) -> Self {
        Self {
            widen_f16: numerics == weft_runtime::Numerics::Exact,
        }
    }
}

/// One hyper-connection site: mixer `[mix, hc * D]`, scales `[3]` (`[1]` for
/// the head), biases `[mix]`.
#[derive(Clone, Copy, Debug)]
pub struct HcSite {
    pub mixer: Tensor,
    pub scale: Tensor,
    pub base: Tensor,
}

/// A KV compressor: values and gates `[cw, D]`, position bias `f32 [c, cw]`,
/// row norm `[dc]`.
#[derive(Clone, Copy, Debug)]
pub struct Compressor {
    pub kv: Tensor,
    pub gate: Tensor,
    pub ape: Tensor,
    pub norm: Tensor,
}

/// The lightning indexer of a CSA layer.
#[derive(Clone, Copy, Debug)]
pub struct Indexer {
    /// `[IH * ID, Q]`.
    pub q_b: Tensor,
    /// `[IH, D]`.
    pub proj: Tensor,
    pub compressor: Compressor,
}

/// How a layer routes tokens to experts.
#[derive(Clone, Copy, Debug)]
pub enum Router {
    /// `tid2eid`: `i32 [V, k]`.
    Hash(Tensor),
    /// Selection bias `[E]`.
    TopK(Tensor),
}

/// One block's weights.
#[derive(Clone, Debug)]
pub struct Dsv4Layer {
    pub hc_attn: HcSite,
    pub hc_ffn: HcSite,
    pub attn_norm: Tensor,
    pub q_a: Tensor,
    pub q_a_norm: Tensor,
    pub q_b: Tensor,
    pub kv: Tensor,
    pub kv_norm: Tensor,
    pub sinks: Tensor,
    /// `[G, R, H * d / G]` (the file's `[G * R, H * d / G]` seen per group).
    pub out_a: Tensor,
    pub out_b: Tensor,
    pub compressor: Option<Compressor>,
    pub indexer: Option<Indexer>,
    pub ffn_norm: Tensor,
    pub gate_inp: Tensor,
    pub router: Router,
    /// `[E, F, D]`.
    pub gate_exps: Tensor,
    /// `[E, F, D]`.
    pub up_exps: Tensor,
    /// `[E, D, F]`.
    pub down_exps: Tensor,
    pub gate_shexp: Tensor,
    pub up_shexp: Tensor,
    pub down_shexp: Tensor,
}

/// Every weight of the model, plus the constants the forward pass uses.
pub struct Dsv4Weights {
    pub token_embd: Tensor,
    pub layers: Vec<Dsv4Layer>,
    pub output_hc: HcSite,
    pub output_norm: Tensor,
    pub output: Tensor,
    /// Ones `f32 [d]`: the weight of the per-head query norm.
    pub ones_head: Tensor,
}

/// Types the expert matmul multiplies with.
pub fn is_expert_type(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32
            | DType::F16
            | DType::BF16
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::IQ2_XXS
            | DType::MXFP4
    )
}

/// Types the dense matmuls take (the CPU matmul's formats).
pub fn is_matrix_type(dtype: DType) -> bool {
    crate::weights::is_supported_matrix(dtype)
}

struct Loader<'w, 'f, 'e> {
    weights: &'w WeightMap<'f>,
    exec: &'e mut GraphExecutor,
    options: LoadOptions,
}

impl Loader<'_, '_, '_> {
    /// `name`, checked to have `dims` and an accepted type.
    fn get(
        &mut self,
        name: &str,
        dims: &[usize],
        ok: fn(DType) -> bool,
    ) -> Result<Tensor, ModelError> {
        let t = self.weights.expect(name, dims)?;
        if !ok(t.dtype) {
            return Err(ModelError::Unsupported(format!(
                "deepseek4: tensor `{name}` is {}, which weft does not compute with here",
                t.dtype
            )));
        }
        if t.dtype == DType::F16 && self.options.widen_f16 && dims.len() == 2 {
            return self.widen(name, t);
        }
        Ok(t)
    }

    fn f32(&mut self, name: &str, dims: &[usize]) -> Result<Tensor, ModelError> {
        let t = self.weights.expect(name, dims)?;
        match t.dtype {
            DType::F32 => Ok(t),
            DType::F16 | DType::BF16 => self.widen(name, t),
            other => Err(ModelError::Unsupported(format!(
                "deepseek4: tensor `{name}` is {other}, expected F32 (or F16/BF16)"
            ))),
        }
    }

    /// An f32 copy of a float tensor.
    fn widen(&mut self, name: &str, t: Tensor) -> Result<Tensor, ModelError> {
        let file = self.weights.file();
        let info = file
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let values =
            weft_ops::reference::to_f32(file.tensor_data(info), t.dtype, t.shape.elements())?;
        let copy = self
            .exec
            .alloc_tensor(DType::F32, t.shape.dims(), &format!("{name}.f32"))?;
        self.exec
            .write_bytes(&copy, bytemuck::cast_slice(&values))?;
        Ok(copy)
    }

    fn constant(&mut self, n: usize, value: f32, name: &str) -> Result<Tensor, ModelError> {
        let t = self.exec.alloc_tensor(DType::F32, &[n], name)?;
        self.exec
            .write_bytes(&t, bytemuck::cast_slice(&vec![value; n]))?;
        Ok(t)
    }

    fn hc_site(
        &mut self,
        prefix: &str,
        c: &Dsv4Config,
        scales: usize,
        mix: usize,
    ) -> Result<HcSite, ModelError> {
        Ok(HcSite {
            mixer: self.get(
                &format!("{prefix}_fn.weight"),
                &[mix, c.hc * c.hidden],
                is_matrix_type,
            )?,
            scale: self.f32(&format!("{prefix}_scale.weight"), &[scales])?,
            base: self.f32(&format!("{prefix}_base.weight"), &[mix])?,
        })
    }

    fn compressor(
        &mut self,
        prefix: &str,
        c: &Dsv4Config,
        ratio: usize,
        dc: usize,
    ) -> Result<Compressor, ModelError> {
        let cw = dc * (1 + (ratio == 4) as usize);
        Ok(Compressor {
            kv: self.get(
                &format!("{prefix}_kv.weight"),
                &[cw, c.hidden],
                is_matrix_type,
            )?,
            gate: self.get(
                &format!("{prefix}_gate.weight"),
                &[cw, c.hidden],
                is_matrix_type,
            )?,
            ape: self.f32(&format!("{prefix}_ape.weight"), &[ratio, cw])?,
            norm: self.f32(&format!("{prefix}_norm.weight"), &[dc])?,
        })
    }

    fn layer(&mut self, c: &Dsv4Config, l: usize) -> Result<Dsv4Layer, ModelError> {
        let n = |s: &str| format!("blk.{l}.{s}");
        let (d, hd, h, g) = (c.hidden, c.head_dim, c.heads, c.out_groups);
        let group_in = h * hd / g;
        let ratio = c.ratio(l) as usize;
        let compressor = match ratio {
            0 => None,
            r => Some(self.compressor(&n("attn_compressor"), c, r, hd)?),
        };
        let indexer = match ratio {
            4 => Some(Indexer {
                q_b: self.get(
                    &n("indexer.attn_q_b.weight"),
                    &[c.indexer_heads * c.indexer_dim, c.q_lora],
                    is_matrix_type,
                )?,
                proj: self.get(
                    &n("indexer.proj.weight"),
                    &[c.indexer_heads, d],
                    is_matrix_type,
                )?,
                compressor: self.compressor(&n("indexer_compressor"), c, 4, c.indexer_dim)?,
            }),
            _ => None,
        };
        let router = if c.is_hash_layer(l) {
            let t = self
                .weights
                .expect(&n("ffn_gate_tid2eid.weight"), &[c.vocab, c.experts_used])?;
            if t.dtype != DType::I32 {
                return Err(ModelError::Unsupported(format!(
                    "deepseek4: blk.{l}.ffn_gate_tid2eid.weight is {}, expected I32",
                    t.dtype
                )));
            }
            Router::Hash(t)
        } else {
            Router::TopK(self.f32(&n("exp_probs_b.bias"), &[c.experts])?)
        };
        let out_a = self.get(
            &n("attn_output_a.weight"),
            &[g * c.out_rank, group_in],
            is_matrix_type,
        )?;
        let out_a = Tensor::new(
            out_a.buffer,
            out_a.offset,
            out_a.dtype,
            Shape::new(&[g, c.out_rank, group_in]),
        )?;
        let (e, f) = (c.experts, c.expert_ff);
        Ok(Dsv4Layer {
            hc_attn: self.hc_site(&n("hc_attn"), c, 3, c.mix())?,
            hc_ffn: self.hc_site(&n("hc_ffn"), c, 3, c.mix())?,
            attn_norm: self.f32(&n("attn_norm.weight"), &[d])?,
            q_a: self.get(&n("attn_q_a.weight"), &[c.q_lora, d], is_matrix_type)?,
            q_a_norm: self.f32(&n("attn_q_a_norm.weight"), &[c.q_lora])?,
            q_b: self.get(&n("attn_q_b.weight"), &[h * hd, c.q_lora], is_matrix_type)?,
            kv: self.get(&n("attn_kv.weight"), &[hd, d], is_matrix_type)?,
            kv_norm: self.f32(&n("attn_kv_a_norm.weight"), &[hd])?,
            sinks: self.f32(&n("attn_sinks.weight"), &[h])?,
            out_a,
            out_b: self.get(
                &n("attn_output_b.weight"),
                &[d, g * c.out_rank],
                is_matrix_type,
            )?,
            compressor,
            indexer,
            ffn_norm: self.f32(&n("ffn_norm.weight"), &[d])?,
            gate_inp: self.get(&n("ffn_gate_inp.weight"), &[e, d], is_matrix_type)?,
            router,
            gate_exps: self.get(&n("ffn_gate_exps.weight"), &[e, f, d], is_expert_type)?,
            up_exps: self.get(&n("ffn_up_exps.weight"), &[e, f, d], is_expert_type)?,
            down_exps: self.get(&n("ffn_down_exps.weight"), &[e, d, f], is_expert_type)?,
            gate_shexp: self.get(&n("ffn_gate_shexp.weight"), &[f, d], is_matrix_type)?,
            up_shexp: self.get(&n("ffn_up_shexp.weight"), &[f, d], is_matrix_type)?,
            down_shexp: self.get(&n("ffn_down_shexp.weight"), &[d, f], is_matrix_type)?,
        })
    }
}

impl Dsv4Weights {
    /// Loads and checks every weight of a `deepseek4` file.
    pub fn load(
        weights: &WeightMap<'_>,
        exec: &mut GraphExecutor,
        c: &Dsv4Config,
        options: LoadOptions,
    ) -> Result<Dsv4Weights, ModelError> {
        let mut ld = Loader {
            weights,
            exec,
            options,
        };
        let token_embd = ld
            .weights
            .expect("token_embd.weight", &[c.vocab, c.hidden])?;
        let mut layers = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            layers.push(ld.layer(c, l)?);
        }
        Ok(Dsv4Weights {
            token_embd,
            layers,
            output_hc: ld.hc_site("output_hc", c, 1, c.hc)?,
            output_norm: ld.f32("output_norm.weight", &[c.hidden])?,
            output: ld.get("output.weight", &[c.vocab, c.hidden], is_matrix_type)?,
            ones_head: ld.constant(c.head_dim, 1.0, "deepseek4.ones_head")?,
        })
    }
}
