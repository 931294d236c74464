//! Log-probabilities of a token and its most likely alternatives: the
//! log-softmax of the raw logits row the token was drawn from.

use super::job::TokenLogprob;
use super::text::StopText;
use crate::models::Model;

/// The log-probability of `chosen` under `logits`, and the `top` most
/// likely tokens (ties: lowest id first).
pub fn token_logprob(model: &Model, logits: &[f32], chosen: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_norm = max as f64 + sum.ln();
    let lp = |id: u32| {
        logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&l| (l as f64 - log_norm) as f32)
    };
    let entry = |id: u32| {
        let bytes = StopText::piece(model, id);
        (String::from_utf8_lossy(&bytes).into_owned(), bytes, lp(id))
    };
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let top = top.min(ids.len());
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if top > 0 && top < ids.len() {
        ids.select_nth_unstable_by(top - 1, by_logit);
    }
    ids.truncate(top);
    ids.sort_by(by_logit);
    let (token, bytes, logprob) = entry(chosen);
    TokenLogprob {
        token,
        bytes,
        logprob,
        top: ids.into_iter().map(entry).collect(),
    }
}
