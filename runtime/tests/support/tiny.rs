//! A tiny Llama-shaped transformer with random weights, recorded from
//! weft's own ops through the builder API: the model the cache tests run.
//!
//! Pre-norm blocks (RMS norm, grouped-query attention with RoPE over the KV
//! cache, SwiGLU feed-forward), Q8_0 matrices quantized here with
//! `weft_ops::quant::quantize_row`, f32 embeddings, and one sliding-window
//! layer so rings are exercised. Node labels are `blk.{layer}.{name}` (and
//! `.lane{b}` for per-lane cohort nodes) so fault injection can aim at them.

use weft_ops::quant::quantize_row;
use weft_ops::{AttentionParams, Builder, DType, Op, RopeMode, RopeParams, Tensor};
use weft_runtime::cache::{
    prefill_chunked, run_step, CacheConfig, CacheSpan, ChunkPolicy, Cohort, CohortSpan, KvCache,
    LayerCache, LayerSpec, PrefillOutcome,
};
use weft_runtime::{GraphExecutor, GraphSession, PoolScope, RuntimeError};
use weft_testkit::Rng;

/// How a step's transient tensors are scoped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScopeMode {
    /// One pool scope per layer: layer `l + 1` reuses layer `l`'s buffers.
    PerLayer,
    /// One scope for the whole step: nothing is reused inside a recording.
    WholeStep,
}

/// Shape of the tiny model.
#[derive(Clone, Debug, PartialEq)]
pub struct TinyConfig {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// One entry per layer: the layer's sliding window, if any.
    pub windows: Vec<Option<u32>>,
    pub weights: DType,
    pub seed: u64,
    pub scopes: ScopeMode,
}

impl TinyConfig {
    /// Three layers (the middle one windowed), hidden 64, 4 heads over 2
    /// KV heads, Q8_0 weights.
    pub fn small() -> TinyConfig {
        TinyConfig {
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            ffn: 128,
            vocab: 96,
            windows: vec![None, Some(6), None],
            weights: DType::Q8_0,
            seed: 0x5eed,
            scopes: ScopeMode::PerLayer,
        }
    }

    /// `layers` layers without windows (the pool and barrier measurements).
    pub fn plain(layers: usize) -> TinyConfig {
        TinyConfig {
            windows: vec![None; layers],
            ..TinyConfig::small()
        }
    }

    pub fn layers(&self) -> usize {
        self.windows.len()
    }

    fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

struct Layer {
    attn_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    ffn_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// The model: weights live in executor buffers.
pub struct Tiny {
    pub config: TinyConfig,
    embd: Tensor,
    layers: Vec<Layer>,
    out_norm: Tensor,
    output: Tensor,
}

fn upload(
    exec: &mut GraphExecutor,
    values: &[f32],
    dims: &[usize],
    dtype: DType,
    name: &str,
) -> Result<Tensor, RuntimeError> {
    let t = exec.alloc_tensor(dtype, dims, name)?;
    let cols = dims[dims.len() - 1];
    let bytes = match dtype {
        DType::F32 => bytemuck::cast_slice(values).to_vec(),
        q => {
            let row = q.row_bytes(cols).unwrap_or(0);
            let mut out = vec![0u8; row * values.len() / cols];
            for (src, dst) in values.chunks(cols).zip(out.chunks_mut(row)) {
                quantize_row(q, src, dst)?;
            }
            out
        }
    };
    exec.write_bytes(&t, &bytes)?;
    Ok(t)
}

impl Tiny {
    /// Builds the model with weights drawn from `config.seed`.
    pub fn new(exec: &mut GraphExecutor, config: TinyConfig) -> Result<Tiny, RuntimeError> {
        let mut rng = Rng::from_state(config.seed);
        let c = &config;
        let mut matrix = |exec: &mut GraphExecutor, rows: usize, cols: usize, name: &str| {
            let gain = 1.5 / (cols as f32).sqrt();
            let v: Vec<f32> = (0..rows * cols).map(|_| rng.val(1.0) * gain).collect();
            upload(exec, &v, &[rows, cols], c.weights, name)
        };
        let mut norm_rng = Rng::from_state(config.seed.wrapping_mul(31));
        let mut norm = |exec: &mut GraphExecutor, name: &str| {
            let v: Vec<f32> = (0..c.hidden)
                .map(|_| 1.0 + 0.2 * norm_rng.val(1.0))
                .collect();
            upload(exec, &v, &[c.hidden], DType::F32, name)
        };
        let (q_width, kv_width) = (c.heads * c.head_dim, c.kv_width());
        let mut layers = Vec::with_capacity(c.layers());
        for l in 0..c.layers() {
            layers.push(Layer {
                attn_norm: norm(exec, &format!("blk.{l}.attn_norm"))?,
                wq: matrix(exec, q_width, c.hidden, &format!("blk.{l}.attn_q"))?,
                wk: matrix(exec, kv_width, c.hidden, &format!("blk.{l}.attn_k"))?,
                wv: matrix(exec, kv_width, c.hidden, &format!("blk.{l}.attn_v"))?,
                wo: matrix(exec, c.hidden, q_width, &format!("blk.{l}.attn_output"))?,
                ffn_norm: norm(exec, &format!("blk.{l}.ffn_norm"))?,
                gate: matrix(exec, c.ffn, c.hidden, &format!("blk.{l}.ffn_gate"))?,
                up: matrix(exec, c.ffn, c.hidden, &format!("blk.{l}.ffn_up"))?,
                down: matrix(exec, c.hidden, c.ffn, &format!("blk.{l}.ffn_down"))?,
            });
        }
        let out_norm = norm(exec, "output_norm")?;
        let output = matrix(exec, c.vocab, c.hidden, "output")?;
        let embd_values: Vec<f32> = (0..c.vocab * c.hidden).map(|_| rng.val(1.0)).collect();
        let embd = upload(
            exec,
            &embd_values,
            &[c.vocab, c.hidden],
            DType::F32,
            "token_embd",
        )?;
        Ok(Tiny {
            config,
            embd,
            layers,
            out_norm,
            output,
        })
    }

    /// The cache layout for `context` tokens and steps of up to `max_chunk`.
    pub fn cache_config(&self, context: u32, max_chunk: u32) -> CacheConfig {
        let layers = self
            .config
            .windows
            .iter()
            .map(|&window| LayerSpec {
                width: self.config.kv_width(),
                window,
            })
            .collect();
        CacheConfig {
            layers,
            context,
            max_chunk,
            dtype: DType::F16,
        }
    }

    /// A fresh cache.
    pub fn new_cache(
        &self,
        exec: &mut GraphExecutor,
        context: u32,
        max_chunk: u32,
    ) -> Result<KvCache, RuntimeError> {
        KvCache::new(exec, self.cache_config(context, max_chunk))
    }

    fn rope(&self) -> RopeParams {
        RopeParams::plain(
            RopeMode::Neox,
            self.config.head_dim,
            self.config.head_dim,
            10_000.0,
        )
    }

    fn attention_params(&self, position: u32, kv: &LayerCache) -> AttentionParams {
        let c = &self.config;
        AttentionParams {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            q_position: position,
            window: kv.window,
            ring: kv.ring,
            softcap: 0.0,
            kv_capacity: kv.k.rows() as u32,
            flash: true,
        }
    }

    /// Records one step of `tokens` at `span` (one sequence); returns the
    /// logits `[n, vocab]`.
    pub fn record_step(
        &self,
        s: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        tokens: &[u32],
    ) -> Result<Tensor, RuntimeError> {
        let positions: Vec<i32> = (0..tokens.len() as i32)
            .map(|i| span.start as i32 + i)
            .collect();
        self.record_forward(s, tokens, &positions, |s, l, q, k, v| {
            let out = alloc_like(s, q)?;
            let prefix = format!("blk.{l}");
            record_attention(s, self, cache.layer(l), span.start, [q, k, v, out], &prefix)?;
            Ok(out)
        })
    }

    /// Records one cohort step: token `b` for lane `b`, all at the shared
    /// position; returns the logits `[B, vocab]`.
    pub fn record_cohort_step(
        &self,
        s: &mut GraphSession<'_>,
        lanes: &[&KvCache],
        plan: &CohortSpan,
        tokens: &[u32],
    ) -> Result<Tensor, RuntimeError> {
        if tokens.len() != lanes.len() {
            return Err(RuntimeError::Usage(format!(
                "{} tokens for {} lanes",
                tokens.len(),
                lanes.len()
            )));
        }
        let positions = vec![plan.position() as i32; lanes.len()];
        self.record_forward(s, tokens, &positions, |s, l, q, k, v| {
            let out = alloc_like(s, q)?;
            for (b, lane) in lanes.iter().enumerate() {
                let row = |t: Tensor| t.rows_view(b, 1);
                record_attention(
                    s,
                    self,
                    lane.layer(l),
                    plan.position(),
                    [row(q)?, row(k)?, row(v)?, row(out)?],
                    &format!("blk.{l}.lane{b}"),
                )?;
            }
            Ok(out)
        })
    }

    /// The forward pass around an attention recorder `attend(s, layer, q, k, v)`.
    fn record_forward(
        &self,
        s: &mut GraphSession<'_>,
        tokens: &[u32],
        positions: &[i32],
        mut attend: impl FnMut(
            &mut GraphSession<'_>,
            usize,
            Tensor,
            Tensor,
            Tensor,
        ) -> Result<Tensor, RuntimeError>,
    ) -> Result<Tensor, RuntimeError> {
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        s.set_layer(None);
        let ids = s.upload_i32(&ids, "token_ids")?;
        let positions = s.upload_i32(positions, "positions")?;
        let kind = if tokens.len() == 1 {
            PoolScope::DecodeToken
        } else {
            PoolScope::PrefillLayer
        };
        // The residual stream: updated in place, outside the layer scopes.
        let x = s.get_rows(self.embd, ids, "token_embd")?;
        match self.config.scopes {
            ScopeMode::WholeStep => {
                let mut step = s.pool_scope(kind);
                for l in 0..self.layers.len() {
                    self.record_layer(&mut step, l, x, positions, &mut attend)?;
                }
            }
            ScopeMode::PerLayer => {
                for l in 0..self.layers.len() {
                    let mut layer = s.pool_scope(kind);
                    self.record_layer(&mut layer, l, x, positions, &mut attend)?;
                }
            }
        }
        s.set_layer(None);
        let h = s.rms_norm(x, self.out_norm, 1e-5, "output_norm")?;
        Ok(s.matmul(h, self.output, "output")?)
    }

    /// One block, updating the residual stream `x` in place.
    fn record_layer(
        &self,
        s: &mut GraphSession<'_>,
        l: usize,
        x: Tensor,
        positions: Tensor,
        attend: &mut impl FnMut(
            &mut GraphSession<'_>,
            usize,
            Tensor,
            Tensor,
            Tensor,
        ) -> Result<Tensor, RuntimeError>,
    ) -> Result<(), RuntimeError> {
        let w = &self.layers[l];
        let p = format!("blk.{l}");
        s.set_layer(Some(l as u32));
        let h = s.rms_norm(x, w.attn_norm, 1e-5, format!("{p}.attn_norm"))?;
        let hq = s.activations_for(h, w.wq.dtype, format!("{p}.attn_norm.act"))?;
        let q = s.matmul(hq, w.wq, format!("{p}.attn_q"))?;
        let q = s.rope(q, positions, self.rope(), format!("{p}.rope_q"))?;
        let k = s.matmul(hq, w.wk, format!("{p}.attn_k"))?;
        let k = s.rope(k, positions, self.rope(), format!("{p}.rope_k"))?;
        let v = s.matmul(hq, w.wv, format!("{p}.attn_v"))?;
        let a = attend(s, l, q, k, v)?;
        let o = s.matmul(a, w.wo, format!("{p}.attn_output"))?;
        s.add_into(x, o, format!("{p}.attn_residual"))?;
        let h = s.rms_norm(x, w.ffn_norm, 1e-5, format!("{p}.ffn_norm"))?;
        let hq = s.activations_for(h, w.gate.dtype, format!("{p}.ffn_norm.act"))?;
        let g = s.matmul(hq, w.gate, format!("{p}.ffn_gate"))?;
        let u = s.matmul(hq, w.up, format!("{p}.ffn_up"))?;
        let m = s.silu_mul(g, u, format!("{p}.ffn_silu_mul"))?;
        let d = s.matmul(m, w.down, format!("{p}.ffn_down"))?;
        s.add_into(x, d, format!("{p}.ffn_residual"))?;
        Ok(())
    }

    /// One step (one transaction); returns the logits of every token.
    pub fn step(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        tokens: &[u32],
    ) -> Result<Vec<f32>, RuntimeError> {
        run_step(exec, cache, tokens.len() as u32, |s, c, span| {
            self.record_step(s, c, span, tokens)
        })
    }

    /// One decode token; returns its logits.
    pub fn decode(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        token: u32,
    ) -> Result<Vec<f32>, RuntimeError> {
        self.step(exec, cache, &[token])
    }

    /// Decodes `tokens` one by one; returns every step's logits.
    pub fn decode_all(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>, RuntimeError> {
        tokens
            .iter()
            .map(|&t| self.decode(exec, cache, t))
            .collect()
    }

    /// Chunked prefill (each chunk its own transaction); the outcome's
    /// `last` holds the last chunk's logits, every row.
    pub fn prefill(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        tokens: &[u32],
        policy: &ChunkPolicy,
    ) -> Result<PrefillOutcome, RuntimeError> {
        prefill_chunked(
            exec,
            cache,
            tokens.len() as u32,
            policy,
            |s, c, span, range| self.record_step(s, c, span, &tokens[range]),
        )
    }

    /// The last row of `[n, vocab]` logits.
    pub fn last_row<'v>(&self, logits: &'v [f32]) -> &'v [f32] {
        &logits[logits.len() - self.config.vocab..]
    }

    /// One cohort step (token `b` to lane `b`) with a commit gate; returns
    /// the logits `[B, vocab]`.
    pub fn cohort_step(
        &self,
        exec: &mut GraphExecutor,
        cohort: &mut Cohort<'_>,
        tokens: &[u32],
        gate: impl FnOnce(&CohortSpan, &[f32]) -> Result<(), String>,
    ) -> Result<Vec<f32>, RuntimeError> {
        cohort.run_step(
            exec,
            |s, lanes, plan| self.record_cohort_step(s, lanes, plan, tokens),
            gate,
        )
    }
}

/// Writes `k`, `v` into the layer's cache rows at `position..` and records
/// attention of `q` over the published rows plus these into `out`.
fn record_attention(
    s: &mut GraphSession<'_>,
    model: &Tiny,
    kv: &LayerCache,
    position: u32,
    [q, k, v, out]: [Tensor; 4],
    prefix: &str,
) -> Result<(), RuntimeError> {
    s.set_rows(k, kv.k, position, kv.ring, format!("{prefix}.cache_k"))?;
    s.set_rows(v, kv.v, position, kv.ring, format!("{prefix}.cache_v"))?;
    let end = position as usize + q.rows();
    let rows = kv.ring.map_or(end, |r| r as usize);
    let params = model.attention_params(position, kv);
    let (kview, vview) = (kv.k.rows_view(0, rows)?, kv.v.rows_view(0, rows)?);
    s.push(
        Op::Attention(params),
        vec![q, kview, vview],
        vec![out],
        format!("{prefix}.attention"),
    )?;
    Ok(())
}

/// A pooled tensor shaped like `t`, from the session's current scope.
fn alloc_like(s: &mut GraphSession<'_>, t: Tensor) -> Result<Tensor, RuntimeError> {
    Ok(weft_ops::Recorder::alloc(s, t.dtype, t.shape.dims())?)
}
