//! DeepSeek-V4 hyper-parameters from `deepseek4.*` GGUF metadata (the keys
//! antirez/ds4 and llama.cpp's `deepseek4` loaders read), with the checks a
//! forward pass relies on, and the two rotary embeddings (sliding layers:
//! plain; compressed layers: their own base with YaRN).

use crate::gguf::GgufFile;
use crate::hparams::{bad_value, FloatRange, Hparams};
use crate::ModelError;
use weft_ops::{TailRopeParams, YarnScaling};

/// `expert_gating_func` code for `sqrt(softplus(logit))` scores.
pub const GATING_SQRT_SOFTPLUS: u32 = 4;

/// Most compressed rows a CSA query may keep (`attention.indexer.top_k`),
/// whatever the context: 16 times DeepSeek-V4 Flash's 512. Each query's
/// selection is a row of this many ids, so the bound keeps a step's
/// selection within a few hundred MiB.
pub const MAX_INDEXER_TOP_K: usize = 8192;

/// Most Sinkhorn iterations of a hyper-connection mixer
/// (`hyper_connection.sinkhorn_iterations`): 50 times DeepSeek-V4's 20.
/// The normalisation converges long before; the bound keeps a step's work
/// finite.
pub const MAX_SINKHORN_ITERATIONS: usize = 1000;

/// What a layer's attention sees besides its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Sliding window only (ratio 0).
    Window,
    /// Compressed sparse attention: overlapping ratio-4 rows chosen by the indexer.
    Csa,
    /// Heavily compressed attention: every visible row of ratio `c`.
    Hca(u32),
}

/// Hyper-parameters of a DeepSeek-V4 model.
#[derive(Clone, Debug, PartialEq)]
pub struct Dsv4Config {
    /// Transformer blocks `L` (the MTP block, if any, is not run).
    pub layers: usize,
    /// Hidden size `D`.
    pub hidden: usize,
    /// Vocabulary `V`.
    pub vocab: usize,
    /// Query heads `H`.
    pub heads: usize,
    /// Head dim `d` (queries, the shared K=V vector, compressed rows).
    pub head_dim: usize,
    /// Rotated dims `r` at the end of every head.
    pub rope_dims: usize,
    /// Low-rank query width `Q`.
    pub q_lora: usize,
    /// Output groups `G`.
    pub out_groups: usize,
    /// Per-group output rank `R`.
    pub out_rank: usize,
    /// Sliding window `W` (keys per query, its own included).
    pub window: u32,
    /// Compression ratio per layer (0: window only, 4: CSA, other: HCA).
    pub ratios: Vec<u32>,
    /// RoPE base of sliding layers.
    pub rope_base: f32,
    /// RoPE base of compressed layers.
    pub compress_rope_base: f32,
    /// YaRN of compressed layers.
    pub yarn: Option<YarnScaling>,
    /// Indexer heads `IH`.
    pub indexer_heads: usize,
    /// Indexer head dim `ID`.
    pub indexer_dim: usize,
    /// Compressed rows a CSA query keeps.
    pub indexer_top_k: usize,
    /// Epsilon of every RMS norm.
    pub rms_eps: f32,
    /// Routed experts `E`.
    pub experts: usize,
    /// Experts per token `k`.
    pub experts_used: usize,
    /// Inner width `F` of every expert (routed and shared).
    pub expert_ff: usize,
    /// Routed scaling factor.
    pub routed_scale: f32,
    /// Renormalise the routed weights over the selected experts.
    pub weights_norm: bool,
    /// The first `hash_layers` layers route by token id.
    pub hash_layers: usize,
    /// SwiGLU clamp of the routed experts, per layer.
    pub clamp_exp: Vec<f32>,
    /// SwiGLU clamp of the shared expert, per layer.
    pub clamp_shexp: Vec<f32>,
    /// Hyper-connection streams.
    pub hc: usize,
    /// Sinkhorn iterations.
    pub sinkhorn_iters: usize,
    /// Hyper-connection epsilon.
    pub hc_eps: f32,
    /// Nominal context length.
    pub context: u32,
}

fn shape(msg: String) -> ModelError {
    ModelError::Shape(format!("deepseek4: {msg}"))
}

impl Dsv4Config {
    /// Reads and checks the config of a `deepseek4` file.
    pub fn from_gguf(file: &GgufFile) -> Result<Dsv4Config, ModelError> {
        let hp = Hparams::new(file, "deepseek4");
        let key = |k: &str| hp.key(k);
        let width = |k: &str| hp.width(k, None);
        let optf = |k: &str, default: f32, range: FloatRange| hp.float(k, default, range);
        let layers = hp.block_count()?;
        let hidden = width("embedding_length")?;
        let heads = width("attention.head_count")?;
        let head_dim = width("attention.key_length")?;
        let value_len = hp.width("attention.value_length", Some(head_dim))?;
        let kv_heads = hp.width("attention.head_count_kv", Some(1))?;
        if value_len != head_dim || kv_heads != 1 {
            return Err(ModelError::Unsupported(format!(
                "deepseek4 with {kv_heads} kv heads, key length {head_dim}, value length {value_len} (the architecture shares one K=V head)"
            )));
        }
        let context = hp.context(1 << 20)?;
        let ratios_key = key("attention.compress_ratios");
        let ratios_all = file
            .get_u32_array(&ratios_key)?
            .ok_or_else(|| shape(format!("missing {ratios_key}")))?;
        if ratios_all.len() < layers {
            return Err(shape(format!(
                "attention.compress_ratios has {} entries for {layers} layers",
                ratios_all.len()
            )));
        }
        let ratios = ratios_all[..layers].to_vec();
        // A ratio is the row count of its compressor's position bias, and
        // a compressed row needs that many tokens of context.
        let ratio_max = hp.widest().min(context as usize);
        if let Some((l, r)) = ratios
            .iter()
            .enumerate()
            .find(|(_, &r)| r as usize > ratio_max)
        {
            return Err(bad_value(
                &ratios_key,
                format!("{r} at layer {l}"),
                format!("ratios from 0 to {ratio_max} (the widest tensor and the context length)"),
            ));
        }
        let yarn = match file.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => None,
            Some("yarn") => Some(YarnScaling {
                factor: optf("rope.scaling.factor", 1.0, FloatRange::Positive)?,
                orig_ctx: hp.count(
                    "rope.scaling.original_context_length",
                    Some(context as usize),
                    1,
                    u32::MAX as usize,
                    "a token position is a u32",
                )? as u32,
                beta_fast: optf("rope.scaling.yarn_beta_fast", 32.0, FloatRange::Positive)?,
                beta_slow: optf("rope.scaling.yarn_beta_slow", 1.0, FloatRange::Positive)?,
            }),
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "deepseek4 rope scaling `{other}` (expects yarn)"
                )))
            }
        };
        let gating = hp.count(
            "expert_gating_func",
            Some(GATING_SQRT_SOFTPLUS as usize),
            0,
            u32::MAX as usize,
            "a u32 code",
        )?;
        if gating != GATING_SQRT_SOFTPLUS as usize {
            return Err(ModelError::Unsupported(format!(
                "deepseek4 expert_gating_func {gating} (weft implements {GATING_SQRT_SOFTPLUS}, sqrt(softplus))"
            )));
        }
        let groups = hp.width_or_zero("expert_group_count", 0)?;
        if groups > 1 {
            return Err(ModelError::Unsupported(format!(
                "deepseek4 group-limited routing ({groups} groups)"
            )));
        }
        let n_tokens = file
            .get_str_array("tokenizer.ggml.tokens")?
            .map_or(0, |t| t.len());
        let vocab = hp.width("vocab_size", Some(n_tokens))?;
        let experts = width("expert_count")?;
        let indexer_heads = hp.width_or_zero("attention.indexer.head_count", 0)?;
        let indexer_dim = hp.width_or_zero("attention.indexer.key_length", 0)?;
        let top_k_max = (context as usize / 4).clamp(1, MAX_INDEXER_TOP_K);
        let indexer_top_k = hp.count(
            "attention.indexer.top_k",
            Some(0),
            0,
            top_k_max,
            &format!("at most the compressed rows of the context, and at most {MAX_INDEXER_TOP_K}"),
        )?;
        let c = Dsv4Config {
            layers,
            hidden,
            vocab,
            heads,
            head_dim,
            rope_dims: hp.rope_dims(head_dim)?,
            q_lora: width("attention.q_lora_rank")?,
            out_groups: width("attention.output_group_count")?,
            out_rank: width("attention.output_lora_rank")?,
            window: hp.count(
                "attention.sliding_window",
                None,
                1,
                context as usize,
                "the trained context length",
            )? as u32,
            ratios,
            rope_base: optf("rope.freq_base", 10000.0, FloatRange::AboveOne)?,
            compress_rope_base: optf(
                "attention.compress_rope_freq_base",
                160000.0,
                FloatRange::AboveOne,
            )?,
            yarn,
            indexer_heads,
            indexer_dim,
            indexer_top_k,
            rms_eps: optf(
                "attention.layer_norm_rms_epsilon",
                1e-6,
                FloatRange::Epsilon,
            )?,
            experts,
            experts_used: hp.count("expert_used_count", None, 1, experts, "the expert count")?,
            expert_ff: width("expert_feed_forward_length")?,
            routed_scale: optf("expert_weights_scale", 1.0, FloatRange::Positive)?,
            weights_norm: file.get_bool(&key("expert_weights_norm"))?.unwrap_or(true),
            hash_layers: hp.count("hash_layer_count", Some(0), 0, layers, "the block count")?,
            clamp_exp: hp.layer_floats("swiglu_clamp_exp", layers, 0.0, FloatRange::NonNegative)?,
            clamp_shexp: hp.layer_floats(
                "swiglu_clamp_shexp",
                layers,
                0.0,
                FloatRange::NonNegative,
            )?,
            hc: width("hyper_connection.count")?,
            sinkhorn_iters: hp.count(
                "hyper_connection.sinkhorn_iterations",
                Some(20),
                1,
                MAX_SINKHORN_ITERATIONS,
                "hard limit",
            )?,
            hc_eps: optf("hyper_connection.epsilon", 1e-6, FloatRange::Epsilon)?,
            context,
        };
        let shared = hp.width_or_zero("expert_shared_count", 1)?;
        if shared != 1 {
            return Err(ModelError::Unsupported(format!(
                "deepseek4 with {shared} shared experts (the architecture has one)"
            )));
        }
        c.validate()?;
        Ok(c)
    }

    /// Blocks of the file past the `layers` that run: the multi-token
    /// prediction blocks (`nextn_predict_layers`), which weft does not run.
    pub fn mtp_blocks(file: &GgufFile, layers: usize) -> Result<usize, ModelError> {
        let hp = Hparams::new(file, "deepseek4");
        let spare = hp.blocks_in_file().saturating_sub(layers);
        hp.count(
            "nextn_predict_layers",
            Some(0),
            0,
            u32::MAX as usize,
            "a u32",
        )
        .map(|n| n.min(spare))
    }

    /// Checks the relations the forward pass relies on.
    pub fn validate(&self) -> Result<(), ModelError> {
        let c = self;
        if c.layers == 0 || c.hidden == 0 || c.heads == 0 || c.head_dim == 0 || c.vocab == 0 {
            return Err(shape(format!(
                "{} layers, hidden {}, {} heads of {}, vocabulary {}: all must be positive",
                c.layers, c.hidden, c.heads, c.head_dim, c.vocab
            )));
        }
        if c.rope_dims == 0 || !c.rope_dims.is_multiple_of(2) || c.rope_dims > c.head_dim {
            return Err(shape(format!(
                "rope.dimension_count {} for heads of {}",
                c.rope_dims, c.head_dim
            )));
        }
        if c.out_groups == 0 || !c.heads.is_multiple_of(c.out_groups) {
            return Err(shape(format!(
                "{} heads in {} output groups",
                c.heads, c.out_groups
            )));
        }
        if c.window == 0 || c.hc == 0 || c.sinkhorn_iters == 0 {
            return Err(shape(format!(
                "window {}, {} streams, {} Sinkhorn iterations: all must be positive",
                c.window, c.hc, c.sinkhorn_iters
            )));
        }
        if c.experts_used == 0 || c.experts_used > c.experts || c.hash_layers > c.layers {
            return Err(shape(format!(
                "{} of {} experts per token, {} hash layers of {}",
                c.experts_used, c.experts, c.hash_layers, c.layers
            )));
        }
        if c.ratios.contains(&4)
            && (c.indexer_heads == 0
                || c.indexer_dim == 0
                || c.indexer_top_k == 0
                || c.indexer_dim < c.rope_dims)
        {
            return Err(shape(format!(
                "CSA layers need an indexer: deepseek4.attention.indexer.head_count {}, \
                 deepseek4.attention.indexer.key_length {} (at least the rope dims {}), \
                 deepseek4.attention.indexer.top_k {}: all must be positive",
                c.indexer_heads, c.indexer_dim, c.rope_dims, c.indexer_top_k
            )));
        }
        Ok(())
    }

    /// What layer `l` attends to.
    pub fn kind(&self, l: usize) -> LayerKind {
        match self.ratios[l] {
            0 => LayerKind::Window,
            4 => LayerKind::Csa,
            c => LayerKind::Hca(c),
        }
    }

    /// Compression ratio of layer `l` (0: none).
    pub fn ratio(&self, l: usize) -> u32 {
        self.ratios[l]
    }

    /// Width of the mixer output: `(2 + hc) * hc`.
    pub fn mix(&self) -> usize {
        (2 + self.hc) * self.hc
    }

    /// The rotary embedding of layer `l` over heads of `head_dim`.
    pub fn rope(&self, l: usize, head_dim: usize, inverse: bool) -> TailRopeParams {
        let compressed = self.ratios[l] != 0;
        TailRopeParams {
            head_dim,
            n_dims: self.rope_dims,
            base: if compressed {
                self.compress_rope_base
            } else {
                self.rope_base
            },
            yarn: if compressed { self.yarn } else { None },
            inverse,
        }
    }

    /// True for layers that route by token id.
    pub fn is_hash_layer(&self, l: usize) -> bool {
        l < self.hash_layers
    }
}
