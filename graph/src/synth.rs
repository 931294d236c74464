//! Synthetic recordings for exercising and measuring the pass without a model.
//!
//! - [`random`]: random ops over random, overlapping ranges of a few buffers;
//! - [`llama_shape`]: one transformer step shaped like weft's Llama recording,
//!   with transient tensors from a per-layer pool that recycles its buffers.

use crate::dump::BufferInfo;
use crate::node::Node;
use crate::range::{BufferId, ByteRange};

/// A tiny deterministic generator (SplitMix64) so recordings are reproducible.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A synthetic recording: nodes plus the buffers they name.
pub struct Synthetic {
    pub nodes: Vec<Node>,
    pub buffers: Vec<BufferInfo>,
}

/// `nodes` random nodes over `buffers` buffers of `buffer_bytes` bytes each:
/// each reads 0..=2 ranges and writes 1..=2 ranges, with random offsets so
/// ranges partially overlap.
pub fn random(nodes: usize, buffers: u32, buffer_bytes: u64, seed: u64) -> Synthetic {
    let mut rng = SplitMix64::new(seed);
    let buffers = buffers.max(1);
    let buffer_bytes = buffer_bytes.max(2);
    let range = |rng: &mut SplitMix64| {
        let b = BufferId(rng.below(buffers as u64) as u32);
        let start = rng.below(buffer_bytes - 1);
        let len = 1 + rng.below((buffer_bytes - start).min(buffer_bytes / 4 + 1));
        ByteRange::new(b, start, (start + len).min(buffer_bytes))
    };
    let node_list = (0..nodes)
        .map(|i| {
            let reads = (0..rng.below(3)).map(|_| range(&mut rng)).collect();
            let writes = (0..1 + rng.below(2)).map(|_| range(&mut rng)).collect();
            let layer = Some((i / 16) as u32);
            Node::checked(
                "random",
                format!("n{i}").into(),
                layer,
                Some(reads),
                Some(writes),
            )
            .expect("ranges are non-empty")
        })
        .collect();
    let infos = (0..buffers)
        .map(|b| BufferInfo {
            id: b,
            bytes: buffer_bytes,
            name: format!("buf{b}"),
        })
        .collect();
    Synthetic {
        nodes: node_list,
        buffers: infos,
    }
}

/// Dimensions of a Llama-shaped step (SmolLM2-135M's by default).
#[derive(Clone, Copy, Debug)]
pub struct LlamaShape {
    pub layers: u32,
    pub tokens: u64,
    pub hidden: u64,
    pub ffn: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub vocab: u64,
    pub position: u64,
}

impl Default for LlamaShape {
    fn default() -> Self {
        Self {
            layers: 30,
            tokens: 1,
            hidden: 576,
            ffn: 1536,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            vocab: 49152,
            position: 0,
        }
    }
}

/// Builds buffers: a persistent set (weights, KV cache, residual) and a pool
/// whose per-layer scope hands out buffers in order and recycles them.
struct Builder {
    buffers: Vec<BufferInfo>,
    nodes: Vec<Node>,
    pool: Vec<u32>,
    pool_next: usize,
    layer: Option<u32>,
}

impl Builder {
    fn buffer(&mut self, name: String, bytes: u64) -> u32 {
        let id = self.buffers.len() as u32;
        self.buffers.push(BufferInfo { id, bytes, name });
        id
    }

    /// Next buffer of the current pool scope (a recycled one when available).
    fn pooled(&mut self, bytes: u64) -> ByteRange {
        let id = match self.pool.get(self.pool_next) {
            Some(&id) if self.buffers[id as usize].bytes >= bytes => id,
            _ => {
                let id = self.buffer(format!("pool{}", self.pool_next), bytes);
                if self.pool_next < self.pool.len() {
                    self.pool[self.pool_next] = id;
                } else {
                    self.pool.push(id);
                }
                id
            }
        };
        self.pool_next += 1;
        ByteRange::new(BufferId(id), 0, bytes)
    }

    fn end_scope(&mut self) {
        self.pool_next = 0;
    }

    fn node(
        &mut self,
        op: &'static str,
        label: &str,
        reads: Vec<ByteRange>,
        writes: Vec<ByteRange>,
    ) {
        let label = match self.layer {
            Some(l) => format!("blk.{l}.{label}"),
            None => label.to_string(),
        };
        let node = Node::checked(op, label.into(), self.layer, Some(reads), Some(writes))
            .expect("synthetic ranges are valid");
        self.nodes.push(node);
    }
}

/// One Llama-shaped step (prefill of `tokens` rows at `position`, or decode
/// when `tokens == 1`), with Q4_1-sized weights and an f16 KV cache.
pub fn llama_shape(shape: &LlamaShape) -> Synthetic {
    let f = 4u64;
    let t = shape.tokens.max(1);
    let q4 = |rows: u64, cols: u64| rows * cols / 32 * 20;
    let q8 = |rows: u64, cols: u64| rows * cols / 32 * 36;
    let kv_row = shape.kv_heads * shape.head_dim;
    let mut b = Builder {
        buffers: Vec::new(),
        nodes: Vec::new(),
        pool: Vec::new(),
        pool_next: 0,
        layer: None,
    };
    let weights_per_layer = q4(shape.hidden, shape.hidden) * 2
        + q4(kv_row, shape.hidden) * 2
        + q4(shape.ffn, shape.hidden) * 3
        + 2 * shape.hidden * f;
    let weight_bytes = weights_per_layer * shape.layers as u64
        + shape.vocab * shape.hidden / 32 * 34
        + shape.hidden * f;
    let weights = b.buffer("weights".into(), weight_bytes);
    let mut w_off = 0u64;
    let mut weight = |bytes: u64| {
        let r = ByteRange::new(BufferId(weights), w_off, w_off + bytes);
        w_off += bytes;
        r
    };
    let ctx = shape.position + t;
    let inputs = b.buffer("inputs".into(), t * 8);
    let ids = ByteRange::new(BufferId(inputs), 0, t * 4);
    let positions = ByteRange::new(BufferId(inputs), t * 4, t * 8);
    let residual = b.buffer("residual".into(), t * shape.hidden * f);
    let x = ByteRange::new(BufferId(residual), 0, t * shape.hidden * f);
    let embd = weight(shape.vocab * shape.hidden / 32 * 34);
    b.node("get_rows", "token_embd", vec![embd, ids], vec![x]);
    for l in 0..shape.layers {
        b.layer = Some(l);
        let k_cache = b.buffer(format!("k_cache.{l}"), ctx * kv_row * 2);
        let v_cache = b.buffer(format!("v_cache.{l}"), ctx * kv_row * 2);
        let (wn1, wq, wk, wv, wo) = (
            weight(shape.hidden * f),
            weight(q4(shape.hidden, shape.hidden)),
            weight(q4(kv_row, shape.hidden)),
            weight(q4(kv_row, shape.hidden)),
            weight(q4(shape.hidden, shape.hidden)),
        );
        let (wn2, wg, wu, wd) = (
            weight(shape.hidden * f),
            weight(q4(shape.ffn, shape.hidden)),
            weight(q4(shape.ffn, shape.hidden)),
            weight(q4(shape.hidden, shape.ffn)),
        );
        let h = b.pooled(t * shape.hidden * f);
        b.node("rms_norm", "attn_norm", vec![x, wn1], vec![h]);
        let hq = b.pooled(q8(t, shape.hidden));
        b.node("quantize", "attn_norm_q8", vec![h], vec![hq]);
        // Recorded in the order a model author writes it (each projection
        // followed by its rope); the pass, not the author, finds the overlap.
        let q = b.pooled(t * shape.hidden * f);
        b.node("matmul", "attn_q", vec![hq, wq], vec![q]);
        let qr = b.pooled(t * shape.hidden * f);
        b.node("rope", "rope_q", vec![q, positions], vec![qr]);
        let k = b.pooled(t * kv_row * f);
        b.node("matmul", "attn_k", vec![hq, wk], vec![k]);
        let kr = b.pooled(t * kv_row * f);
        b.node("rope", "rope_k", vec![k, positions], vec![kr]);
        let v = b.pooled(t * kv_row * f);
        b.node("matmul", "attn_v", vec![hq, wv], vec![v]);
        let rows = |base: u32| {
            ByteRange::new(
                BufferId(base),
                shape.position * kv_row * 2,
                ctx * kv_row * 2,
            )
        };
        b.node("set_rows", "k_cache_write", vec![kr], vec![rows(k_cache)]);
        b.node("set_rows", "v_cache_write", vec![v], vec![rows(v_cache)]);
        let a = b.pooled(t * shape.hidden * f);
        let kv_read = |base: u32| ByteRange::new(BufferId(base), 0, ctx * kv_row * 2);
        b.node(
            "attention",
            "attn",
            vec![qr, kv_read(k_cache), kv_read(v_cache)],
            vec![a],
        );
        let aq = b.pooled(q8(t, shape.hidden));
        b.node("quantize", "attn_out_q8", vec![a], vec![aq]);
        let o = b.pooled(t * shape.hidden * f);
        b.node("matmul", "attn_output", vec![aq, wo], vec![o]);
        b.node("add", "attn_residual", vec![x, o], vec![x]);
        let h2 = b.pooled(t * shape.hidden * f);
        b.node("rms_norm", "ffn_norm", vec![x, wn2], vec![h2]);
        let h2q = b.pooled(q8(t, shape.hidden));
        b.node("quantize", "ffn_norm_q8", vec![h2], vec![h2q]);
        let g = b.pooled(t * shape.ffn * f);
        let u = b.pooled(t * shape.ffn * f);
        b.node("matmul", "ffn_gate", vec![h2q, wg], vec![g]);
        b.node("matmul", "ffn_up", vec![h2q, wu], vec![u]);
        let s = b.pooled(t * shape.ffn * f);
        b.node("silu_mul", "ffn_silu_mul", vec![g, u], vec![s]);
        let sq = b.pooled(q8(t, shape.ffn));
        b.node("quantize", "ffn_down_q8", vec![s], vec![sq]);
        let d = b.pooled(t * shape.hidden * f);
        b.node("matmul", "ffn_down", vec![sq, wd], vec![d]);
        b.node("add", "ffn_residual", vec![x, d], vec![x]);
        b.end_scope();
    }
    b.layer = None;
    let wn = weight(shape.hidden * f);
    let last = ByteRange::new(
        BufferId(residual),
        (t - 1) * shape.hidden * f,
        t * shape.hidden * f,
    );
    let out_norm = b.pooled(shape.hidden * f);
    b.node("rms_norm", "output_norm", vec![last, wn], vec![out_norm]);
    let out_q = b.pooled(q8(1, shape.hidden));
    b.node("quantize", "output_q8", vec![out_norm], vec![out_q]);
    let logits = b.buffer("logits".into(), shape.vocab * f);
    b.node(
        "matmul",
        "output",
        vec![out_q, embd],
        vec![ByteRange::new(BufferId(logits), 0, shape.vocab * f)],
    );
    Synthetic {
        nodes: b.nodes,
        buffers: b.buffers,
    }
}
