//! Running DeepSeek-V4 steps as cache transactions: one step (prefill chunk
//! or decode token), chunked prefill with hf2q's chunk rule, and B-lane
//! cohort decode with all-or-nothing publication through a commit gate.

use super::cache::CacheLayout;
use super::DeepSeek4;
use crate::step::LogitRows;
use crate::ModelError;
use weft_runtime::cache::{run_step, ChunkPolicy, Cohort, CohortSpan, KvCache};
use weft_runtime::{GraphExecutor, RuntimeError};

impl DeepSeek4 {
    /// The cache layout for `context` tokens and steps of up to `max_chunk`.
    pub fn cache_layout(&self, context: u32, max_chunk: u32) -> CacheLayout {
        CacheLayout::new(&self.config, context, max_chunk)
    }

    /// A fresh cache (every layer's window, compressor state and row tables).
    pub fn new_cache(
        &self,
        exec: &mut GraphExecutor,
        context: u32,
        max_chunk: u32,
    ) -> Result<KvCache, ModelError> {
        Ok(KvCache::new(
            exec,
            self.cache_layout(context, max_chunk).kv,
        )?)
    }

    /// hf2q's chunking for this model (window `W`, 32 or 16 windows).
    pub fn chunk_policy(&self, weight_bytes: u64) -> ChunkPolicy {
        ChunkPolicy::for_model(Some(self.config.window), weight_bytes)
    }

    fn check_cache(&self, cache: &KvCache) -> Result<(), ModelError> {
        let want = self.cache_layout(cache.config().context, cache.config().max_chunk);
        if cache.config() != &want.kv {
            return Err(ModelError::Input(
                "deepseek4: the cache was not built for this model (use DeepSeek4::new_cache or Model::new_cache)".into(),
            ));
        }
        Ok(())
    }

    /// One step (one transaction) of `tokens` at the cache's position.
    pub fn step(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        tokens: &[u32],
        rows: LogitRows,
    ) -> Result<Vec<f32>, ModelError> {
        self.check_cache(cache)?;
        let n = u32::try_from(tokens.len())
            .map_err(|_| ModelError::Input("too many tokens for one step".into()))?;
        if n == 0 {
            return Err(ModelError::Input("a step needs at least one token".into()));
        }
        let start = cache.position();
        let logits = run_step(exec, cache, n, |s, kv, span| {
            self.record_step(s, &[kv], span.start, tokens, rows)
        })?;
        if let Err(e) = crate::finite::check_logits(&logits, crate::finite::LOGITS_HINT, || {
            format!("the logits of the step at position {start}")
        }) {
            cache.poison(&e.to_string());
            return Err(e);
        }
        Ok(logits)
    }

    /// Prefills `tokens` in chunks (`policy`, capped by the cache's chunk
    /// size), each its own transaction; returns the logits per `rows`.
    pub fn prefill(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        tokens: &[u32],
        policy: &ChunkPolicy,
        rows: LogitRows,
    ) -> Result<Vec<f32>, ModelError> {
        let end = cache.position() as u64 + tokens.len() as u64;
        if end > cache.config().context as u64 {
            return Err(ModelError::Input(format!(
                "deepseek4: {} tokens at position {} exceed the context of {}",
                tokens.len(),
                cache.position(),
                cache.config().context
            )));
        }
        let mut out = Vec::new();
        let mut done = 0usize;
        while done < tokens.len() {
            let n = policy
                .next_chunk((tokens.len() - done) as u32, cache.position())
                .min(cache.config().max_chunk) as usize;
            let logits = self.step(exec, cache, &tokens[done..done + n], rows)?;
            match rows {
                LogitRows::Last => out = logits,
                _ => out.extend(logits),
            }
            done += n;
        }
        Ok(out)
    }

    /// Greedy decoding of `count` tokens after `first` (fed at the cache's
    /// position); returns the tokens chosen and each step's logits.
    pub fn greedy(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        first: u32,
        count: usize,
    ) -> Result<(Vec<u32>, Vec<Vec<f32>>), ModelError> {
        let (mut tokens, mut all) = (Vec::with_capacity(count), Vec::with_capacity(count));
        let mut next = first;
        for _ in 0..count {
            let logits = self.step(exec, cache, &[next], LogitRows::Last)?;
            next = crate::sampling::argmax(&logits) as u32;
            tokens.push(next);
            all.push(logits);
        }
        Ok((tokens, all))
    }

    /// One cohort decode step: token `b` for lane `b`, every lane at the
    /// same position, published all together (after `gate` accepts the
    /// logits `[B, V]`, which must be finite) or not at all (every lane
    /// poisoned).
    pub fn cohort_step(
        &self,
        exec: &mut GraphExecutor,
        lanes: Vec<&mut KvCache>,
        tokens: &[u32],
        gate: impl FnOnce(&CohortSpan, &[f32]) -> Result<(), String>,
    ) -> Result<Vec<f32>, ModelError> {
        if lanes.len() != tokens.len() {
            return Err(ModelError::Input(format!(
                "deepseek4: {} tokens for a cohort of {} lanes",
                tokens.len(),
                lanes.len()
            )));
        }
        for lane in &lanes {
            self.check_cache(lane)?;
        }
        let mut cohort = Cohort::new(lanes)?;
        // Logits that are not finite are never published.
        let gate = |plan: &CohortSpan, logits: &[f32]| {
            crate::finite::check_logits(logits, crate::finite::LOGITS_HINT, || {
                format!(
                    "the logits of the cohort step at position {}",
                    plan.position()
                )
            })
            .map_err(|e| e.to_string())?;
            gate(plan, logits)
        };
        let record = |s: &mut weft_runtime::GraphSession<'_>,
                      kvs: &[&KvCache],
                      plan: &CohortSpan|
         -> Result<weft_ops::Tensor, RuntimeError> {
            self.record_step(s, kvs, plan.position(), tokens, LogitRows::All)
                .map_err(|e| match e {
                    ModelError::Runtime(r) => r,
                    other => RuntimeError::Usage(other.to_string()),
                })
        };
        Ok(cohort.run_step(exec, record, gate)?)
    }
}
