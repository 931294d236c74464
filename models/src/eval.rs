//! Evaluation of a model on a text: perplexity as llama-perplexity computes it.
//!
//! The text is tokenized once (with BOS first when the model adds one),
//! split into non-overlapping windows of `ctx` tokens (the first token of
//! every window replaced by BOS when the model adds BOS), and each window
//! scores the log-likelihood of its second half: the logits at position `i`
//! predict token `i + 1` for `i` in `ctx/2 .. ctx-1`.

use crate::step::LogitRows;
use crate::{Model, ModelError};
use weft_runtime::cache::ChunkPolicy;
use weft_runtime::GraphExecutor;

/// A perplexity result.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Perplexity {
    pub ppl: f64,
    pub chunks: usize,
    pub tokens: usize,
}

/// Perplexity of `tokens` in windows of `ctx`; `progress(chunk, ppl so far)`.
pub fn perplexity(
    model: &Model,
    exec: &mut GraphExecutor,
    tokens: &[u32],
    ctx: usize,
    progress: &mut dyn FnMut(usize, f64),
) -> Result<Perplexity, ModelError> {
    // A window scores the tokens of its second half after the first one:
    // 3 tokens is the smallest window that scores anything.
    if ctx < 3 {
        return Err(ModelError::Input(format!(
            "a perplexity window of {ctx} tokens scores nothing; it must be at least 3 tokens"
        )));
    }
    let chunks = tokens.len() / ctx;
    if chunks == 0 {
        return Err(ModelError::Input(format!(
            "the text has {} tokens, fewer than one window of {ctx}",
            tokens.len()
        )));
    }
    let vocab = model.vocab();
    let bos = model
        .tokenizer
        .add_bos()
        .then(|| model.tokenizer.bos())
        .flatten();
    let mut cache = model.new_cache(exec, ctx as u32, ctx as u32)?;
    let whole = ChunkPolicy::single(ctx as u32);
    let first = ctx / 2;
    let (mut nll, mut count) = (0f64, 0usize);
    for c in 0..chunks {
        let mut window = tokens[c * ctx..(c + 1) * ctx].to_vec();
        if let Some(b) = bos {
            window[0] = b;
        }
        cache.reset();
        let logits = model.prefill(
            exec,
            &mut cache,
            &window,
            &whole,
            LogitRows::From(first as u32),
        )?;
        for i in first..ctx - 1 {
            let row = &logits[(i - first) * vocab..(i - first + 1) * vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
            let sum: f64 = row.iter().map(|v| ((v - max) as f64).exp()).sum();
            nll -= (row[window[i + 1] as usize] - max) as f64 - sum.ln();
            count += 1;
        }
        progress(c + 1, (nll / count as f64).exp());
    }
    Ok(Perplexity {
        ppl: (nll / count as f64).exp(),
        chunks,
        tokens: tokens.len(),
    })
}
