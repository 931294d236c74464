//! One step as a cache transaction, and chunked prefill as a series of them.
//!
//! `run_step`: plan a span (refusals change nothing) -> record -> commit
//! (a refused schedule submitted nothing) -> drain -> read the output ->
//! publish. Once work was submitted, any failure (a kernel, reading the
//! output, the publish itself) poisons the cache. `prefill_chunked` cuts a
//! prompt with a [`ChunkPolicy`] and runs every chunk through `run_step`, so
//! each chunk is its own transaction: a failure in chunk `i` leaves chunks
//! before it published and the cache poisoned at their end.
//!
//! Model-agnostic: the caller's closure records the step and returns the
//! tensor to read back (logits, usually).

use super::chunking::ChunkPolicy;
use super::kv::KvCache;
use super::span::CacheSpan;
use crate::{GraphExecutor, GraphSession, RuntimeError, SubmissionChain};
use std::ops::Range;
use weft_ops::Tensor;

/// Runs one step of `tokens` tokens as a transaction and returns the
/// recorded output as f32. Plan (no poison on refusal), record (an error
/// here submits nothing), commit and drain, then publish; any failure after
/// work was submitted poisons the cache. `E` is the caller's error type
/// (model code uses its own).
pub fn run_step<E: From<RuntimeError>>(
    exec: &mut GraphExecutor,
    cache: &mut KvCache,
    tokens: u32,
    record: impl FnOnce(&mut GraphSession<'_>, &KvCache, &CacheSpan) -> Result<Tensor, E>,
) -> Result<Vec<f32>, E> {
    let span = cache.plan_prefill(tokens)?;
    let mut chain = SubmissionChain::new();
    let mut session = exec.begin_recorded();
    // A recording error drops the session: nothing was submitted.
    let output = record(&mut session, cache, &span)?;
    chain.push(session.commit()?);
    if let Err(e) = chain.drain() {
        cache.poison(&format!("the step at position {} failed: {e}", span.start));
        return Err(e.into());
    }
    let values = match exec.read_f32(&output) {
        Ok(v) => v,
        Err(e) => {
            cache.poison(&format!(
                "reading the output of the step at {} failed: {e}",
                span.start
            ));
            return Err(e.into());
        }
    };
    cache.commit_prefill(span.start, span.tokens)?;
    Ok(values)
}

/// What a chunked prefill did.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillOutcome {
    /// Tokens per chunk, in order (one transaction each).
    pub chunks: Vec<u32>,
    /// The last chunk's output.
    pub last: Vec<f32>,
}

/// Prefills `tokens` tokens at the cache's position in chunks chosen by
/// `policy` (capped by the cache's `max_chunk`), each its own transaction.
/// `record` records one chunk: it gets the chunk's range of prompt indices
/// (`0..tokens`) besides the session, cache and span.
pub fn prefill_chunked(
    exec: &mut GraphExecutor,
    cache: &mut KvCache,
    tokens: u32,
    policy: &ChunkPolicy,
    mut record: impl FnMut(
        &mut GraphSession<'_>,
        &KvCache,
        &CacheSpan,
        Range<usize>,
    ) -> Result<Tensor, RuntimeError>,
) -> Result<PrefillOutcome, RuntimeError> {
    if tokens == 0 {
        return Err(RuntimeError::Usage(
            "prefill: the prompt is empty; pass at least one token".into(),
        ));
    }
    let end = cache.position() as u64 + tokens as u64;
    if end > cache.config().context as u64 {
        return Err(RuntimeError::Usage(format!(
            "prefill: {tokens} tokens at position {} do not fit the context of {}; shorten the prompt or reset()",
            cache.position(),
            cache.config().context
        )));
    }
    let mut outcome = PrefillOutcome {
        chunks: Vec::new(),
        last: Vec::new(),
    };
    let mut done = 0u32;
    while done < tokens {
        let n = policy
            .next_chunk(tokens - done, cache.position())
            .min(cache.config().max_chunk);
        let range = done as usize..(done + n) as usize;
        outcome.last = run_step(exec, cache, n, |s, c, span| {
            record(s, c, span, range.clone())
        })?;
        outcome.chunks.push(n);
        done += n;
    }
    Ok(outcome)
}
