//! The Llama forward pass, recorded with the builder API.
//!
//! Written in the order a model author thinks of it (each projection
//! followed by its rope); the reorder pass finds what can run together.
//!
//! A step's rows belong to one sequence (a prefill chunk or a decode
//! token), or each to its own ([`Llama::record_batch`]: one decode token
//! per sequence, each at its own position). Every op but the cache write
//! and attention is row-wise or a matmul, so the batch shares them; each
//! row writes its own cache and attends over it alone, as that sequence's
//! own decode step would.

use super::{Llama, LlamaArch, LlamaFfn, LlamaLayer};
use crate::finite::LayerProbe;
use crate::step::LogitRows;
use crate::ModelError;
use weft_ops::quant::vec_dot_type;
use weft_ops::{AttentionParams, Builder, DType, Op, Recorder, Tensor};
use weft_runtime::cache::{CacheSpan, KvCache};
use weft_runtime::{GraphSession, PoolScope};

impl Llama {
    /// Records one step over `tokens` at `span` and returns the logits tensor
    /// (`[rows, vocab]`, rows per `logits`).
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

    /// [`Llama::record_step`] over token ids already on the device (`ids`:
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

    /// [`Llama::record_ids`], summing each layer's output into `probe`.
    pub(crate) fn record_probed(
        &self,
        s: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        ids: Tensor,
        logits: LogitRows,
        probe: Option<&LayerProbe>,
    ) -> Result<Tensor, ModelError> {
        crate::step::check_ids(&ids, span)?;
        self.record_lanes(s, Lanes::One { cache, span }, ids, logits, probe)
    }

    /// Records one decode token for each of several sequences: row `b`
    /// (`ids[b]`, i32, inside the vocabulary) is sequence `b`'s token,
    /// written to `caches[b]` at `spans[b]` (one token each) and attending
    /// over that cache alone. Returns the logits, `[B, vocab]`.
    pub fn record_batch(
        &self,
        s: &mut GraphSession<'_>,
        caches: &[&KvCache],
        spans: &[CacheSpan],
        ids: Tensor,
    ) -> Result<Tensor, ModelError> {
        if caches.is_empty() || caches.len() != spans.len() || ids.shape.elements() != spans.len() {
            return Err(ModelError::Input(format!(
                "a batch step needs one cache, one span and one token id per sequence; got {} caches, {} spans, {} ids",
                caches.len(),
                spans.len(),
                ids.shape.elements()
            )));
        }
        if let Some((b, span)) = spans.iter().enumerate().find(|(_, sp)| sp.tokens != 1) {
            return Err(ModelError::Input(format!(
                "a batch step decodes one token per sequence; sequence {b}'s span has {}",
                span.tokens
            )));
        }
        self.record_lanes(s, Lanes::Each { caches, spans }, ids, LogitRows::All, None)
    }

    fn record_lanes(
        &self,
        s: &mut GraphSession<'_>,
        lanes: Lanes<'_>,
        ids: Tensor,
        logits: LogitRows,
        probe: Option<&LayerProbe>,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let n = ids.shape.elements();
        s.set_layer(None);
        let positions: Vec<i32> = match lanes {
            Lanes::One { span, .. } => (0..n as i32).map(|i| span.start as i32 + i).collect(),
            Lanes::Each { spans, .. } => spans.iter().map(|sp| sp.start as i32).collect(),
        };
        let positions = s.upload_i32(&positions, "positions")?;
        // The residual stream lives in the session's scope, outside the
        // per-layer scopes, and is updated in place.
        let mut x = s.get_rows(self.token_embd, ids, "token_embd")?;
        let scope = if n == 1 {
            PoolScope::DecodeToken
        } else {
            PoolScope::PrefillLayer
        };
        for (l, layer) in self.layers.iter().enumerate() {
            s.set_layer(Some(l as u32));
            s.begin_pool_scope(scope);
            // The last layer only needs the rows whose logits are wanted.
            let keep_from = match lanes {
                Lanes::One { span, .. } if l + 1 == c.layers => logits.first_row(span.start, n),
                _ => 0,
            };
            x = self.record_layer(s, layer, l, x, positions, lanes, keep_from)?;
            if let Some(p) = probe {
                p.record(s, l, x)?;
            }
            s.end_pool_scope()?;
        }
        s.set_layer(None);
        let h = s.rms_norm(x, self.output_norm, c.rms_eps, "output_norm")?;
        Ok(s.matmul(h, self.output, "output")?)
    }

    #[allow(clippy::too_many_arguments)]
    fn record_layer(
        &self,
        s: &mut GraphSession<'_>,
        w: &LlamaLayer,
        l: usize,
        x: Tensor,
        positions: Tensor,
        lanes: Lanes<'_>,
        keep_from: usize,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let n = x.rows();
        let h = s.rms_norm(x, w.attn_norm, c.rms_eps, "attn_norm")?;
        s.tap(format_args!("attn_norm-{l}"), h)?;
        let hq = s.activations_for(h, w.wq.dtype, "attn_norm.act")?;
        let mut q = projection(s, h, hq, w.wq, w.bias.q, "attn_q")?;
        let mut k = projection(s, h, hq, w.wk, w.bias.k, "attn_k")?;
        if let Some((q_norm, k_norm)) = w.qk_norm {
            q = head_norm(s, q, c.heads, q_norm, c.rms_eps, "attn_q_norm")?;
            s.tap(format_args!("Qcur_normed-{l}"), q)?;
            k = head_norm(s, k, c.kv_heads, k_norm, c.rms_eps, "attn_k_norm")?;
            s.tap(format_args!("Kcur_normed-{l}"), k)?;
        }
        s.tap(format_args!("Qcur-{l}"), q)?;
        let context = match lanes {
            Lanes::One { cache, .. } => cache.config().context,
            Lanes::Each { caches, .. } => caches.first().map_or(0, |c| c.config().context),
        };
        let mut q = self.rope(s, q, positions, context, "rope_q")?;
        let k = self.rope(s, k, positions, context, "rope_k")?;
        // Phi-3 scales the queries, then attends with a scale of one.
        let mut scale = 1.0 / (c.head_dim as f32).sqrt();
        if self.arch == LlamaArch::Phi3 {
            q = s.scale(q, scale, "attn_q_scale")?;
            scale = 1.0;
        }
        s.tap(format_args!("Kcur-{l}"), k)?;
        let v = projection(s, h, hq, w.wv, w.bias.v, "attn_v")?;
        s.tap(format_args!("Vcur-{l}"), v)?;
        let mut a = match lanes {
            Lanes::One { cache, span } => {
                let (kview, vview, params) = self.write_and_view(s, cache, l, span, k, v, scale)?;
                s.tap(format_args!("Qrope-{l}"), q)?;
                s.attention(q, kview, vview, params, "attn")?
            }
            Lanes::Each { caches, spans } => {
                s.tap(format_args!("Qrope-{l}"), q)?;
                let a = s.alloc(DType::F32, q.shape.dims())?;
                for (b, (cache, span)) in caches.iter().zip(spans).enumerate() {
                    let row = |t: Tensor| t.rows_view(b, 1);
                    let (kview, vview, params) =
                        self.write_and_view(s, cache, l, span, row(k)?, row(v)?, scale)?;
                    s.push(
                        Op::Attention(params),
                        vec![row(q)?, kview, vview],
                        vec![row(a)?],
                        "attn",
                    )?;
                }
                a
            }
        };
        s.tap(format_args!("kqv_out-{l}"), a)?;
        let mut x = x;
        if keep_from > 0 {
            a = a.rows_view(keep_from, n - keep_from)?;
            x = x.rows_view(keep_from, n - keep_from)?;
        }
        let o = s.matmul(a, w.wo, "attn_output")?;
        s.tap(format_args!("attn_out-{l}"), o)?;
        s.add_into(x, o, "attn_residual")?;
        s.tap(format_args!("ffn_inp-{l}"), x)?;
        let h = s.rms_norm(x, w.ffn_norm, c.rms_eps, "ffn_norm")?;
        let (gate, up, down) = match w.ffn {
            LlamaFfn::Dense { gate, up, down } => (gate, up, down),
            LlamaFfn::Moe(moe) => {
                let d = moe.record(s, h, l)?;
                s.tap(format_args!("ffn_moe_out-{l}"), d)?;
                s.add_into(x, d, "ffn_residual")?;
                s.tap(format_args!("l_out-{l}"), x)?;
                return Ok(x);
            }
        };
        let hq = s.activations_for(h, gate.dtype, "ffn_norm.act")?;
        let g = s.matmul(hq, gate, "ffn_gate")?;
        let u = projection(s, h, hq, up, None, "ffn_up")?;
        s.tap(format_args!("ffn_gate-{l}"), g)?;
        s.tap(format_args!("ffn_up-{l}"), u)?;
        let m = s.silu_mul(g, u, "ffn_silu_mul")?;
        s.tap(format_args!("ffn_swiglu-{l}"), m)?;
        let d = s.matmul(m, down, "ffn_down")?;
        s.tap(format_args!("ffn_out-{l}"), d)?;
        s.add_into(x, d, "ffn_residual")?;
        s.tap(format_args!("l_out-{l}"), x)?;
        Ok(x)
    }

    /// Writes `k` and `v` (the span's rows) into layer `l` of `cache` and
    /// returns the cache views and parameters the span's queries attend
    /// with.
    #[allow(clippy::too_many_arguments)]
    fn write_and_view(
        &self,
        s: &mut GraphSession<'_>,
        cache: &KvCache,
        l: usize,
        span: &CacheSpan,
        k: Tensor,
        v: Tensor,
        scale: f32,
    ) -> Result<(Tensor, Tensor, AttentionParams), ModelError> {
        let c = &self.config;
        let kv = cache.layer(l);
        s.set_rows(k, kv.k, span.start, kv.ring, "cache_k")?;
        s.set_rows(v, kv.v, span.start, kv.ring, "cache_v")?;
        let rows = kv.ring.map_or(span.end() as usize, |r| r as usize);
        let params = AttentionParams {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            scale,
            q_position: span.start,
            window: kv.window,
            ring: kv.ring,
            softcap: 0.0,
            kv_capacity: kv.k.rows() as u32,
            flash: self.flash_attention,
        };
        Ok((kv.k.rows_view(0, rows)?, kv.v.rows_view(0, rows)?, params))
    }
}

/// The sequences a step's rows belong to.
#[derive(Clone, Copy)]
enum Lanes<'a> {
    /// Every row to one sequence, at consecutive positions from the span's.
    One {
        cache: &'a KvCache,
        span: &'a CacheSpan,
    },
    /// Row `b` to sequence `b`: one token at `spans[b]` in `caches[b]`.
    Each {
        caches: &'a [&'a KvCache],
        spans: &'a [CacheSpan],
    },
}

impl Llama {
    /// Rope of `x` at `positions`, with the file's frequency factors when
    /// it has them (Phi-3's long ones when the cache of `context`
    /// positions is longer than the original training context).
    fn rope(
        &self,
        s: &mut GraphSession<'_>,
        x: Tensor,
        positions: Tensor,
        context: u32,
        label: &'static str,
    ) -> Result<Tensor, ModelError> {
        let p = self.config.rope;
        let long = context > self.config.rope_orig_ctx;
        let factors = self.rope_factors.or(self
            .long_rope
            .map(|(short, l)| if long { l } else { short }));
        Ok(match factors {
            Some(f) => s.rope_factors(x, positions, f, p, label)?,
            None => s.rope(x, positions, p, label)?,
        })
    }
}

/// RMS norm of each of the `heads` heads of every row of `x`, with weight
/// `w` (`[head_dim]`), as one norm over the rows viewed as heads.
fn head_norm(
    s: &mut GraphSession<'_>,
    x: Tensor,
    heads: usize,
    w: Tensor,
    eps: f32,
    label: &'static str,
) -> Result<Tensor, ModelError> {
    let per_head = s.reshape_rows(x, heads)?;
    let normed = s.rms_norm(per_head, w, eps, label)?;
    Ok(normed.reshape(x.shape.dims())?)
}

/// `h @ w^T (+ bias)`, reading `hq` (`h` already quantized for another
/// projection of the same input) when `w` takes that activation format,
/// else quantizing `h` for `w`. The bias is added after the matmul and
/// before rope, as llama.cpp's graph does.
fn projection(
    s: &mut GraphSession<'_>,
    h: Tensor,
    hq: Tensor,
    w: Tensor,
    bias: Option<Tensor>,
    label: &'static str,
) -> Result<Tensor, ModelError> {
    let x = if vec_dot_type(w.dtype) == hq.dtype {
        hq
    } else {
        h
    };
    Ok(s.linear(x, w, bias, label)?)
}
