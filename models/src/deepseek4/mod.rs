//! DeepSeek-V4 (`general.architecture = deepseek4`, Flash and Pro) on weft.
//!
//! What sets the architecture apart, and where each piece lives:
//!
//! | feature | here |
//! |---|---|
//! | `hc` residual streams mixed by hyper-connections (pre/post/Sinkhorn comb) | `forward.rs`; ops `hc_mix` (with the streams' RMS), `hc_collapse` (with the sublayer norm), `hc_expand` |
//! | attention over a 128-token window plus compressed rows, with sinks; inverse RoPE on the output | `attention.rs`; op `sink_attention` |
//! | KV compressor: gated pooling of `c` tokens (overlapping for CSA, `c = 4`), row norm, RoPE at the window start | `attention.rs`; op `compress`, writing the cache's row table |
//! | lightning indexer choosing the top-k compressed rows (CSA) | op `indexer_topk` |
//! | partial interleaved RoPE (last `r` dims), two bases, YaRN on compressed layers | op `tail_rope` (and inside `compress`, `sink_attention`) |
//! | grouped low-rank output projection | op `matmul_id` over the groups |
//! | MoE: sqrt-softplus router, selection bias, hash routing on the first layers, clamped SwiGLU, shared expert | `forward.rs`; ops `moe_route`, `moe_weights`, `matmul_id`, `swiglu_clamp`, `moe_combine` (adds the shared expert) |
//! | cache: window ring, compressor state, compressed and indexer rows | `cache.rs` (all inside a `KvCache`) |
//!
//! Files: `config.rs` (metadata), `weights.rs` (names, shapes, types),
//! `cache.rs` (layout), `forward.rs` and `attention.rs` (the recorded
//! forward pass), `run.rs` (steps, chunked prefill, cohorts),
//! `synthetic.rs` (Flash-shaped stacks with blank weights, for schedule
//! figures). The plain f64 forward pass the recorded one is tested
//! against, its specification, is the test kit's `deepseek4` module.

mod attention;
pub mod cache;
pub mod config;
mod forward;
mod run;
pub mod synthetic;
pub mod weights;

pub use cache::{CacheLayout, LayerSlots};
pub use config::{Dsv4Config, LayerKind};
pub use weights::{Dsv4Weights, LoadOptions};

use crate::weights::WeightMap;
use crate::ModelError;
use weft_runtime::GraphExecutor;

/// A loaded DeepSeek-V4 model.
pub struct DeepSeek4 {
    pub config: Dsv4Config,
    pub weights: Dsv4Weights,
    /// Which cache layers hold each layer's state (the same for every context).
    pub slots: Vec<LayerSlots>,
}

impl DeepSeek4 {
    /// Reads the config and the weights of a `deepseek4` file mapped in `weights`.
    pub fn load(
        weights: &WeightMap<'_>,
        exec: &mut GraphExecutor,
        options: LoadOptions,
    ) -> Result<DeepSeek4, ModelError> {
        let config = Dsv4Config::from_gguf(weights.file())?;
        let w = Dsv4Weights::load(weights, exec, &config, options)?;
        Ok(Self::from_parts(config, w))
    }

    /// A model from a config and weights built elsewhere.
    pub fn from_parts(config: Dsv4Config, weights: Dsv4Weights) -> DeepSeek4 {
        let slots = CacheLayout::new(&config, 1, 1).slots;
        DeepSeek4 {
            config,
            weights,
            slots,
        }
    }
}
