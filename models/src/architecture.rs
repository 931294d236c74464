//! What every model family answers for [`Model`](crate::model::Model): one
//! trait, implemented by each family here, so the model asks its family
//! once instead of matching on it per question. A new family implements
//! it and adds a [`Family`] variant.

use crate::deepseek4::DeepSeek4;
use crate::finite::LayerProbe;
use crate::gemma3::Gemma3;
use crate::llama::Llama;
use crate::model::Family;
use crate::step::LogitRows;
use crate::ModelError;
use weft_ops::{DType, Tensor};
use weft_runtime::cache::{CacheConfig, CacheSpan, KvCache, LayerSpec};
use weft_runtime::GraphSession;

/// A family's answers to the questions every front end asks.
pub(crate) trait Architecture {
    /// Width of the residual stream (what the layer probes sum).
    fn residual_width(&self) -> usize;
    /// Context length the model was trained for.
    fn trained_context(&self) -> u32;
    /// Vocabulary size of the output layer.
    fn vocab(&self) -> usize;
    /// Rows of the token embedding.
    fn embedding_rows(&self) -> usize;
    /// Transformer layers.
    fn layers(&self) -> usize;
    /// The attention window the prefill chunking respects.
    fn chunk_window(&self) -> Option<u32>;
    /// The cache layout for `context` tokens in steps of up to `max_chunk`.
    fn cache_config(&self, context: u32, max_chunk: u32) -> CacheConfig;
    /// Records a step over host token ids (`tokens`, one per span token).
    fn record_tokens(
        &self,
        s: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        tokens: &[u32],
        rows: LogitRows,
        probe: Option<&LayerProbe>,
    ) -> Result<Tensor, ModelError>;
    /// Records a step over token ids already on the device.
    fn record_ids(
        &self,
        s: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        ids: Tensor,
        rows: LogitRows,
        probe: Option<&LayerProbe>,
    ) -> Result<Tensor, ModelError>;
}

impl Family {
    /// This family's answers.
    pub(crate) fn arch(&self) -> &dyn Architecture {
        match self {
            Family::Llama(m) => m,
            Family::Gemma3(m) => m,
            Family::DeepSeek4(m) => m.as_ref(),
        }
    }
}

/// A cache of f16 rows with `layers`' widths and windows.
fn f16_cache(layers: Vec<LayerSpec>, context: u32, max_chunk: u32) -> CacheConfig {
    CacheConfig {
        layers,
        context,
        max_chunk: max_chunk.min(context).max(1),
        dtype: DType::F16,
    }
}

/// The answers the one-cache families (Llama, Gemma 3) share: their
/// configs have the same fields and their forward passes the same entry;
/// only the cache layout (`$cache`) differs.
macro_rules! dense_architecture {
    ($family:ty, $cache:expr) => {
        impl Architecture for $family {
            fn residual_width(&self) -> usize {
                self.config.hidden
            }
            fn trained_context(&self) -> u32 {
                self.config.context
            }
            fn vocab(&self) -> usize {
                self.output.rows()
            }
            fn embedding_rows(&self) -> usize {
                self.token_embd.rows()
            }
            fn layers(&self) -> usize {
                self.config.layers
            }
            fn chunk_window(&self) -> Option<u32> {
                self.config.window
            }
            fn cache_config(&self, context: u32, max_chunk: u32) -> CacheConfig {
                let layers: fn(&Self) -> Vec<LayerSpec> = $cache;
                f16_cache(layers(self), context, max_chunk)
            }
            fn record_tokens(
                &self,
                s: &mut GraphSession<'_>,
                cache: &KvCache,
                span: &CacheSpan,
                tokens: &[u32],
                rows: LogitRows,
                probe: Option<&LayerProbe>,
            ) -> Result<Tensor, ModelError> {
                let ids = crate::step::upload_ids(s, tokens, span, self.token_embd.rows())?;
                self.record_probed(s, cache, span, ids, rows, probe)
            }
            fn record_ids(
                &self,
                s: &mut GraphSession<'_>,
                cache: &KvCache,
                span: &CacheSpan,
                ids: Tensor,
                rows: LogitRows,
                probe: Option<&LayerProbe>,
            ) -> Result<Tensor, ModelError> {
                self.record_probed(s, cache, span, ids, rows, probe)
            }
        }
    };
}

// Every layer alike.
dense_architecture!(Llama, |m| {
    let spec = LayerSpec {
        width: m.config.kv_width(),
        window: m.config.window,
    };
    vec![spec; m.config.layers]
});

// Sliding-window and global layers.
dense_architecture!(Gemma3, |m| {
    (0..m.config.layers)
        .map(|l| LayerSpec {
            width: m.config.kv_width(),
            window: m.config.layer_window(l),
        })
        .collect()
});

impl Architecture for DeepSeek4 {
    fn residual_width(&self) -> usize {
        self.config.hc * self.config.hidden
    }
    fn trained_context(&self) -> u32 {
        self.config.context
    }
    fn vocab(&self) -> usize {
        self.config.vocab
    }
    fn embedding_rows(&self) -> usize {
        self.config.vocab
    }
    fn layers(&self) -> usize {
        self.config.layers
    }
    fn chunk_window(&self) -> Option<u32> {
        Some(self.config.window)
    }
    fn cache_config(&self, context: u32, max_chunk: u32) -> CacheConfig {
        self.cache_layout(context, max_chunk).kv
    }
    fn record_tokens(
        &self,
        s: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        tokens: &[u32],
        rows: LogitRows,
        probe: Option<&LayerProbe>,
    ) -> Result<Tensor, ModelError> {
        self.record_step_probed(s, &[cache], span.start, tokens, rows, probe)
    }
    fn record_ids(
        &self,
        s: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        ids: Tensor,
        rows: LogitRows,
        probe: Option<&LayerProbe>,
    ) -> Result<Tensor, ModelError> {
        if span.tokens != 1 {
            return Err(ModelError::Unsupported(format!(
                "deepseek4 takes device-fed token ids one per step, not {}",
                span.tokens
            )));
        }
        self.record_ids_probed(s, cache, span.start, ids, rows, probe)
    }
}
