//! The Llama family (`general.architecture = llama`): SmolLM2, Llama 2/3
//! (with `rope_freqs.weight`), Mistral-style models, Qwen 2 / 2.5
//! (`qwen2`), Qwen 3 (`qwen3`) and Phi-3 (`phi3`); how those differ is in
//! `arch.rs`. Config from GGUF metadata, weights as views of the
//! mapped file, and the forward pass recorded with the builder API.

mod arch;
mod forward;
mod moe;

pub use arch::LlamaArch;
pub use moe::LlamaMoe;

use crate::gguf::GgufFile;
use crate::hparams::{FloatRange, Hparams, MAX_WIDTH};
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
    /// Keys each query sees on every layer (`llama.attention.sliding_window`,
    /// Mistral 7B v0.1 style), or all of them.
    pub window: Option<u32>,
    /// The context the model was trained at before any rope scaling
    /// (`rope.scaling.original_context_length`, else the context length):
    /// a longer cache takes Phi-3's long rope factors.
    pub rope_orig_ctx: u32,
}

impl LlamaConfig {
    /// Reads the config of architecture `arch` from its `<arch>.*` keys.
    pub fn from_gguf(file: &GgufFile, arch: LlamaArch) -> Result<LlamaConfig, ModelError> {
        let hp = Hparams::new(file, arch.name());
        let key = |k: &str| hp.key(k);
        let layers = hp.block_count()?;
        let hidden = hp.width("embedding_length", None)?;
        let ffn = hp.width("feed_forward_length", None)?;
        let heads = hp.width("attention.head_count", None)?;
        let kv_heads = hp.width("attention.head_count_kv", Some(heads))?;
        if !heads.is_multiple_of(kv_heads) || !hidden.is_multiple_of(heads) {
            return Err(ModelError::Shape(format!(
                "{} = {heads} heads over {} = {kv_heads} kv heads with {} = {hidden}: \
                 the kv heads must divide the heads, the heads the width",
                key("attention.head_count"),
                key("attention.head_count_kv"),
                key("embedding_length"),
            )));
        }
        let head_dim = hp.width("attention.key_length", Some(hidden / heads))?;
        let n_dims = hp.rope_dims(head_dim)?;
        let base = hp.float("rope.freq_base", 10000.0, FloatRange::AboveOne)?;
        let context = hp.context(2048)?;
        let mut rope = RopeParams::plain(arch.rope_mode(), head_dim, n_dims, base);
        match file.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => {}
            Some("linear") => {
                let factor = hp.float("rope.scaling.factor", 1.0, FloatRange::Positive)?;
                rope.freq_scale = 1.0 / factor;
            }
            Some("yarn") => {
                let factor = hp.float("rope.scaling.factor", 1.0, FloatRange::Positive)?;
                rope.freq_scale = 1.0 / factor;
                rope.ext_factor = 1.0;
                rope.orig_ctx = hp.count(
                    "rope.scaling.original_context_length",
                    Some(context as usize),
                    1,
                    u32::MAX as usize,
                    "a token position is a u32",
                )? as u32;
            }
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "rope scaling type `{other}`"
                )))
            }
        }
        // A magnitude factor on every rotation (llama.cpp's
        // `rope_attn_factor`; Phi-3's long-context models write it).
        rope.attn_factor *= hp.float("rope.scaling.attn_factor", 1.0, FloatRange::Positive)?;
        let rope_orig_ctx = hp.count(
            "rope.scaling.original_context_length",
            Some(context as usize),
            1,
            u32::MAX as usize,
            "a token position is a u32",
        )? as u32;
        let rms_eps = hp.float(
            "attention.layer_norm_rms_epsilon",
            1e-5,
            FloatRange::Epsilon,
        )?;
        let n_tokens = file
            .get_str_array("tokenizer.ggml.tokens")?
            .map_or(0, |t| t.len());
        let vocab = hp.count(
            "vocab_size",
            Some(n_tokens),
            1,
            MAX_WIDTH,
            "hard limit of a width",
        )?;
        // A window of 0 is none (Phi-4 writes 0); Phi-3's window is read
        // and not applied, as llama.cpp does not apply it.
        let window = match file.get_u64(&key("attention.sliding_window"))? {
            Some(w) if w > 0 && arch.sliding_window() => Some(hp.count(
                "attention.sliding_window",
                None,
                1,
                u32::MAX as usize,
                "a token position is a u32",
            )? as u32),
            _ => None,
        };
        Ok(LlamaConfig {
            rope_orig_ctx,
            window,
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
    pub ffn: LlamaFfn,
    /// Biases added to the q, k and v projections (Qwen 2), before rope.
    pub bias: QkvBias,
    /// Per-head RMS norm weights of queries and keys (`[head_dim]`, Qwen 3),
    /// applied before rope.
    pub qk_norm: Option<(Tensor, Tensor)>,
}

/// A layer's feed-forward block.
#[derive(Clone, Copy, Debug)]
pub enum LlamaFfn {
    /// `down(silu(gate x) * up x)`.
    Dense {
        gate: Tensor,
        up: Tensor,
        down: Tensor,
    },
    /// Softmax-routed experts (Qwen 3 MoE).
    Moe(LlamaMoe),
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
    pub arch: LlamaArch,
    pub config: LlamaConfig,
    pub token_embd: Tensor,
    pub layers: Vec<LlamaLayer>,
    pub output_norm: Tensor,
    /// The output projection (the token embedding when tied).
    pub output: Tensor,
    /// Per-pair rope frequency divisors (`rope_freqs.weight`, f32
    /// `[n_dims / 2]`): Llama 3.1's `llama3` rope scaling, which the
    /// converter bakes into this tensor.
    pub rope_factors: Option<Tensor>,
    /// Phi-3's `longrope` factors: `(short, long)` (`rope_factors_short`,
    /// `rope_factors_long`), the long ones taken when the cache holds more
    /// than `rope_orig_ctx` positions, as llama.cpp chooses by its context.
    pub long_rope: Option<(Tensor, Tensor)>,
    /// Attention rounded as llama.cpp's flash-attention kernels do (true,
    /// the default, as llama.cpp's tools run), or as llama.cpp with flash
    /// attention off (false; the CPU backend only).
    pub flash_attention: bool,
}

impl Llama {
    /// Loads the weights of `file` (mapped into `weights`' executor).
    pub fn load(weights: &WeightMap<'_>, arch: LlamaArch) -> Result<Llama, ModelError> {
        let c = LlamaConfig::from_gguf(weights.file(), arch)?;
        if !arch.moe() && weights.file().tensor("blk.0.ffn_gate_inp.weight").is_some() {
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
        if c.vocab != 0 && token_embd.rows() != c.vocab {
            return Err(ModelError::Shape(format!(
                "token_embd.weight has {} rows, the vocabulary ({}.vocab_size or tokenizer.ggml.tokens) {}",
                token_embd.rows(),
                arch.name(),
                c.vocab
            )));
        }
        let mut layers = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let name = |n: &str| format!("blk.{l}.{n}.weight");
            let q_rows = c.heads * c.head_dim;
            let (wq, wk, wv, dense) = if arch.fused_projections() {
                let qkv =
                    weights.expect(&name("attn_qkv"), &[q_rows + 2 * c.kv_width(), c.hidden])?;
                let gate_up = weights.expect(&name("ffn_up"), &[2 * c.ffn, c.hidden])?;
                (
                    qkv.rows_view(0, q_rows)?,
                    qkv.rows_view(q_rows, c.kv_width())?,
                    qkv.rows_view(q_rows + c.kv_width(), c.kv_width())?,
                    Some((
                        gate_up.rows_view(0, c.ffn)?,
                        gate_up.rows_view(c.ffn, c.ffn)?,
                    )),
                )
            } else {
                (
                    weights.expect(&name("attn_q"), &[q_rows, c.hidden])?,
                    weights.expect(&name("attn_k"), &[c.kv_width(), c.hidden])?,
                    weights.expect(&name("attn_v"), &[c.kv_width(), c.hidden])?,
                    if arch.moe() {
                        None
                    } else {
                        Some((
                            weights.expect(&name("ffn_gate"), &[c.ffn, c.hidden])?,
                            weights.expect(&name("ffn_up"), &[c.ffn, c.hidden])?,
                        ))
                    },
                )
            };
            let ffn = match dense {
                Some((gate, up)) => LlamaFfn::Dense {
                    gate,
                    up,
                    down: weights.expect(&name("ffn_down"), &[c.hidden, c.ffn])?,
                },
                None => LlamaFfn::Moe(LlamaMoe::load(weights, weights.file(), arch, c.hidden, l)?),
            };
            let qk_norm = if arch.qk_norm() {
                Some((
                    weights.expect(&name("attn_q_norm"), &[c.head_dim])?,
                    weights.expect(&name("attn_k_norm"), &[c.head_dim])?,
                ))
            } else {
                None
            };
            let layer = LlamaLayer {
                attn_norm: weights.expect(&name("attn_norm"), &[c.hidden])?,
                wq,
                wk,
                wv,
                wo: weights.expect(&name("attn_output"), &[c.hidden, q_rows])?,
                ffn_norm: weights.expect(&name("ffn_norm"), &[c.hidden])?,
                ffn,
                bias: load_qkv_bias(weights, &c, l)?,
                qk_norm,
            };
            let mut matrices = vec![
                ("attn_q", layer.wq),
                ("attn_k", layer.wk),
                ("attn_v", layer.wv),
                ("attn_output", layer.wo),
            ];
            if let LlamaFfn::Dense { gate, up, down } = layer.ffn {
                matrices.extend([("ffn_gate", gate), ("ffn_up", up), ("ffn_down", down)]);
            }
            for (n, t) in matrices {
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
        let output = match weights.optional("output.weight")? {
            Some(o) => crate::weights::check_output(o, token_embd, c.hidden)?,
            None => token_embd,
        };
        let rope_factors = load_rope_factors(weights, &c, "rope_freqs.weight")?;
        let short = load_rope_factors(weights, &c, "rope_factors_short.weight")?;
        let long = load_rope_factors(weights, &c, "rope_factors_long.weight")?;
        let long_rope = match (short, long) {
            (None, None) => None,
            (Some(s), Some(l)) if arch == LlamaArch::Phi3 && rope_factors.is_none() => Some((s, l)),
            (s, _) => {
                let missing = if s.is_none() {
                    "rope_factors_short.weight"
                } else {
                    "rope_factors_long.weight"
                };
                return Err(ModelError::Unsupported(format!(
                    "long-context rope factors (`longrope`) for {} without {missing} or with \
                     rope_freqs.weight (weft runs them for phi3, short and long together)",
                    arch.name()
                )));
            }
        };
        Ok(Llama {
            arch,
            config: c,
            token_embd,
            layers,
            output_norm,
            output,
            rope_factors,
            long_rope,
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
    for n in ["attn_output", "attn_qkv", "ffn_gate", "ffn_up", "ffn_down"] {
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

/// Rope frequency factors `name` (`rope_freqs.weight`,
/// `rope_factors_{short,long}.weight`) where the file has them: one f32
/// divisor per rotated pair, shared by every layer (llama.cpp's
/// `freq_factors`).
fn load_rope_factors(
    weights: &WeightMap<'_>,
    c: &LlamaConfig,
    name: &str,
) -> Result<Option<Tensor>, ModelError> {
    if weights.file().tensor(name).is_none() {
        return Ok(None);
    }
    let t = weights.expect(name, &[c.rope.n_dims / 2])?;
    if t.dtype != DType::F32 {
        return Err(ModelError::Unsupported(format!(
            "{name} is {}; rope frequency factors must be f32",
            t.dtype
        )));
    }
    // Each factor divides an angle: it must be a finite positive number.
    let file = weights.file();
    let data = file
        .tensor(name)
        .map_or(&[][..], |info| file.tensor_data(info));
    for (i, b) in data.chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if !(v.is_finite() && v > 0.0) {
            return Err(ModelError::Shape(format!(
                "{name}[{i}] is {v}; rope frequency factors must be finite and positive"
            )));
        }
    }
    Ok(Some(t))
}
