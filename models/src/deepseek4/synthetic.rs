//! Synthetic DeepSeek-V4 GGUF files with the real tensor names, shapes,
//! types and `deepseek4.*` keys: a Flash-shaped 43-layer stack for schedule
//! figures and loader checks, and small random models with quantized
//! experts for end-to-end checks of the weight formats.
//!
//! A Flash-sized file with zero weights is written *sparse*: the header,
//! then the file length set to the full size. Nothing of the ~100 GB of
//! tensor data is allocated on disk or in memory; mapping it costs address
//! space only, and as long as nothing runs, no page is touched (record-only
//! schedules; loading with `widen_f16` off reads only the compressor biases).

use super::config::{Dsv4Config, GATING_SQRT_SOFTPLUS};
use crate::gguf::{Array, GgufWriter, Value};
use crate::ModelError;
use std::io::Write;
use std::path::Path;
use weft_graph::synth::SplitMix64;
use weft_ops::DType;
use weft_ops::YarnScaling;

/// DeepSeek-V4-Flash's hyper-parameters (HF `config.json`).
pub fn flash_config() -> Dsv4Config {
    let layers = 43;
    let mut ratios = vec![0, 0];
    while ratios.len() < layers {
        ratios.push(if ratios.len() % 2 == 0 { 4 } else { 128 });
    }
    Dsv4Config {
        layers,
        hidden: 4096,
        vocab: 129_280,
        heads: 64,
        head_dim: 512,
        rope_dims: 64,
        q_lora: 1024,
        out_groups: 8,
        out_rank: 1024,
        window: 128,
        ratios,
        rope_base: 10_000.0,
        compress_rope_base: 160_000.0,
        yarn: Some(YarnScaling {
            factor: 16.0,
            orig_ctx: 65_536,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }),
        indexer_heads: 64,
        indexer_dim: 128,
        indexer_top_k: 512,
        rms_eps: 1e-6,
        experts: 256,
        experts_used: 6,
        expert_ff: 2048,
        routed_scale: 1.5,
        weights_norm: true,
        hash_layers: 3,
        clamp_exp: vec![10.0; layers],
        clamp_shexp: vec![10.0; layers],
        hc: 4,
        sinkhorn_iters: 20,
        hc_eps: 1e-6,
        context: 1 << 20,
    }
}

/// Tensor types of a synthetic file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorTypes {
    /// Attention and shared-expert matrices, the output head (Q8_0 in real files).
    pub dense: DType,
    /// Mixers, compressors, indexer, router, embedding (F16 in real files).
    pub small: DType,
    /// Routed experts of layer `l`: `(gate, up, down)`, cycling over layers.
    pub experts: Vec<(DType, DType, DType)>,
}

impl TensorTypes {
    /// Types of a public low-bit Flash GGUF (experts cycle over IQ2_XXS,
    /// Q2_K, Q4_K and MXFP4 so every format appears).
    pub fn flash_gguf() -> TensorTypes {
        TensorTypes {
            dense: DType::Q8_0,
            small: DType::F16,
            experts: vec![
                (DType::IQ2_XXS, DType::IQ2_XXS, DType::Q2_K),
                (DType::Q2_K, DType::Q2_K, DType::Q4_K),
                (DType::MXFP4, DType::MXFP4, DType::MXFP4),
                (DType::Q4_K, DType::Q4_K, DType::Q4_K),
            ],
        }
    }
}

/// One tensor of the file: name, GGUF dims (ne0 first), type.
pub type TensorSpec = (String, Vec<u64>, DType);

/// Every tensor of a `deepseek4` file with config `c`, as the public GGUFs name them.
pub fn tensor_specs(c: &Dsv4Config, types: &TensorTypes) -> Vec<TensorSpec> {
    let (d, q, h, hd, hc) = (
        c.hidden as u64,
        c.q_lora as u64,
        c.heads as u64,
        c.head_dim as u64,
        c.hc as u64,
    );
    let (g, r, e, f) = (
        c.out_groups as u64,
        c.out_rank as u64,
        c.experts as u64,
        c.expert_ff as u64,
    );
    let (ih, id) = (c.indexer_heads as u64, c.indexer_dim as u64);
    let mix = c.mix() as u64;
    let mut out: Vec<TensorSpec> = Vec::new();
    let mut add = |name: String, dims: &[u64], dtype: DType| out.push((name, dims.to_vec(), dtype));
    add(
        "token_embd.weight".into(),
        &[d, c.vocab as u64],
        types.small,
    );
    for l in 0..c.layers {
        let n = |s: &str| format!("blk.{l}.{s}");
        for site in ["hc_attn", "hc_ffn"] {
            add(n(&format!("{site}_fn.weight")), &[hc * d, mix], types.small);
            add(n(&format!("{site}_scale.weight")), &[3], DType::F32);
            add(n(&format!("{site}_base.weight")), &[mix], DType::F32);
        }
        add(n("attn_norm.weight"), &[d], DType::F32);
        add(n("attn_q_a.weight"), &[d, q], types.dense);
        add(n("attn_q_a_norm.weight"), &[q], DType::F32);
        add(n("attn_q_b.weight"), &[q, h * hd], types.dense);
        add(n("attn_kv.weight"), &[d, hd], types.dense);
        add(n("attn_kv_a_norm.weight"), &[hd], DType::F32);
        add(n("attn_sinks.weight"), &[h], DType::F32);
        add(n("attn_output_a.weight"), &[h * hd / g, g * r], types.dense);
        add(n("attn_output_b.weight"), &[g * r, d], types.dense);
        let ratio = c.ratio(l) as u64;
        if ratio != 0 {
            let cw = hd * (1 + (ratio == 4) as u64);
            add(n("attn_compressor_ape.weight"), &[cw, ratio], types.small);
            add(n("attn_compressor_kv.weight"), &[d, cw], types.small);
            add(n("attn_compressor_gate.weight"), &[d, cw], types.small);
            add(n("attn_compressor_norm.weight"), &[hd], DType::F32);
        }
        if ratio == 4 {
            add(n("indexer.attn_q_b.weight"), &[q, ih * id], types.small);
            add(n("indexer.proj.weight"), &[d, ih], types.small);
            add(
                n("indexer_compressor_ape.weight"),
                &[2 * id, 4],
                types.small,
            );
            add(n("indexer_compressor_kv.weight"), &[d, 2 * id], types.small);
            add(
                n("indexer_compressor_gate.weight"),
                &[d, 2 * id],
                types.small,
            );
            add(n("indexer_compressor_norm.weight"), &[id], DType::F32);
        }
        add(n("ffn_norm.weight"), &[d], DType::F32);
        add(n("ffn_gate_inp.weight"), &[d, e], types.small);
        if c.is_hash_layer(l) {
            add(
                n("ffn_gate_tid2eid.weight"),
                &[c.experts_used as u64, c.vocab as u64],
                DType::I32,
            );
        } else {
            add(n("exp_probs_b.bias"), &[e], DType::F32);
        }
        let (tg, tu, td) = types.experts[l % types.experts.len().max(1)];
        add(n("ffn_gate_exps.weight"), &[d, f, e], tg);
        add(n("ffn_up_exps.weight"), &[d, f, e], tu);
        add(n("ffn_down_exps.weight"), &[f, d, e], td);
        add(n("ffn_gate_shexp.weight"), &[d, f], types.dense);
        add(n("ffn_up_shexp.weight"), &[d, f], types.dense);
        add(n("ffn_down_shexp.weight"), &[f, d], types.dense);
    }
    add("output_hc_fn.weight".into(), &[hc * d, hc], types.small);
    add("output_hc_scale.weight".into(), &[1], DType::F32);
    add("output_hc_base.weight".into(), &[hc], DType::F32);
    add("output_norm.weight".into(), &[d], DType::F32);
    add("output.weight".into(), &[d, c.vocab as u64], types.dense);
    out
}

/// The `deepseek4.*` metadata of config `c` (compress ratios with one more
/// entry, for the MTP block, as real Flash files have).
pub fn metadata(w: &mut GgufWriter<'_>, c: &Dsv4Config, name: &str) -> Result<(), ModelError> {
    w.set("general.architecture", "deepseek4")?;
    w.set("general.name", name)?;
    let u = |v: usize| Value::U32(v as u32);
    let mut ratios = c.ratios.clone();
    ratios.push(0);
    let entries: Vec<(&str, Value)> = vec![
        ("block_count", u(c.layers)),
        ("context_length", Value::U32(c.context)),
        ("embedding_length", u(c.hidden)),
        ("vocab_size", u(c.vocab)),
        ("attention.head_count", u(c.heads)),
        ("attention.head_count_kv", u(1)),
        ("attention.key_length", u(c.head_dim)),
        ("attention.value_length", u(c.head_dim)),
        ("rope.dimension_count", u(c.rope_dims)),
        ("attention.q_lora_rank", u(c.q_lora)),
        ("attention.output_lora_rank", u(c.out_rank)),
        ("attention.output_group_count", u(c.out_groups)),
        ("attention.sliding_window", Value::U32(c.window)),
        (
            "attention.compress_ratios",
            Value::Array(Array::U32(ratios)),
        ),
        (
            "attention.compress_rope_freq_base",
            Value::F32(c.compress_rope_base),
        ),
        ("attention.indexer.head_count", u(c.indexer_heads)),
        ("attention.indexer.key_length", u(c.indexer_dim)),
        ("attention.indexer.top_k", u(c.indexer_top_k)),
        ("attention.layer_norm_rms_epsilon", Value::F32(c.rms_eps)),
        ("rope.freq_base", Value::F32(c.rope_base)),
        ("expert_count", u(c.experts)),
        ("expert_used_count", u(c.experts_used)),
        ("expert_shared_count", u(1)),
        ("expert_feed_forward_length", u(c.expert_ff)),
        ("expert_group_count", u(0)),
        ("expert_group_used_count", u(0)),
        ("expert_gating_func", Value::U32(GATING_SQRT_SOFTPLUS)),
        ("expert_weights_scale", Value::F32(c.routed_scale)),
        ("expert_weights_norm", Value::Bool(c.weights_norm)),
        ("hash_layer_count", u(c.hash_layers)),
        (
            "swiglu_clamp_exp",
            Value::Array(Array::F32(c.clamp_exp.clone())),
        ),
        (
            "swiglu_clamp_shexp",
            Value::Array(Array::F32(c.clamp_shexp.clone())),
        ),
        ("hyper_connection.count", u(c.hc)),
        ("hyper_connection.sinkhorn_iterations", u(c.sinkhorn_iters)),
        ("hyper_connection.epsilon", Value::F32(c.hc_eps)),
        ("nextn_predict_layers", u(1)),
    ];
    for (k, v) in entries {
        w.set(format!("deepseek4.{k}"), v)?;
    }
    if let Some(y) = c.yarn {
        w.set("deepseek4.rope.scaling.type", "yarn")?;
        w.set("deepseek4.rope.scaling.factor", y.factor)?;
        w.set("deepseek4.rope.scaling.original_context_length", y.orig_ctx)?;
        w.set("deepseek4.rope.scaling.yarn_beta_fast", y.beta_fast)?;
        w.set("deepseek4.rope.scaling.yarn_beta_slow", y.beta_slow)?;
    }
    tokenizer(w, c.vocab)
}

/// A synthetic GPT-2 vocabulary of `vocab` entries, as the tiny fixtures
/// have (runs take token ids; the keys let every loader build a
/// tokenizer): DeepSeek's 8 special strings (control), the 256 byte
/// symbols, then unused placeholders; no merges.
fn tokenizer(w: &mut GgufWriter<'_>, vocab: usize) -> Result<(), ModelError> {
    const SPECIALS: [&str; 8] = [
        "<\u{ff5c}begin\u{2581}of\u{2581}sentence\u{ff5c}>",
        "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
        "<\u{ff5c}User\u{ff5c}>",
        "<\u{ff5c}Assistant\u{ff5c}>",
        "<think>",
        "</think>",
        "\u{ff5c}DSML\u{ff5c}",
        "<\u{ff5c}\u{2581}pad\u{2581}\u{ff5c}>",
    ];
    // GPT-2's byte symbols: printable bytes stand for themselves, the
    // others for 256, 257, ... in byte order.
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut next = 256;
    let mut tokens: Vec<String> = SPECIALS.iter().map(|t| t.to_string()).collect();
    let mut types = vec![3i32; SPECIALS.len()];
    for b in 0..256u32 {
        let code = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        tokens.push(char::from_u32(code).map_or_else(String::new, String::from));
        types.push(1);
    }
    while tokens.len() < vocab {
        tokens.push(format!("<unused{}>", tokens.len()));
        types.push(5);
    }
    tokens.truncate(vocab.max(1));
    types.truncate(tokens.len());
    w.set("tokenizer.ggml.model", "gpt2")?;
    w.set("tokenizer.ggml.pre", "default")?;
    w.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))?;
    w.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))?;
    w.set(
        "tokenizer.ggml.merges",
        Value::Array(Array::String(Vec::new())),
    )?;
    w.set("tokenizer.ggml.bos_token_id", Value::U32(0))?;
    w.set("tokenizer.ggml.eos_token_id", Value::U32(1))?;
    w.set("tokenizer.ggml.padding_token_id", Value::U32(7))?;
    w.set("tokenizer.ggml.add_bos_token", Value::Bool(false))?;
    Ok(())
}

/// Keeps the first `limit` bytes written and counts the rest.
struct Prefix {
    bytes: Vec<u8>,
    limit: usize,
    total: u64,
}

impl Write for Prefix {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.limit.saturating_sub(self.bytes.len());
        self.bytes.extend_from_slice(&buf[..room.min(buf.len())]);
        self.total += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes a file of config `c` with zero weights at `path`, sparse (see
/// the module docs); returns its size in bytes.
pub fn write_sparse(path: &Path, c: &Dsv4Config, types: &TensorTypes) -> Result<u64, ModelError> {
    let specs = tensor_specs(c, types);
    let sizes: Vec<usize> = specs
        .iter()
        .map(|(_, dims, dtype)| {
            let row = dtype.row_bytes(dims[0] as usize).unwrap_or(0);
            row * dims[1..].iter().product::<u64>() as usize
        })
        .collect();
    // One zeroed allocation, never touched: the tensors borrow from it.
    let zeros = vec![0u8; sizes.iter().copied().max().unwrap_or(0)];
    let mut w = GgufWriter::new();
    metadata(&mut w, c, "deepseek4 synthetic (zero weights)")?;
    for ((name, dims, dtype), &size) in specs.iter().zip(&sizes) {
        w.add_tensor(name.clone(), dims, *dtype, &zeros[..size])?;
    }
    // Everything after the header is zeros: keep the header, then set the length.
    let mut prefix = Prefix {
        bytes: Vec::new(),
        limit: 64 << 20,
        total: 0,
    };
    w.write_to(&mut prefix)?;
    let io = |e: std::io::Error| ModelError::Input(format!("writing {}: {e}", path.display()));
    let mut file = std::fs::File::create(path).map_err(io)?;
    file.write_all(&prefix.bytes).map_err(io)?;
    file.set_len(prefix.total).map_err(io)?;
    Ok(prefix.total)
}

/// Uniform in [-1, 1), for random weights.
fn uniform(rng: &mut SplitMix64) -> f32 {
    (rng.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// Random bytes for one tensor: values `scale * uniform` encoded in `dtype`
/// (IQ2_XXS, which weft does not quantize, gets random blocks).
fn random_tensor(
    rng: &mut SplitMix64,
    name: &str,
    dims: &[u64],
    dtype: DType,
    scale: f32,
    experts: usize,
) -> Result<Vec<u8>, ModelError> {
    let cols = dims[0] as usize;
    let rows: usize = dims[1..].iter().product::<u64>() as usize;
    let row_bytes = dtype.row_bytes(cols).ok_or_else(|| {
        ModelError::Shape(format!(
            "{name}: {cols} values are not whole {dtype} blocks"
        ))
    })?;
    let mut out = vec![0u8; rows * row_bytes];
    match dtype {
        DType::I32 => {
            // Distinct experts per row: consecutive ids from a random start.
            for row in out.chunks_exact_mut(4 * cols) {
                let start = ((uniform(rng) + 1.0) * 1000.0) as usize;
                for (j, v) in row.chunks_exact_mut(4).enumerate() {
                    v.copy_from_slice(&(((start + j) % experts.max(1)) as i32).to_le_bytes());
                }
            }
        }
        DType::IQ2_XXS => {
            for block in out.chunks_exact_mut(66) {
                let d = half::f16::from_f32(scale * 0.08 * (1.5 + uniform(rng)));
                block[..2].copy_from_slice(&d.to_le_bytes());
                for b in &mut block[2..] {
                    *b = ((uniform(rng) + 1.0) * 128.0) as u8;
                }
            }
        }
        _ => {
            let mut values = vec![0f32; cols];
            for row in out.chunks_exact_mut(row_bytes) {
                values.iter_mut().for_each(|v| *v = uniform(rng) * scale);
                weft_ops::quant::quantize_row(dtype, &values, row)?;
            }
        }
    }
    Ok(out)
}

/// The value scale and offset of a tensor's random values, by its name
/// (norm weights near 1, sinks near 1.5, mixer scales near 1).
fn value_scale(name: &str, fan_in: f32) -> (f32, f32) {
    if name.ends_with("norm.weight") {
        (0.1, 1.0)
    } else if name.contains("sinks") {
        (1.0, 1.5)
    } else if name.contains("_scale") {
        (0.2, 1.0)
    } else if name.contains("_base") || name.contains("ape") || name.contains("exp_probs") {
        (0.3, 0.0)
    } else {
        (1.7 / fan_in.sqrt(), 0.0)
    }
}

/// Random bytes of one named tensor: [`random_tensor`] with the name's
/// scale and offset.
fn random_named(
    rng: &mut SplitMix64,
    name: &str,
    dims: &[u64],
    dtype: DType,
    experts: usize,
) -> Result<Vec<u8>, ModelError> {
    let (scale, offset) = value_scale(name, dims[0] as f32);
    let mut bytes = random_tensor(rng, name, dims, dtype, scale, experts)?;
    if offset != 0.0 && dtype == DType::F32 {
        for v in bytes.chunks_exact_mut(4) {
            let x = f32::from_le_bytes([v[0], v[1], v[2], v[3]]) + offset;
            v.copy_from_slice(&x.to_le_bytes());
        }
    }
    Ok(bytes)
}

/// A small model with random weights of the given types, as GGUF bytes
/// (norm weights near 1, sinks near 1.5; experts with 8 ids per hash row).
pub fn random_gguf(c: &Dsv4Config, types: &TensorTypes, seed: u64) -> Result<Vec<u8>, ModelError> {
    let mut rng = SplitMix64::new(seed);
    let specs = tensor_specs(c, types);
    let mut data = Vec::with_capacity(specs.len());
    for (name, dims, dtype) in &specs {
        data.push(random_named(&mut rng, name, dims, *dtype, c.experts)?);
    }
    let mut w = GgufWriter::new();
    metadata(&mut w, c, "deepseek4 synthetic (random weights)")?;
    for ((name, dims, dtype), bytes) in specs.iter().zip(data) {
        w.add_tensor(name.clone(), dims, *dtype, bytes)?;
    }
    Ok(w.to_bytes()?)
}

/// Writes a model of config `c` with random weights at `path`, cheaply
/// enough for full-size shapes (benchmarks): each distinct tensor (name
/// without its layer, dims, type) is generated once and shared by every
/// layer, and only its first `tile_rows` rows are random, repeated to fill
/// it. Every byte is still a distinct address the kernels read, so the
/// traffic of a step is the real one; routing stays input-dependent.
/// Returns the file's size in bytes.
pub fn write_random_tiled(
    path: &Path,
    c: &Dsv4Config,
    types: &TensorTypes,
    seed: u64,
    tile_rows: usize,
) -> Result<u64, ModelError> {
    use std::collections::HashMap;
    let specs = tensor_specs(c, types);
    let key = |name: &str, dims: &[u64], dtype: DType| {
        let base = match name.strip_prefix("blk.") {
            Some(rest) => rest.split_once('.').map_or(rest, |(_, tail)| tail),
            None => name,
        };
        format!("{base}:{dims:?}:{dtype}")
    };
    let mut rng = SplitMix64::new(seed);
    let mut data: HashMap<String, Vec<u8>> = HashMap::new();
    for (name, dims, dtype) in &specs {
        let k = key(name, dims, *dtype);
        if data.contains_key(&k) {
            continue;
        }
        let rows = dims[1..].iter().product::<u64>() as usize;
        let tile = rows.min(tile_rows.max(1));
        let tile_dims = if tile == rows {
            dims.clone()
        } else {
            vec![dims[0], tile as u64]
        };
        let proto = random_named(&mut rng, name, &tile_dims, *dtype, c.experts)?;
        let mut bytes = proto.repeat(rows.div_ceil(tile));
        bytes.truncate(proto.len() / tile * rows);
        data.insert(k, bytes);
    }
    let mut w = GgufWriter::new();
    metadata(&mut w, c, "deepseek4 synthetic (random tiled weights)")?;
    for (name, dims, dtype) in &specs {
        let bytes = &data[&key(name, dims, *dtype)];
        w.add_tensor(name.clone(), dims, *dtype, bytes.as_slice())?;
    }
    let io = |e: std::io::Error| ModelError::Input(format!("writing {}: {e}", path.display()));
    let file = std::fs::File::create(path).map_err(io)?;
    let mut out = std::io::BufWriter::with_capacity(8 << 20, file);
    w.write_to(&mut out).map_err(|e| match e {
        crate::gguf::GgufError::Io { source, .. } => io(source),
        other => other.into(),
    })?;
    out.flush().map_err(io)?;
    let len = out.get_ref().metadata().map_err(io)?.len();
    Ok(len)
}
