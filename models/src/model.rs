//! A loaded model of any supported family, with its tokenizer, and the
//! operations every front end needs: a cache, chunked prefill, decode steps.
//!
//! Loading refuses a file whose metadata and tensors disagree: every tensor
//! must be taken by the family (or be one it knows it does not run), and
//! the tokenizer, the embedding and the output must have one vocabulary.

use crate::deepseek4::{DeepSeek4, Dsv4Config};
use crate::finite::LayerProbe;
use crate::gemma3::Gemma3;
use crate::gguf::GgufFile;
use crate::hparams::block_of;
use crate::identity::GgufDigest;
use crate::llama::{Llama, LlamaArch};
use crate::step::LogitRows;
use crate::tokenizer::Tokenizer;
use crate::weights::WeightMap;
use crate::ModelError;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::sync::OnceLock;
use weft_ops::Tensor;
use weft_runtime::cache::CacheSpan;
use weft_runtime::cache::{run_step, CacheConfig, ChunkPolicy, KvCache};
use weft_runtime::{GraphExecutor, GraphSession};

/// Called after each prefill chunk with the positions it covered.
pub type AfterChunk<'a> =
    dyn FnMut(&mut GraphExecutor, std::ops::Range<u32>) -> Result<(), ModelError> + 'a;

/// The architectures weft runs.
pub enum Family {
    /// The architectures of the Llama pass (`llama`, `qwen2`, `qwen3`,
    /// `qwen3moe`, `phi3`; [`LlamaArch`]): one forward pass.
    Llama(Llama),
    /// Gemma 3 (`gemma3`): interleaved sliding-window and global layers.
    Gemma3(Gemma3),
    /// DeepSeek-V4 (`deepseek4`): hyper-connections, compressed attention, MoE.
    DeepSeek4(Box<DeepSeek4>),
}

/// A model ready to run on one executor.
pub struct Model {
    pub file: GgufFile,
    pub tokenizer: Tokenizer,
    pub family: Family,
    /// `general.architecture`.
    pub arch: String,
    /// `general.name`, or the file name.
    pub name: String,
    /// The file's digest, hashed on first use (`Model::gguf_digest`).
    pub(crate) digest: OnceLock<GgufDigest>,
    /// Sum every layer's output and fail a step whose sums are not finite
    /// ([`Model::set_check_finite`]).
    check_finite: AtomicBool,
    /// Rows of ones of the finiteness sums, by width.
    ones: Mutex<Vec<Tensor>>,
}

impl Model {
    /// Opens `path`, maps its weights into `exec` and builds its tokenizer.
    pub fn load(path: &Path, exec: &mut GraphExecutor) -> Result<Model, ModelError> {
        let file = GgufFile::open(path)?;
        let file_name = path
            .file_name()
            .map_or_else(|| "model".into(), |f| f.to_string_lossy().into_owned());
        Model::from_file(file, &file_name, exec)
    }

    /// A model from a GGUF file already open (or built in memory, as
    /// [`GgufFile::from_bytes`] does), mapped into `exec`; `fallback_name`
    /// names it when the file has no `general.name`.
    pub fn from_file(
        file: GgufFile,
        fallback_name: &str,
        exec: &mut GraphExecutor,
    ) -> Result<Model, ModelError> {
        let arch = file.architecture()?.to_string();
        let weights = WeightMap::new(&file, exec)?;
        let family = match (LlamaArch::from_name(&arch), arch.as_str()) {
            (Some(a), _) => {
                let mut m = Llama::load(&weights, a)?;
                m.flash_attention = a.flash_attention(exec.device());
                Family::Llama(m)
            }
            (None, "gemma3") => Family::Gemma3(Gemma3::load(&weights)?),
            (None, "deepseek4") => {
                let options = crate::deepseek4::LoadOptions::for_numerics(exec.config().numerics);
                Family::DeepSeek4(Box::new(DeepSeek4::load(&weights, exec, options)?))
            }
            (None, other) => {
                return Err(ModelError::Unsupported(format!(
                    "architecture `{other}` (weft runs: {})",
                    runnable_architectures().join(", ")
                )))
            }
        };
        check_backend(&family, exec.device())?;
        check_all_tensors_used(&weights, &family, &arch)?;
        drop(weights);
        let tokenizer = Tokenizer::from_gguf(&file)?;
        check_vocab(&tokenizer, &family)?;
        let name = match file.get_str("general.name")? {
            Some(n) => n.to_string(),
            None => fallback_name.to_string(),
        };
        Ok(Model {
            file,
            tokenizer,
            family,
            arch,
            name,
            digest: OnceLock::new(),
            check_finite: AtomicBool::new(false),
            ones: Mutex::new(Vec::new()),
        })
    }

    /// Turns the per-layer finiteness check on or off: when on, every step
    /// also sums each layer's output rows (one dot product per row and
    /// layer) and fails, naming the first layer whose output is NaN or
    /// infinite. Off, only the logits are checked.
    pub fn set_check_finite(&self, on: bool) {
        self.check_finite.store(on, Ordering::Relaxed);
    }

    /// Whether the per-layer finiteness check is on.
    pub fn check_finite(&self) -> bool {
        self.check_finite.load(Ordering::Relaxed)
    }

    /// A row of ones `f32 [1, width]` on `exec`.
    pub(crate) fn ones(
        &self,
        exec: &mut GraphExecutor,
        width: usize,
    ) -> Result<Tensor, ModelError> {
        crate::finite::ones(exec, &self.ones, width)
    }

    /// The per-layer probe of a step of `rows` rows when the check is on;
    /// `tag` tells apart the probes of steps in flight together.
    pub(crate) fn layer_probe(
        &self,
        exec: &mut GraphExecutor,
        tag: &str,
        rows: usize,
    ) -> Result<Option<LayerProbe>, ModelError> {
        if !self.check_finite() {
            return Ok(None);
        }
        let width = self.family.arch().residual_width();
        LayerProbe::new(exec, &self.ones, tag, self.layers(), rows, width).map(Some)
    }

    /// Context length the model was trained for.
    pub fn trained_context(&self) -> u32 {
        self.family.arch().trained_context()
    }

    /// Vocabulary size of the output layer.
    pub fn vocab(&self) -> usize {
        self.family.arch().vocab()
    }

    /// Transformer layers.
    pub fn layers(&self) -> usize {
        self.family.arch().layers()
    }

    /// Bytes of weights.
    pub fn weight_bytes(&self) -> u64 {
        self.file.tensors().iter().map(|t| t.bytes).sum()
    }

    /// Bytes of weights one decode step reads: every tensor but the token
    /// embedding table (a step reads one row of it) unless the output head
    /// shares it. `None` for a mixture of experts, whose step reads only
    /// its routed experts.
    pub fn decode_weight_bytes(&self) -> Option<u64> {
        let tensors = self.file.tensors();
        if tensors.iter().any(|t| t.name.contains("_exps")) {
            return None;
        }
        let tied = !tensors.iter().any(|t| t.name == "output.weight");
        Some(
            tensors
                .iter()
                .filter(|t| tied || t.name != "token_embd.weight")
                .map(|t| t.bytes)
                .sum(),
        )
    }

    /// The chunking policy hf2q uses for this model.
    pub fn chunk_policy(&self) -> ChunkPolicy {
        ChunkPolicy::for_model(self.family.arch().chunk_window(), self.weight_bytes())
    }

    /// The cache layout for `context` tokens.
    pub fn cache_config(&self, context: u32, max_chunk: u32) -> CacheConfig {
        self.family.arch().cache_config(context, max_chunk)
    }

    /// A fresh cache for `context` tokens, taking steps of up to `max_chunk`.
    pub fn new_cache(
        &self,
        exec: &mut GraphExecutor,
        context: u32,
        max_chunk: u32,
    ) -> Result<KvCache, ModelError> {
        Ok(KvCache::new(exec, self.cache_config(context, max_chunk))?)
    }

    /// One step (one transaction) over `tokens` at the cache's position.
    pub fn step(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        tokens: &[u32],
        rows: LogitRows,
    ) -> Result<Vec<f32>, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::Input("a step needs at least one token".into()));
        }
        let n =
            u32::try_from(tokens.len()).map_err(|_| ModelError::Input("too many tokens".into()))?;
        let start = cache.position();
        let probe = self.layer_probe(exec, "step", tokens.len())?;
        let logits = run_step(exec, cache, n, |s, c, span| {
            self.record_tokens(s, c, span, tokens, rows, probe.as_ref())
        })?;
        let hint = crate::finite::logits_hint(probe.is_some());
        let checked = match &probe {
            Some(p) => p.check(exec, start),
            None => Ok(()),
        }
        .and_then(|()| {
            crate::finite::check_logits(&logits, hint, || {
                format!("the logits of the step at position {start}")
            })
        });
        if let Err(e) = checked {
            cache.poison(&e.to_string());
            return Err(e);
        }
        Ok(logits)
    }

    /// Records one step over `tokens` at `span` into `session` without
    /// running it (diagnostics: graph dumps); returns the logits tensor.
    pub fn record(
        &self,
        session: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        tokens: &[u32],
        rows: LogitRows,
    ) -> Result<Tensor, ModelError> {
        self.record_tokens(session, cache, span, tokens, rows, None)
    }

    /// [`Model::record`], summing each layer's output into `probe`.
    fn record_tokens(
        &self,
        s: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        tokens: &[u32],
        rows: LogitRows,
        probe: Option<&LayerProbe>,
    ) -> Result<Tensor, ModelError> {
        self.family
            .arch()
            .record_tokens(s, cache, span, tokens, rows, probe)
    }

    /// [`Model::record`] over token ids already on the device (`ids`: i32,
    /// one per token of the span, inside the vocabulary). DeepSeek-V4
    /// takes one token per step this way (decoding).
    pub fn record_ids(
        &self,
        session: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        ids: Tensor,
        rows: LogitRows,
    ) -> Result<Tensor, ModelError> {
        self.record_ids_probed(session, cache, span, ids, rows, None)
    }

    /// [`Model::record_ids`], summing each layer's output into `probe`.
    pub(crate) fn record_ids_probed(
        &self,
        session: &mut GraphSession<'_>,
        cache: &KvCache,
        span: &CacheSpan,
        ids: Tensor,
        rows: LogitRows,
        probe: Option<&LayerProbe>,
    ) -> Result<Tensor, ModelError> {
        self.family
            .arch()
            .record_ids(session, cache, span, ids, rows, probe)
    }

    /// Whether steps can take their token ids from the device
    /// ([`Model::record_ids`], [`Model::decode_greedy`]).
    pub fn feeds_ids_on_device(&self) -> bool {
        true
    }

    /// Rows of the token embedding (ids at or past it cannot be embedded).
    pub fn embedding_rows(&self) -> usize {
        self.family.arch().embedding_rows()
    }

    /// Prefills `tokens` in chunks (`policy`), each its own transaction, and
    /// returns the logits: of the last token, or of every token.
    pub fn prefill(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        tokens: &[u32],
        policy: &ChunkPolicy,
        rows: LogitRows,
    ) -> Result<Vec<f32>, ModelError> {
        self.prefill_with(exec, cache, tokens, policy, rows, &mut |_, _| Ok(()))
    }

    /// [`prefill`](Self::prefill), calling `after_chunk(exec, positions)`
    /// after each chunk's transaction (diagnostics: tensor dumps, progress).
    pub fn prefill_with(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        tokens: &[u32],
        policy: &ChunkPolicy,
        rows: LogitRows,
        after_chunk: &mut AfterChunk<'_>,
    ) -> Result<Vec<f32>, ModelError> {
        let needed = cache.position() as u64 + tokens.len() as u64;
        if needed > cache.config().context as u64 {
            return Err(ModelError::Input(format!(
                "the prompt of {} tokens does not fit: the context holds {} tokens and {} are already used",
                tokens.len(),
                cache.config().context,
                cache.position()
            )));
        }
        let mut out = Vec::new();
        let mut done = 0usize;
        let max = cache.config().max_chunk;
        while done < tokens.len() {
            let n = policy
                .next_chunk((tokens.len() - done) as u32, cache.position())
                .min(max) as usize;
            let start = cache.position();
            let logits = self.step(exec, cache, &tokens[done..done + n], rows)?;
            match rows {
                LogitRows::All => out.extend(logits),
                LogitRows::Last => out = logits,
                LogitRows::From(p) => {
                    // Drop rows of positions before `p` (a step before it returns its last row).
                    let returned = n - rows.first_row(start, n);
                    let wanted = (start as usize + n)
                        .saturating_sub(p as usize)
                        .min(returned);
                    let vocab = logits.len() / returned.max(1);
                    out.extend_from_slice(&logits[(returned - wanted) * vocab..]);
                }
            }
            after_chunk(exec, start..start + n as u32)?;
            done += n;
        }
        Ok(out)
    }
}

/// Every `general.architecture` weft runs, in the order messages list them.
pub fn runnable_architectures() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = LlamaArch::ALL.iter().map(|a| a.name()).collect();
    names.extend(["gemma3", "deepseek4"]);
    names
}

/// Refuses, at load, a feature of the model whose op only the CPU backend
/// implements (the others would refuse it at the first step).
fn check_backend(family: &Family, device: weft_runtime::Device) -> Result<(), ModelError> {
    if device == weft_runtime::Device::Cpu {
        return Ok(());
    }
    if let Family::Llama(m) = family {
        if m.rope_factors.is_some() || m.long_rope.is_some() {
            return Err(ModelError::Unsupported(format!(
                "rope frequency factors (rope_freqs.weight, Llama 3 rope scaling) on {device:?}: \
                 only the CPU backend implements them"
            )));
        }
        if m.arch.moe() {
            return Err(ModelError::Unsupported(format!(
                "softmax-routed experts ({}) on {device:?}: only the CPU backend implements \
                 their routing",
                m.arch.name()
            )));
        }
    }
    Ok(())
}

/// Refuses a tensor the family did not take, unless it is one the family
/// knows it does not run (DeepSeek-V4's multi-token-prediction blocks).
fn check_all_tensors_used(
    weights: &WeightMap<'_>,
    family: &Family,
    arch: &str,
) -> Result<(), ModelError> {
    let (layers, skipped) = match family {
        Family::Llama(m) => (m.config.layers, 0),
        Family::Gemma3(m) => (m.config.layers, 0),
        Family::DeepSeek4(m) => {
            let layers = m.config.layers;
            (layers, Dsv4Config::mtp_blocks(weights.file(), layers)?)
        }
    };
    let Some(t) = weights
        .unused()
        .into_iter()
        .find(|t| !block_of(&t.name).is_some_and(|b| (layers..layers + skipped).contains(&b)))
    else {
        return Ok(());
    };
    let why = match block_of(&t.name) {
        Some(b) if b >= layers => {
            format!("it belongs to block {b}, but `{arch}.block_count` is {layers}")
        }
        _ => "the file holds a tensor of a feature weft does not implement, or one too many"
            .to_string(),
    };
    Err(ModelError::UnusedTensor {
        name: t.name.clone(),
        arch: arch.to_string(),
        why,
    })
}

/// The tokenizer, the token embedding and the output projection must
/// agree on the vocabulary.
fn check_vocab(tokenizer: &Tokenizer, family: &Family) -> Result<(), ModelError> {
    let (embedding, output) = match family {
        Family::Llama(m) => (m.token_embd.rows(), m.output.rows()),
        Family::Gemma3(m) => (m.token_embd.rows(), m.output.rows()),
        Family::DeepSeek4(m) => (m.weights.token_embd.rows(), m.weights.output.rows()),
    };
    let tokens = tokenizer.n_tokens();
    if tokens != embedding || embedding != output {
        return Err(ModelError::Shape(format!(
            "the vocabulary disagrees: tokenizer.ggml.tokens has {tokens} tokens, token_embd.weight {embedding} rows, the output projection {output} rows"
        )));
    }
    Ok(())
}
