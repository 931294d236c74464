//! One forward step as a cache transaction: plan a span, record the step,
//! commit it, drain, then publish the span, or poison the cache if anything
//! failed after work was submitted. Every model family runs its steps
//! through here, so the transaction rules live in one place.

use crate::ModelError;
use weft_ops::Tensor;
use weft_runtime::cache::{CacheSpan, KvCache};
use weft_runtime::{GraphExecutor, GraphSession, SubmissionChain};

/// Which positions' logits a step returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// Only the last token's (generation).
    Last,
    /// Every token's (prompt argmax).
    All,
    /// Those of positions at or after this one (perplexity scores only the
    /// second half of each window). A step entirely before it still returns
    /// its last row, so every step has logits.
    From(u32),
}

impl LogitRows {
    /// Index of the first row (of `n` rows starting at position `start`)
    /// whose logits a step computes.
    pub fn first_row(self, start: u32, n: usize) -> usize {
        let last = n.saturating_sub(1);
        match self {
            LogitRows::Last => last,
            LogitRows::All => 0,
            LogitRows::From(p) => (p.saturating_sub(start) as usize).min(last),
        }
    }
}

/// Runs one step of `tokens` tokens: `record` records it into a session
/// for `span` and returns the logits tensor; the logits come back as f32.
pub fn run_step(
    exec: &mut GraphExecutor,
    cache: &mut KvCache,
    tokens: u32,
    record: impl FnOnce(&mut GraphSession<'_>, &KvCache, &CacheSpan) -> Result<Tensor, ModelError>,
) -> Result<Vec<f32>, ModelError> {
    // Planning failures change nothing and poison nothing.
    let span = cache.plan_prefill(tokens)?;
    let mut chain = SubmissionChain::new();
    let mut session = exec.begin_recorded();
    let logits = match record(&mut session, cache, &span) {
        Ok(t) => t,
        Err(e) => {
            // Nothing was submitted: the recording is simply dropped.
            drop(session);
            return Err(e);
        }
    };
    match session.commit() {
        Ok(inflight) => chain.push(inflight),
        Err(e) => return Err(e.into()),
    }
    if let Err(e) = chain.drain() {
        cache.poison(&format!("a step at position {} failed: {e}", span.start));
        return Err(e.into());
    }
    let values = match exec.read_f32(&logits) {
        Ok(v) => v,
        Err(e) => {
            cache.poison(&format!(
                "reading the logits of the step at {} failed: {e}",
                span.start
            ));
            return Err(e.into());
        }
    };
    cache.commit_prefill(span.start, span.tokens)?;
    Ok(values)
}
