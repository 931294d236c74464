//! The Gemma 3 forward pass, recorded with the builder API.
//!
//! Each step records: the embedding lookup (scaled by `sqrt(hidden)`), then
//! per layer (in its own pool scope) attention with per-head query/key RMS
//! norms, RoPE with the layer's base, the sliding window of local layers
//! (the cache's window ring), post-attention norm and residual add, then the
//! GELU-gated FFN with its post norm and residual add; finally the output
//! norm and the tied output projection. The order of ops and of every
//! rounding is llama.cpp's (`src/models/gemma3.cpp`), so the same kernels
//! give the same bits.
//!
//! Taps carry llama.cpp's tensor names (`attn_norm-3`, `Qcur_normed-3`, ...)
//! so a tensor dump lines up with `llama-eval-callback`'s.

use super::{Gemma3, Gemma3Layer};
use crate::finite::LayerProbe;
use crate::step::LogitRows;
use crate::ModelError;
use weft_ops::{AttentionParams, Builder, Tensor};
use weft_runtime::cache::{CacheSpan, KvCache};
use weft_runtime::{GraphSession, PoolScope};

impl Gemma3 {
    /// Records one step over `tokens` at `span` and returns the logits
    /// tensor (`[rows, vocab]`, the rows `logits` asks for).
    pub fn record_step(
        &self,
        s: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        tokens: &[u32],
        logits: LogitRows,
    ) -> Result<Tensor, ModelError> {
        let ids = crate::step::upload_ids(s, tokens, span, self.token_embd.rows())?;
        self.record_ids(s, cache, span, ids, logits)
    }

    /// [`Gemma3::record_step`] over token ids already on the device (`ids`:
    /// i32, one per token of the span, inside the vocabulary: an earlier
    /// step's argmax, say).
    pub fn record_ids(
        &self,
        s: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        ids: Tensor,
        logits: LogitRows,
    ) -> Result<Tensor, ModelError> {
        self.record_probed(s, cache, span, ids, logits, None)
    }

    /// [`Gemma3::record_ids`], summing each layer's output into `probe`.
    pub(crate) fn record_probed(
        &self,
        s: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        ids: Tensor,
        logits: LogitRows,
        probe: Option<&LayerProbe>,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let n = crate::step::check_ids(&ids, span)?;
        if cache.layers().len() != c.layers {
            return Err(ModelError::Input(format!(
                "gemma3: a cache of {} layers for a model of {}",
                cache.layers().len(),
                c.layers
            )));
        }
        s.set_layer(None);
        let positions: Vec<i32> = (0..n as i32).map(|i| span.start as i32 + i).collect();
        let positions = s.upload_i32(&positions, "positions")?;
        // The residual stream lives in the session's scope, outside the
        // per-layer scopes, and is updated in place.
        let embd = s.get_rows(self.token_embd, ids, "token_embd")?;
        let mut x = s.scale(embd, c.embed_scale, "inp_scaled")?;
        s.tap("inp_scaled", x)?;
        let scope = if n == 1 {
            PoolScope::DecodeToken
        } else {
            PoolScope::PrefillLayer
        };
        for (l, layer) in self.layers.iter().enumerate() {
            s.set_layer(Some(l as u32));
            s.begin_pool_scope(scope);
            // The last layer only needs the rows whose logits are wanted.
            let keep_from = if l + 1 == c.layers {
                logits.first_row(span.start, n)
            } else {
                0
            };
            let ctx = LayerCtx {
                l,
                positions,
                cache,
                span,
                keep_from,
            };
            x = self.record_layer(s, layer, &ctx, x)?;
            if let Some(p) = probe {
                p.record(s, l, x)?;
            }
            s.end_pool_scope()?;
        }
        s.set_layer(None);
        let h = s.rms_norm(x, self.output_norm, c.rms_eps, "output_norm")?;
        s.tap("result_norm", h)?;
        Ok(s.matmul(h, self.output, "output")?)
    }

    fn record_layer(
        &self,
        s: &mut GraphSession<'_>,
        w: &Gemma3Layer,
        ctx: &LayerCtx<'_>,
        x: Tensor,
    ) -> Result<Tensor, ModelError> {
        let l = ctx.l;
        let n = x.rows();
        let a = self.record_attention(s, w, ctx, x)?;
        // The output projection runs on every row, as in llama.cpp, whose
        // kernel for Q4_K weights picks its summation order by the row's
        // place in the batch; only then are the rows the head needs kept.
        let mut o = s.matmul(a, w.wo, "attn_output")?;
        let mut x = x;
        if ctx.keep_from > 0 {
            o = o.rows_view(ctx.keep_from, n - ctx.keep_from)?;
            x = x.rows_view(ctx.keep_from, n - ctx.keep_from)?;
        }
        let c = &self.config;
        s.tap(format_args!("attn_out-{l}"), o)?;
        let o = s.rms_norm(o, w.post_attn_norm, c.rms_eps, "attn_post_norm")?;
        s.tap(format_args!("attn_post_norm-{l}"), o)?;
        s.add_into(x, o, "attn_residual")?;
        s.tap(format_args!("sa_out-{l}"), x)?;
        let h = s.rms_norm(x, w.ffn_norm, c.rms_eps, "ffn_norm")?;
        s.tap(format_args!("ffn_norm-{l}"), h)?;
        let hq = s.activations_for(h, w.gate.dtype, "ffn_norm.act")?;
        let g = s.matmul(hq, w.gate, "ffn_gate")?;
        let u = s.matmul(hq, w.up, "ffn_up")?;
        s.tap(format_args!("ffn_gate-{l}"), g)?;
        s.tap(format_args!("ffn_up-{l}"), u)?;
        let m = s.gelu_mul(g, u, "ffn_geglu")?;
        s.tap(format_args!("ffn_geglu-{l}"), m)?;
        let d = s.matmul(m, w.down, "ffn_down")?;
        s.tap(format_args!("ffn_out-{l}"), d)?;
        let d = s.rms_norm(d, w.post_ffn_norm, c.rms_eps, "ffn_post_norm")?;
        s.tap(format_args!("ffn_post_norm-{l}"), d)?;
        s.add_into(x, d, "ffn_residual")?;
        s.tap(format_args!("l_out-{l}"), x)?;
        Ok(x)
    }

    /// Attention of layer `ctx.l` over its cache rows; returns the heads'
    /// outputs `[n, heads * head_dim]`.
    fn record_attention(
        &self,
        s: &mut GraphSession<'_>,
        w: &Gemma3Layer,
        ctx: &LayerCtx<'_>,
        x: Tensor,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let (l, n) = (ctx.l, x.rows());
        let kv = ctx.cache.layer(l);
        if kv.window != c.layer_window(l) {
            return Err(ModelError::Input(format!(
                "gemma3 layer {l}: the cache's window {:?} is not the model's {:?} (build the cache with Model::cache_config)",
                kv.window,
                c.layer_window(l)
            )));
        }
        let rope = c.layer_rope(l);
        let h = s.rms_norm(x, w.attn_norm, c.rms_eps, "attn_norm")?;
        s.tap(format_args!("attn_norm-{l}"), h)?;
        // Q, K and V read the same activations: quantize them once.
        let hq = s.activations_for(h, w.wq.dtype, "attn_norm.act")?;
        let q = s.matmul(hq, w.wq, "attn_q")?;
        let k = s.matmul(hq, w.wk, "attn_k")?;
        let v = s.matmul(hq, w.wv, "attn_v")?;
        s.tap(format_args!("Vcur-{l}"), v)?;
        let q = self.head_norm(s, q, c.heads, w.q_norm, "attn_q_norm")?;
        s.tap(format_args!("Qcur_normed-{l}"), q)?;
        let q = s.rope(q, ctx.positions, rope, "rope_q")?;
        // Scaled before attention (which then scales by 1), as llama.cpp
        // does: the order matters once attention rounds q to f16.
        let q = s.scale(q, c.query_scale, "q_scale")?;
        s.tap(format_args!("Qcur-{l}"), q)?;
        let k = self.head_norm(s, k, c.kv_heads, w.k_norm, "attn_k_norm")?;
        s.tap(format_args!("Kcur_normed-{l}"), k)?;
        let k = s.rope(k, ctx.positions, rope, "rope_k")?;
        s.tap(format_args!("Kcur-{l}"), k)?;
        s.set_rows(k, kv.k, ctx.span.start, kv.ring, "cache_k")?;
        s.set_rows(v, kv.v, ctx.span.start, kv.ring, "cache_v")?;
        let rows = kv.ring.map_or(ctx.span.end() as usize, |r| r as usize);
        let params = AttentionParams {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            scale: 1.0,
            q_position: ctx.span.start,
            window: kv.window,
            ring: kv.ring,
            softcap: 0.0,
            kv_capacity: kv.k.rows() as u32,
            flash: true,
        };
        let kview = kv.k.rows_view(0, rows)?;
        let vview = kv.v.rows_view(0, rows)?;
        let a = s.attention(q, kview, vview, params, "attn")?;
        s.tap(format_args!("kqv_out-{l}"), a)?;
        debug_assert_eq!(a.rows(), n);
        Ok(a)
    }

    /// RMS norm of every head of `t` (`[n, heads * head_dim]`) with the
    /// shared `weight` (`[head_dim]`): one `rms_norm` over the same bytes
    /// seen as `[n * heads, head_dim]`.
    fn head_norm(
        &self,
        s: &mut GraphSession<'_>,
        t: Tensor,
        heads: usize,
        weight: Tensor,
        label: &'static str,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let per_head = s.reshape_rows(t, heads)?;
        let normed = s.rms_norm(per_head, weight, c.rms_eps, label)?;
        Ok(normed.reshape(t.shape.dims())?)
    }
}

/// What one layer's recording needs besides its weights.
struct LayerCtx<'a> {
    l: usize,
    positions: Tensor,
    cache: &'a KvCache,
    span: &'a CacheSpan,
    /// First row whose output the next layer (or the head) needs.
    keep_from: usize,
}
