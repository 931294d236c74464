//! The Gemma 3 family (`general.architecture = gemma3`): configuration from
//! GGUF metadata and the weights as views of the mapped file. The forward
//! pass, recorded with the builder API, is in `forward.rs` ([`Gemma3::record_step`]).
//!
//! What sets Gemma 3 apart from the Llama family, and where each piece lives:
//!
//! | feature | metadata | here |
//! |---|---|---|
//! | interleaved local (sliding-window) and global layers | `attention.sliding_window`, `attention.sliding_window_pattern` (default: every 6th layer global) | [`Gemma3Config::local`], the cache's window ring |
//! | one RoPE base per kind of layer (NeoX pairs) | `rope.freq_base` (global), `rope.freq_base_swa` (local, default 10000) | [`Gemma3Config::rope_global`], [`Gemma3Config::rope_local`] |
//! | RMS norm on each query and key head | `blk.N.attn_{q,k}_norm` | an `rms_norm` over `[rows x heads, head_dim]` |
//! | queries scaled before attention | `1/sqrt(head_dim)` (27B: `1/sqrt(hidden/heads)`) | [`Gemma3Config::query_scale`] |
//! | norms after attention and after the FFN | `blk.N.post_attention_norm`, `blk.N.post_ffw_norm` | |
//! | GELU-gated FFN | | `gelu_mul` |
//! | embeddings scaled by `sqrt(hidden)` | | [`Gemma3Config::embed_scale`] |
//! | tied output | no `output.weight` | [`Gemma3::output`] |
//!
//! The norm weights in GGUF already hold Gemma's `1 + w`; they are used as they are.
//!
//! ```
//! use weft_models::gemma3::Gemma3Config;
//! use weft_models::gguf::{GgufFile, GgufWriter};
//! use weft_ops::DType;
//!
//! let mut w = GgufWriter::new();
//! w.set("general.architecture", "gemma3")?;
//! for (key, value) in [
//!     ("block_count", 12u32),
//!     ("embedding_length", 640),
//!     ("feed_forward_length", 2048),
//!     ("attention.head_count", 4),
//!     ("attention.head_count_kv", 1),
//!     ("attention.key_length", 256),
//!     ("attention.sliding_window", 512),
//! ] {
//!     w.set(&format!("gemma3.{key}"), value)?;
//! }
//! // The counts are bounded by the tensors: 12 blocks, none wider than 2048.
//! w.add_tensor("blk.11.ffn_norm.weight", &[2048], DType::F32, vec![0u8; 2048 * 4])?;
//! let config = Gemma3Config::from_gguf(&GgufFile::from_bytes(w.to_bytes()?)?)?;
//! // No pattern in the file: every 6th layer is global, the others slide.
//! assert_eq!(config.layer_window(4), Some(512));
//! assert_eq!(config.layer_window(5), None);
//! assert_eq!(config.layer_rope(4).base, 10_000.0);
//! assert_eq!(config.layer_rope(5).base, 1_000_000.0);
//! assert_eq!(config.query_scale, 1.0 / 16.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod forward;

use crate::gguf::{GgufFile, Value};
use crate::hparams::{FloatRange, Hparams};
use crate::weights::{is_supported_matrix, WeightMap};
use crate::ModelError;
use weft_ops::{RopeMode, RopeParams, Tensor};

/// Layers in a Gemma 3 27B model, whose query scale uses `hidden / heads`.
const LAYERS_27B: usize = 62;
/// Every `n`-th layer is global when the file names no pattern.
const DEFAULT_SWA_PERIOD: u32 = 6;
/// RoPE base of the local layers when the file names none.
const DEFAULT_LOCAL_ROPE_BASE: f32 = 10_000.0;

/// Hyper-parameters read from `gemma3.*` metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3Config {
    /// Transformer layers.
    pub layers: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Width of the feed-forward layer.
    pub ffn: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Elements per head (keys, queries and values).
    pub head_dim: usize,
    /// Epsilon of every RMS norm.
    pub rms_eps: f32,
    /// Context length the model was trained for.
    pub context: u32,
    /// Sliding window of the local layers (`None`: every layer is global).
    pub window: Option<u32>,
    /// `local[l]`: layer `l` attends through the sliding window.
    pub local: Vec<bool>,
    /// RoPE of the global layers.
    pub rope_global: RopeParams,
    /// RoPE of the local layers.
    pub rope_local: RopeParams,
    /// Factor applied to the queries before attention (the scores' scale).
    pub query_scale: f32,
    /// Factor applied to the token embeddings (`sqrt(hidden)`).
    pub embed_scale: f32,
}

impl Gemma3Config {
    /// Reads the config of a `gemma3` file.
    pub fn from_gguf(file: &GgufFile) -> Result<Gemma3Config, ModelError> {
        let hp = Hparams::new(file, "gemma3");
        let key = |k: &str| hp.key(k);
        let layers = hp.block_count()?;
        let hidden = hp.width("embedding_length", None)?;
        let ffn = hp.width("feed_forward_length", None)?;
        let heads = hp.width("attention.head_count", None)?;
        let kv_heads = hp.width("attention.head_count_kv", Some(heads))?;
        if !heads.is_multiple_of(kv_heads) {
            return Err(ModelError::Shape(format!(
                "gemma3.attention.head_count = {heads} query heads over gemma3.attention.head_count_kv = {kv_heads} kv heads: the kv heads must divide the heads"
            )));
        }
        let head_dim = hp.width("attention.key_length", Some((hidden / heads).max(1)))?;
        let value_dim = hp.width("attention.value_length", Some(head_dim))?;
        if value_dim != head_dim {
            return Err(ModelError::Unsupported(format!(
                "gemma3 with key length {head_dim} and value length {value_dim} (weft needs them equal)"
            )));
        }
        let rms_eps = hp.float(
            "attention.layer_norm_rms_epsilon",
            1e-6,
            FloatRange::Epsilon,
        )?;
        let context = hp.context(32768)?;
        let window = match file.get_u64(&key("attention.sliding_window"))? {
            None => None,
            Some(_) => Some(hp.count(
                "attention.sliding_window",
                None,
                1,
                context as usize,
                "the trained context length",
            )? as u32),
        };
        let local = match window {
            Some(_) => local_layers(file, &key("attention.sliding_window_pattern"), layers)?,
            None => vec![false; layers],
        };
        let n_dims = hp.rope_dims(head_dim)?;
        let base = hp.float("rope.freq_base", 1_000_000.0, FloatRange::AboveOne)?;
        let mut rope_global = RopeParams::plain(RopeMode::Neox, head_dim, n_dims, base);
        match file.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => {}
            Some("linear") => {
                let factor = hp.float("rope.scaling.factor", 1.0, FloatRange::Positive)?;
                rope_global.freq_scale = 1.0 / factor;
            }
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "gemma3 rope scaling type `{other}` (weft runs none and linear)"
                )))
            }
        }
        let local_base = hp.float(
            "rope.freq_base_swa",
            DEFAULT_LOCAL_ROPE_BASE,
            FloatRange::AboveOne,
        )?;
        let rope_local = RopeParams::plain(RopeMode::Neox, head_dim, n_dims, local_base);
        let cap = hp.float("final_logit_softcapping", 0.0, FloatRange::NonNegative)?;
        if cap != 0.0 {
            return Err(ModelError::Unsupported(format!(
                "gemma3 final logit soft-capping ({cap})"
            )));
        }
        let query_scale = if layers == LAYERS_27B {
            1.0 / ((hidden / heads) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        Ok(Gemma3Config {
            layers,
            hidden,
            ffn,
            heads,
            kv_heads,
            head_dim,
            rms_eps,
            context,
            window,
            local,
            rope_global,
            rope_local,
            query_scale,
            embed_scale: (hidden as f32).sqrt(),
        })
    }

    /// K (or V) values per cached row.
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// The sliding window of layer `l` (`None` for a global layer).
    pub fn layer_window(&self, l: usize) -> Option<u32> {
        self.window
            .filter(|_| self.local.get(l).copied().unwrap_or(false))
    }

    /// The RoPE of layer `l`.
    pub fn layer_rope(&self, l: usize) -> RopeParams {
        if self.layer_window(l).is_some() {
            self.rope_local
        } else {
            self.rope_global
        }
    }
}

/// Which layers are local: an explicit per-layer bool array, or a period
/// `n` (layer `l` is local unless `l % n == n - 1`; 0: all local).
fn local_layers(file: &GgufFile, key: &str, layers: usize) -> Result<Vec<bool>, ModelError> {
    if let Some(Value::Array(crate::gguf::Array::Bool(flags))) = file.get(key) {
        if flags.len() < layers {
            return Err(ModelError::Shape(format!(
                "`{key}` names {} layers, the model has {layers}",
                flags.len()
            )));
        }
        return Ok(flags[..layers].to_vec());
    }
    let period = file.get_u32(key)?.unwrap_or(DEFAULT_SWA_PERIOD);
    Ok((0..layers as u32)
        .map(|l| period == 0 || l % period < period - 1)
        .collect())
}

/// One layer's weights.
#[derive(Clone, Debug)]
pub struct Gemma3Layer {
    /// RMS norm before attention.
    pub attn_norm: Tensor,
    /// Query projection `[heads * head_dim, hidden]`.
    pub wq: Tensor,
    /// Key projection `[kv_heads * head_dim, hidden]`.
    pub wk: Tensor,
    /// Value projection `[kv_heads * head_dim, hidden]`.
    pub wv: Tensor,
    /// Per-head RMS norm weight of the queries `[head_dim]`.
    pub q_norm: Tensor,
    /// Per-head RMS norm weight of the keys `[head_dim]`.
    pub k_norm: Tensor,
    /// Output projection `[hidden, heads * head_dim]`.
    pub wo: Tensor,
    /// RMS norm of the attention output, before the residual add.
    pub post_attn_norm: Tensor,
    /// RMS norm before the FFN.
    pub ffn_norm: Tensor,
    /// FFN gate `[ffn, hidden]` (through GELU).
    pub gate: Tensor,
    /// FFN up projection `[ffn, hidden]`.
    pub up: Tensor,
    /// FFN down projection `[hidden, ffn]`.
    pub down: Tensor,
    /// RMS norm of the FFN output, before the residual add.
    pub post_ffn_norm: Tensor,
}

/// A loaded Gemma 3 model.
pub struct Gemma3 {
    /// Its hyper-parameters.
    pub config: Gemma3Config,
    /// Token embeddings `[vocab, hidden]`.
    pub token_embd: Tensor,
    /// Per-layer weights.
    pub layers: Vec<Gemma3Layer>,
    /// RMS norm before the output projection.
    pub output_norm: Tensor,
    /// The output projection (the token embedding when tied).
    pub output: Tensor,
}

impl Gemma3 {
    /// Loads the weights of `weights`' file (mapped into its executor).
    pub fn load(weights: &WeightMap<'_>) -> Result<Gemma3, ModelError> {
        let c = Gemma3Config::from_gguf(weights.file())?;
        let token_embd = weights.get("token_embd.weight")?;
        if token_embd.cols() != c.hidden {
            return Err(ModelError::Shape(format!(
                "token_embd.weight has {} columns, hidden size is {}",
                token_embd.cols(),
                c.hidden
            )));
        }
        let q_width = c.heads * c.head_dim;
        let mut layers = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let name = |n: &str| format!("blk.{l}.{n}.weight");
            let layer = Gemma3Layer {
                attn_norm: weights.expect(&name("attn_norm"), &[c.hidden])?,
                wq: weights.expect(&name("attn_q"), &[q_width, c.hidden])?,
                wk: weights.expect(&name("attn_k"), &[c.kv_width(), c.hidden])?,
                wv: weights.expect(&name("attn_v"), &[c.kv_width(), c.hidden])?,
                q_norm: weights.expect(&name("attn_q_norm"), &[c.head_dim])?,
                k_norm: weights.expect(&name("attn_k_norm"), &[c.head_dim])?,
                wo: weights.expect(&name("attn_output"), &[c.hidden, q_width])?,
                post_attn_norm: weights.expect(&name("post_attention_norm"), &[c.hidden])?,
                ffn_norm: weights.expect(&name("ffn_norm"), &[c.hidden])?,
                gate: weights.expect(&name("ffn_gate"), &[c.ffn, c.hidden])?,
                up: weights.expect(&name("ffn_up"), &[c.ffn, c.hidden])?,
                down: weights.expect(&name("ffn_down"), &[c.hidden, c.ffn])?,
                post_ffn_norm: weights.expect(&name("post_ffw_norm"), &[c.hidden])?,
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
        let output = match weights.optional("output.weight")? {
            Some(o) => crate::weights::check_output(o, token_embd, c.hidden)?,
            None => token_embd,
        };
        Ok(Gemma3 {
            config: c,
            token_embd,
            layers,
            output_norm,
            output,
        })
    }
}
