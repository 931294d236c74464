//! The Llama family (`general.architecture = llama`): SmolLM2, Llama 2/3,
//! Mistral-style models, and Qwen 2 / 2.5 (`qwen2`: NEOX rope, q/k/v
//! biases; `arch.rs`). Config from GGUF metadata, weights as views of the
//! mapped file, and the forward pass recorded with the builder API.

mod arch;
mod forward;

pub use arch::LlamaArch;

use crate::gguf::GgufFile;
use crate::weights::{is_supported_matrix, WeightMap};
use crate::ModelError;
use weft_ops::{DType, RopeParams, Tensor};

/// Hyper-parameters read from `llama.*` metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope: RopeParams,
    pub rms_eps: f32,
    pub context: u32,
    pub vocab: usize,
}

impl LlamaConfig {
    /// Reads the config of architecture `arch` from its `<arch>.*` keys.
    pub fn from_gguf(file: &GgufFile, arch: LlamaArch) -> Result<LlamaConfig, ModelError> {
        let key = |k: &str| format!("{}.{k}", arch.name());
        let layers = file.require_u32(&key("block_count"))? as usize;
        let hidden = file.require_u32(&key("embedding_length"))? as usize;
        let ffn = file.require_u32(&key("feed_forward_length"))? as usize;
        let heads = file.require_u32(&key("attention.head_count"))? as usize;
        let kv_heads = file
            .get_u32(&key("attention.head_count_kv"))?
            .map_or(heads, |v| v as usize);
        if heads == 0
            || kv_heads == 0
            || !heads.is_multiple_of(kv_heads)
            || !hidden.is_multiple_of(heads)
        {
            return Err(ModelError::Shape(format!(
                "{heads} heads over {kv_heads} kv heads with hidden size {hidden}"
            )));
        }
        let head_dim = file
            .get_u32(&key("attention.key_length"))?
            .map_or(hidden / heads, |v| v as usize);
        let n_dims = file
            .get_u32(&key("rope.dimension_count"))?
            .map_or(head_dim, |v| v as usize);
        let base = file.get_f32(&key("rope.freq_base"))?.unwrap_or(10000.0);
        let mut rope = RopeParams::plain(arch.rope_mode(), head_dim, n_dims, base);
        match file.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => {}
            Some("linear") => {
                let factor = file.get_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0);
                rope.freq_scale = 1.0 / factor.max(f32::MIN_POSITIVE);
            }
            Some("yarn") => {
                let factor = file.get_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0);
                rope.freq_scale = 1.0 / factor.max(f32::MIN_POSITIVE);
                rope.ext_factor = 1.0;
                rope.orig_ctx = file
                    .get_u32(&key("rope.scaling.original_context_length"))?
                    .unwrap_or(0);
            }
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "rope scaling type `{other}`"
                )))
            }
        }
        if file.tensor("rope_freqs.weight").is_some() {
            return Err(ModelError::Unsupported(
                "per-dimension rope frequency factors (rope_freqs.weight, Llama 3.1 style)".into(),
            ));
        }
        let rms_eps = file
            .get_f32(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5);
        let context = file.get_u32(&key("context_length"))?.unwrap_or(2048);
        let vocab = match file.get_u32(&key("vocab_size"))? {
            Some(v) => v as usize,
            None => file
                .get_str_array("tokenizer.ggml.tokens")?
                .map_or(0, |t| t.len()),
        };
        Ok(LlamaConfig {
            layers,
            hidden,
            ffn,
            heads,
            kv_heads,
            head_dim,
            rope,
            rms_eps,
            context,
            vocab,
        })
    }

    /// K (or V) values per cached row.
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// One layer's weights.
#[derive(Clone, Debug)]
pub struct LlamaLayer {
    pub attn_norm: Tensor,
    pub wq: Tensor,
    pub wk: Tensor,
    pub wv: Tensor,
    pub wo: Tensor,
    pub ffn_norm: Tensor,
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
    /// Biases added to the q, k and v projections (Qwen 2), before rope.
    pub bias: QkvBias,
}

/// Optional per-projection biases, one row each (`blk.N.attn_{q,k,v}.bias`).
#[derive(Clone, Copy, Debug, Default)]
pub struct QkvBias {
    pub q: Option<Tensor>,
    pub k: Option<Tensor>,
    pub v: Option<Tensor>,
}

/// A loaded Llama-family model.
pub struct Llama {
    pub config: LlamaConfig,
    pub token_embd: Tensor,
    pub layers: Vec<LlamaLayer>,
    pub output_norm: Tensor,
    /// The output projection (the token embedding when tied).
    pub output: Tensor,
    /// Attention rounded as llama.cpp's flash-attention kernels do (true,
    /// the default, as llama.cpp's tools run), or as llama.cpp with flash
    /// attention off (false; the CPU backend only).
    pub flash_attention: bool,
}

impl Llama {
    /// Loads the weights of `file` (mapped into `weights`' executor).
    pub fn load(weights: &WeightMap<'_>, arch: LlamaArch) -> Result<Llama, ModelError> {
        let c = LlamaConfig::from_gguf(weights.file(), arch)?;
        if weights.file().tensor("blk.0.ffn_gate_inp.weight").is_some() {
            return Err(ModelError::Unsupported(
                "mixture-of-experts Llama variants".into(),
            ));
        }
        let token_embd = weights.get("token_embd.weight")?;
        if token_embd.cols() != c.hidden {
            return Err(ModelError::Shape(format!(
                "token_embd.weight has {} columns, hidden size is {}",
                token_embd.cols(),
                c.hidden
            )));
        }
        let mut layers = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let name = |n: &str| format!("blk.{l}.{n}.weight");
            let layer = LlamaLayer {
                attn_norm: weights.expect(&name("attn_norm"), &[c.hidden])?,
                wq: weights.expect(&name("attn_q"), &[c.heads * c.head_dim, c.hidden])?,
                wk: weights.expect(&name("attn_k"), &[c.kv_width(), c.hidden])?,
                wv: weights.expect(&name("attn_v"), &[c.kv_width(), c.hidden])?,
                wo: weights.expect(&name("attn_output"), &[c.hidden, c.heads * c.head_dim])?,
                ffn_norm: weights.expect(&name("ffn_norm"), &[c.hidden])?,
                gate: weights.expect(&name("ffn_gate"), &[c.ffn, c.hidden])?,
                up: weights.expect(&name("ffn_up"), &[c.ffn, c.hidden])?,
                down: weights.expect(&name("ffn_down"), &[c.hidden, c.ffn])?,
                bias: load_qkv_bias(weights, &c, l)?,
            };
            for (n, t) in [
                ("attn_q", layer.wq),
                ("attn_k", layer.wk),
                ("attn_v", layer.wv),
                ("attn_output", layer.wo),
                ("ffn_gate", layer.gate),
                ("ffn_up", layer.up),
                ("ffn_down", layer.down),
            ] {
                if !is_supported_matrix(t.dtype) {
                    return Err(ModelError::Unsupported(format!(
                        "blk.{l}.{n}.weight is {}",
                        t.dtype
                    )));
                }
            }
            layers.push(layer);
        }
        let output_norm = weights.expect("output_norm.weight", &[c.hidden])?;
        let output = weights.optional("output.weight")?.unwrap_or(token_embd);
        Ok(Llama {
            config: c,
            token_embd,
            layers,
            output_norm,
            output,
            flash_attention: true,
        })
    }
}

/// Layer `l`'s q, k and v biases where the file has them (llama.cpp adds
/// each one present, for `llama` and `qwen2` alike); a bias on any other
/// projection is refused by name, since the forward pass would drop it.
fn load_qkv_bias(
    weights: &WeightMap<'_>,
    c: &LlamaConfig,
    l: usize,
) -> Result<QkvBias, ModelError> {
    let name = |n: &str| format!("blk.{l}.{n}.bias");
    for n in ["attn_output", "ffn_gate", "ffn_up", "ffn_down"] {
        if weights.file().tensor(&name(n)).is_some() {
            return Err(ModelError::Unsupported(format!(
                "{}: a bias on {n} (weft adds biases to attn_q, attn_k and attn_v only)",
                name(n)
            )));
        }
    }
    let bias = |n: &str, width: usize| -> Result<Option<Tensor>, ModelError> {
        if weights.file().tensor(&name(n)).is_none() {
            return Ok(None);
        }
        let t = weights.expect(&name(n), &[width])?;
        if t.dtype != DType::F32 {
            return Err(ModelError::Unsupported(format!(
                "{} is {}; biases must be f32",
                name(n),
                t.dtype
            )));
        }
        Ok(Some(t))
    };
    Ok(QkvBias {
        q: bias("attn_q", c.heads * c.head_dim)?,
        k: bias("attn_k", c.kv_width())?,
        v: bias("attn_v", c.kv_width())?,
    })
}
