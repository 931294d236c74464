//! Choosing the next token from logits: greedy, temperature, top-k, top-p,
//! min-p and a repetition penalty, with a seeded generator.
//!
//! Order of operations (as llama.cpp's common sampler chain): repetition
//! penalty, then top-k, top-p and min-p on the temperature-scaled
//! distribution, then a draw. Temperature 0 is greedy: the argmax of the raw
//! logits, ties going to the lowest id. A positive temperature so small that
//! the largest scaled logit is not a finite f32 is greedy too: the
//! distribution it stands for puts all its mass on the argmax, and
//! computing it would give NaN.

use weft_graph::synth::SplitMix64;

/// Sampling settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0: greedy.
    pub temperature: f32,
    /// 0: off.
    pub top_k: usize,
    /// 1: off.
    pub top_p: f32,
    /// 0: off.
    pub min_p: f32,
    /// 1: off. Divides positive logits (multiplies negative ones) of tokens
    /// seen in the last `repeat_last_n` tokens.
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

/// A sampler with its own random state.
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
}

/// Index of the largest value (ties: lowest index).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = SplitMix64::new(params.seed);
        Sampler { params, rng }
    }

    /// Picks the next token given the logits and the tokens so far.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let p = &self.params;
        let mut logits = logits.to_vec();
        if p.repeat_penalty != 1.0 {
            let start = history.len().saturating_sub(p.repeat_last_n);
            let mut seen = history[start..].to_vec();
            seen.sort_unstable();
            seen.dedup();
            for t in seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repeat_penalty
                    } else {
                        *l * p.repeat_penalty
                    };
                }
            }
        }
        if p.temperature <= 0.0 {
            return argmax(&logits) as u32;
        }
        let mut cands: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, l)| (i as u32, l / p.temperature))
            .collect();
        cands.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if cands.first().is_none_or(|c| !c.1.is_finite()) {
            return argmax(&logits) as u32;
        }
        if p.top_k > 0 {
            cands.truncate(p.top_k.max(1));
        }
        let max = cands[0].1;
        let mut probs: Vec<f64> = cands.iter().map(|c| ((c.1 - max) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, q) in probs.iter().enumerate() {
                acc += q;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|q| **q >= floor).count().max(1));
        }
        let total: f64 = probs[..keep].iter().sum();
        let mut r = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
        for (i, q) in probs[..keep].iter().enumerate() {
            r -= q;
            if r < 0.0 {
                return cands[i].0;
            }
        }
        cands[keep - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_lowest_id_on_ties_and_seeds_repeat() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[1.0, 3.0, 3.0, -1.0], &[]), 1);
        let params = SamplingParams {
            temperature: 0.8,
            seed: 7,
            ..Default::default()
        };
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let a: Vec<u32> = {
            let mut s = Sampler::new(params.clone());
            (0..20).map(|_| s.sample(&logits, &[])).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(params.clone());
            (0..20).map(|_| s.sample(&logits, &[])).collect()
        };
        assert_eq!(a, b);
        // top_k = 1 is greedy whatever the temperature.
        let mut s = Sampler::new(SamplingParams { top_k: 1, ..params });
        assert_eq!(s.sample(&logits, &[]), argmax(&logits) as u32);
    }

    #[test]
    fn a_temperature_that_overflows_the_logits_is_greedy() {
        let logits = [3.0, -50.0, 7.5, 7.0, -1e30];
        for temperature in [1e-38, 1e-45, f32::MIN_POSITIVE] {
            let mut s = Sampler::new(SamplingParams {
                temperature,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed: 3,
                ..Default::default()
            });
            for _ in 0..8 {
                assert_eq!(s.sample(&logits, &[]), 2, "temperature {temperature}");
            }
        }
        // All logits negative: every scaled logit overflows to -inf.
        let mut s = Sampler::new(SamplingParams {
            temperature: 1e-38,
            ..Default::default()
        });
        assert_eq!(s.sample(&[-5.0, -4.0, -6.0], &[]), 1);
    }

    #[test]
    fn repetition_penalty_discourages_seen_tokens() {
        let mut s = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&[1.0, 1.5, 0.2], &[1]), 0);
    }
}
