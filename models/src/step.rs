//! Which logits a step returns, and the checks of token ids a step takes
//! from the device. The step itself runs as a cache transaction through
//! `weft_runtime::cache::run_step`, which holds the transaction rules for
//! every model family.

use crate::ModelError;
use weft_ops::{DType, Tensor};
use weft_runtime::cache::CacheSpan;

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
