//! Which logits a step returns, and the checks of token ids a step takes
//! from the device. The step itself runs as a cache transaction through
//! `weft_runtime::cache::run_step`, which holds the transaction rules for
//! every model family.

use crate::ModelError;
use weft_ops::{Builder, DType, Tensor};
use weft_runtime::cache::CacheSpan;
use weft_runtime::GraphSession;

/// Checks host token ids against `span` and an embedding of `vocab` rows
/// and uploads them as the step's i32 ids.
pub(crate) fn upload_ids(
    s: &mut GraphSession<'_>,
    tokens: &[u32],
    span: &CacheSpan,
    vocab: usize,
) -> Result<Tensor, ModelError> {
    let n = tokens.len();
    if n != span.tokens as usize {
        return Err(ModelError::Input(format!(
            "{n} tokens for a span of {}",
            span.tokens
        )));
    }
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::Input(format!(
            "token id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    s.set_layer(None);
    let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    Ok(s.upload_i32(&ids, "token_ids")?)
}

/// Checks that `ids` can feed a step over `span` (i32, one id per token)
/// and returns the number of tokens.
pub(crate) fn check_ids(ids: &Tensor, span: &CacheSpan) -> Result<usize, ModelError> {
    let n = ids.shape.elements();
    if ids.dtype != DType::I32 || n != span.tokens as usize {
        return Err(ModelError::Input(format!(
            "token ids of {} {} for a span of {} tokens (want {} i32)",
            n, ids.dtype, span.tokens, span.tokens
        )));
    }
    Ok(n)
}

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
