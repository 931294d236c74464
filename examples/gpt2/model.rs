//! A GPT-2-style model written against weft's public API only: learned
//! position embeddings, LayerNorm with bias, attention and MLP projections
//! with biases, a GELU MLP, the output tied to the token embeddings.
//!
//! Weights are random (seeded) f32 values, uploaded once into one
//! read-only executor buffer; the forward pass records one step (a
//! prefill chunk or a decode token) through the builder API, with the KV
//! cache and pool scopes a real model uses.

use weft::graph::synth::SplitMix64;
use weft::models::{LogitRows, ModelError};
use weft::ops::{AttentionParams, Builder, DType, Tensor};
use weft::runtime::cache::{run_step, CacheConfig, CacheSpan, KvCache, LayerSpec};
use weft::runtime::{GraphExecutor, GraphSession, PoolScope};

/// Sizes of the toy model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gpt2Config {
    pub vocab: usize,
    pub context: usize,
    pub hidden: usize,
    pub heads: usize,
    pub ffn: usize,
    pub layers: usize,
    pub eps: f32,
}

impl Gpt2Config {
    /// A small model that runs in milliseconds.
    pub fn tiny() -> Self {
        Self {
            vocab: 96,
            context: 64,
            hidden: 64,
            heads: 4,
            ffn: 256,
            layers: 2,
            eps: 1e-5,
        }
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// One layer's host values (row-major, outermost first, as in the tensors).
#[derive(Clone, Debug)]
pub struct LayerValues {
    pub ln1_w: Vec<f32>,
    pub ln1_b: Vec<f32>,
    /// `[hidden, hidden]` each (output rows x input columns).
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub bq: Vec<f32>,
    pub bk: Vec<f32>,
    pub bv: Vec<f32>,
    pub wo: Vec<f32>,
    pub bo: Vec<f32>,
    pub ln2_w: Vec<f32>,
    pub ln2_b: Vec<f32>,
    /// `[ffn, hidden]`.
    pub fc1: Vec<f32>,
    pub fc1_b: Vec<f32>,
    /// `[hidden, ffn]`.
    pub fc2: Vec<f32>,
    pub fc2_b: Vec<f32>,
}

/// All weights as host values: what the plain reference reads.
#[derive(Clone, Debug)]
pub struct Gpt2Values {
    pub config: Gpt2Config,
    /// `[vocab, hidden]`, also the output projection.
    pub wte: Vec<f32>,
    /// `[context, hidden]`.
    pub wpe: Vec<f32>,
    pub layers: Vec<LayerValues>,
    pub lnf_w: Vec<f32>,
    pub lnf_b: Vec<f32>,
}

/// `n` values `offset + scale * u`, `u` uniform in [-1, 1).
fn uniform(rng: &mut SplitMix64, n: usize, scale: f32, offset: f32) -> Vec<f32> {
    (0..n)
        .map(|_| offset + scale * ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0))
        .collect()
}

impl Gpt2Values {
    /// Random weights, scaled like a trained model's (unit-ish activations).
    pub fn random(config: Gpt2Config, seed: u64) -> Self {
        let mut r = SplitMix64::new(seed);
        let (d, f) = (config.hidden, config.ffn);
        let wd = 1.0 / (d as f32).sqrt();
        let wf = 1.0 / (f as f32).sqrt();
        let layers = (0..config.layers)
            .map(|_| LayerValues {
                ln1_w: uniform(&mut r, d, 0.2, 1.0),
                ln1_b: uniform(&mut r, d, 0.1, 0.0),
                wq: uniform(&mut r, d * d, wd, 0.0),
                wk: uniform(&mut r, d * d, wd, 0.0),
                wv: uniform(&mut r, d * d, wd, 0.0),
                bq: uniform(&mut r, d, 0.1, 0.0),
                bk: uniform(&mut r, d, 0.1, 0.0),
                bv: uniform(&mut r, d, 0.1, 0.0),
                wo: uniform(&mut r, d * d, wd, 0.0),
                bo: uniform(&mut r, d, 0.1, 0.0),
                ln2_w: uniform(&mut r, d, 0.2, 1.0),
                ln2_b: uniform(&mut r, d, 0.1, 0.0),
                fc1: uniform(&mut r, f * d, 2.0 * wd, 0.0),
                fc1_b: uniform(&mut r, f, 0.1, 0.0),
                fc2: uniform(&mut r, d * f, wf, 0.0),
                fc2_b: uniform(&mut r, d, 0.1, 0.0),
            })
            .collect();
        Self {
            config,
            wte: uniform(&mut r, config.vocab * d, 1.0, 0.0),
            wpe: uniform(&mut r, config.context * d, 0.5, 0.0),
            layers,
            lnf_w: uniform(&mut r, d, 0.2, 1.0),
            lnf_b: uniform(&mut r, d, 0.1, 0.0),
        }
    }
}

/// One layer's weights on the device.
pub struct Gpt2Layer {
    pub ln1_w: Tensor,
    pub ln1_b: Tensor,
    pub wq: Tensor,
    pub wk: Tensor,
    pub wv: Tensor,
    pub bq: Tensor,
    pub bk: Tensor,
    pub bv: Tensor,
    pub wo: Tensor,
    pub bo: Tensor,
    pub ln2_w: Tensor,
    pub ln2_b: Tensor,
    pub fc1: Tensor,
    pub fc1_b: Tensor,
    pub fc2: Tensor,
    pub fc2_b: Tensor,
}

/// The model on one executor.
pub struct Gpt2 {
    pub config: Gpt2Config,
    pub wte: Tensor,
    pub wpe: Tensor,
    pub layers: Vec<Gpt2Layer>,
    pub lnf_w: Tensor,
    pub lnf_b: Tensor,
}

/// Packs f32 arrays into one byte vector, handing out tensors over it.
struct Packer {
    bytes: Vec<u8>,
    tensors: Vec<(u64, Vec<usize>)>,
}

impl Packer {
    fn add(&mut self, values: &[f32], dims: &[usize]) -> usize {
        self.tensors.push((self.bytes.len() as u64, dims.to_vec()));
        self.bytes
            .extend(values.iter().flat_map(|v| v.to_le_bytes()));
        self.tensors.len() - 1
    }
}

impl Gpt2 {
    /// Uploads `values` into one read-only buffer of `exec`.
    pub fn upload(values: &Gpt2Values, exec: &mut GraphExecutor) -> Result<Gpt2, ModelError> {
        let c = values.config;
        let (d, f) = (c.hidden, c.ffn);
        let mut p = Packer {
            bytes: Vec::new(),
            tensors: Vec::new(),
        };
        let wte = p.add(&values.wte, &[c.vocab, d]);
        let wpe = p.add(&values.wpe, &[c.context, d]);
        let mut layer_ids = Vec::new();
        for l in &values.layers {
            layer_ids.push([
                p.add(&l.ln1_w, &[d]),
                p.add(&l.ln1_b, &[d]),
                p.add(&l.wq, &[d, d]),
                p.add(&l.wk, &[d, d]),
                p.add(&l.wv, &[d, d]),
                p.add(&l.bq, &[d]),
                p.add(&l.bk, &[d]),
                p.add(&l.bv, &[d]),
                p.add(&l.wo, &[d, d]),
                p.add(&l.bo, &[d]),
                p.add(&l.ln2_w, &[d]),
                p.add(&l.ln2_b, &[d]),
                p.add(&l.fc1, &[f, d]),
                p.add(&l.fc1_b, &[f]),
                p.add(&l.fc2, &[d, f]),
                p.add(&l.fc2_b, &[d]),
            ]);
        }
        let lnf_w = p.add(&values.lnf_w, &[d]);
        let lnf_b = p.add(&values.lnf_b, &[d]);
        // One owned (64-byte aligned) buffer holding every weight.
        let buffer = exec.alloc_buffer(p.bytes.len() as u64, "gpt2.weights")?;
        let whole = Tensor::new(
            buffer,
            0,
            DType::F32,
            weft::ops::Shape::new(&[p.bytes.len() / 4]),
        )?;
        exec.write_bytes(&whole, &p.bytes)?;
        let tensor = |i: usize| -> Result<Tensor, ModelError> {
            let (offset, dims) = &p.tensors[i];
            Ok(Tensor::new(
                buffer,
                *offset,
                DType::F32,
                weft::ops::Shape::new(dims),
            )?)
        };
        let layers = layer_ids
            .iter()
            .map(|ids| {
                Ok(Gpt2Layer {
                    ln1_w: tensor(ids[0])?,
                    ln1_b: tensor(ids[1])?,
                    wq: tensor(ids[2])?,
                    wk: tensor(ids[3])?,
                    wv: tensor(ids[4])?,
                    bq: tensor(ids[5])?,
                    bk: tensor(ids[6])?,
                    bv: tensor(ids[7])?,
                    wo: tensor(ids[8])?,
                    bo: tensor(ids[9])?,
                    ln2_w: tensor(ids[10])?,
                    ln2_b: tensor(ids[11])?,
                    fc1: tensor(ids[12])?,
                    fc1_b: tensor(ids[13])?,
                    fc2: tensor(ids[14])?,
                    fc2_b: tensor(ids[15])?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Gpt2 {
            config: c,
            wte: tensor(wte)?,
            wpe: tensor(wpe)?,
            layers,
            lnf_w: tensor(lnf_w)?,
            lnf_b: tensor(lnf_b)?,
        })
    }

    /// A KV cache for the whole context: one f32 row of `hidden` values
    /// per position and layer (no sliding window).
    pub fn new_cache(&self, exec: &mut GraphExecutor) -> Result<KvCache, ModelError> {
        let c = self.config;
        let config = CacheConfig {
            layers: vec![
                LayerSpec {
                    width: c.hidden,
                    window: None,
                };
                c.layers
            ],
            context: c.context as u32,
            max_chunk: c.context as u32,
            dtype: DType::F32,
        };
        Ok(KvCache::new(exec, config)?)
    }

    /// Runs `tokens` at the cache's position as one transaction and
    /// returns the logits of every token (`[tokens, vocab]`, row-major).
    pub fn step(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        let n =
            u32::try_from(tokens.len()).map_err(|_| ModelError::Input("too many tokens".into()))?;
        run_step(exec, cache, n, |s, cache, span| {
            self.record(s, cache, span, tokens, LogitRows::All)
        })
    }

    /// Records one step and returns its logits tensor.
    pub fn record(
        &self,
        s: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        tokens: &[u32],
        _rows: LogitRows,
    ) -> Result<Tensor, ModelError> {
        let c = self.config;
        let n = tokens.len();
        if span.end() as usize > c.context {
            return Err(ModelError::Input(format!(
                "positions up to {} exceed the model's {} learned positions",
                span.end(),
                c.context
            )));
        }
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(ModelError::Input(format!(
                "token {bad} is outside the vocabulary of {}",
                c.vocab
            )));
        }
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let pos: Vec<i32> = (0..n as i32).map(|i| span.start as i32 + i).collect();
        let ids = s.upload_i32(&ids, "token_ids")?;
        let pos = s.upload_i32(&pos, "positions")?;
        // Learned positions: a second embedding lookup, added to the tokens'.
        let x = s.get_rows(self.wte, ids, "wte")?;
        let p = s.get_rows(self.wpe, pos, "wpe")?;
        s.add_into(x, p, "embed_add")?;
        let scope = if n == 1 {
            PoolScope::DecodeToken
        } else {
            PoolScope::PrefillLayer
        };
        for (l, w) in self.layers.iter().enumerate() {
            s.set_layer(Some(l as u32));
            s.begin_pool_scope(scope);
            self.record_layer(s, w, l, x, cache, span)?;
            s.end_pool_scope()?;
        }
        s.set_layer(None);
        let h = s.layer_norm(x, self.lnf_w, self.lnf_b, c.eps, "ln_f")?;
        Ok(s.matmul(h, self.wte, "lm_head")?)
    }

    fn record_layer(
        &self,
        s: &mut GraphSession<'_>,
        w: &Gpt2Layer,
        l: usize,
        x: Tensor,
        cache: &KvCache,
        span: &CacheSpan,
    ) -> Result<(), ModelError> {
        let c = self.config;
        let kv = cache.layer(l);
        let h = s.layer_norm(x, w.ln1_w, w.ln1_b, c.eps, "ln_1")?;
        let q = s.linear(h, w.wq, Some(w.bq), "attn_q")?;
        let k = s.linear(h, w.wk, Some(w.bk), "attn_k")?;
        let v = s.linear(h, w.wv, Some(w.bv), "attn_v")?;
        s.set_rows(k, kv.k, span.start, kv.ring, "cache_k")?;
        s.set_rows(v, kv.v, span.start, kv.ring, "cache_v")?;
        let rows = span.end() as usize;
        let params = AttentionParams {
            heads: c.heads,
            kv_heads: c.heads,
            head_dim: c.head_dim(),
            scale: 1.0 / (c.head_dim() as f32).sqrt(),
            q_position: span.start,
            window: None,
            ring: None,
            softcap: 0.0,
            kv_capacity: 0,
            flash: true,
        };
        let a = s.attention(
            q,
            kv.k.rows_view(0, rows)?,
            kv.v.rows_view(0, rows)?,
            params,
            "attn",
        )?;
        let o = s.linear(a, w.wo, Some(w.bo), "attn_output")?;
        s.add_into(x, o, "attn_residual")?;
        let h = s.layer_norm(x, w.ln2_w, w.ln2_b, c.eps, "ln_2")?;
        let u = s.linear(h, w.fc1, Some(w.fc1_b), "mlp_fc")?;
        let g = s.gelu(u, "mlp_gelu")?;
        let d = s.linear(g, w.fc2, Some(w.fc2_b), "mlp_proj")?;
        s.add_into(x, d, "mlp_residual")?;
        Ok(())
    }
}
