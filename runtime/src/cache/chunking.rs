//! How a long prompt is split into prefill chunks (each its own transaction).
//!
//! hf2q's rule, kept as the default: chunks of
//! `min(remaining, window x multiplier)` rows, where the multiplier is 32 (16
//! once resident weights reach 100 GB) and the window is the model's sliding
//! window or 128; once the cache holds something and fewer than 33 tokens
//! remain, the rest goes token by token.

/// Chunking knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPolicy {
    /// The model's sliding window (`None`: use `default_window`).
    pub window: Option<u32>,
    pub default_window: u32,
    /// Rows per chunk in windows.
    pub multiplier: u32,
    /// Below this many remaining tokens on a non-empty cache, go token by token.
    pub token_by_token_below: u32,
}

impl Default for ChunkPolicy {
    fn default() -> Self {
        Self {
            window: None,
            default_window: 128,
            multiplier: 32,
            token_by_token_below: 33,
        }
    }
}

/// Resident weights at or above which hf2q halves the multiplier.
pub const LARGE_WEIGHTS_BYTES: u64 = 100 * 1000 * 1000 * 1000;

impl ChunkPolicy {
    /// hf2q's defaults for a model with `window` and `weight_bytes` of weights.
    pub fn for_model(window: Option<u32>, weight_bytes: u64) -> Self {
        Self {
            window,
            multiplier: if weight_bytes >= LARGE_WEIGHTS_BYTES {
                16
            } else {
                32
            },
            ..Self::default()
        }
    }

    /// One chunk of up to `n` tokens whatever the position (perplexity
    /// windows, benchmarks).
    pub fn single(n: u32) -> Self {
        Self {
            window: Some(n.max(1)),
            default_window: n.max(1),
            multiplier: 1,
            token_by_token_below: 0,
        }
    }

    /// Largest chunk this policy produces.
    pub fn max_chunk(&self) -> u32 {
        self.window
            .unwrap_or(self.default_window)
            .saturating_mul(self.multiplier)
            .max(1)
    }

    /// Size of the next chunk with `remaining` tokens left at `position`.
    pub fn next_chunk(&self, remaining: u32, position: u32) -> u32 {
        if remaining == 0 {
            return 0;
        }
        if position > 0 && remaining < self.token_by_token_below {
            return 1;
        }
        remaining.min(self.max_chunk())
    }

    /// All chunk sizes for `tokens` tokens starting at `position`.
    pub fn plan(&self, tokens: u32, position: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let (mut left, mut pos) = (tokens, position);
        while left > 0 {
            let n = self.next_chunk(left, pos);
            out.push(n);
            left -= n;
            pos += n;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_cases() {
        let p = ChunkPolicy {
            multiplier: 16,
            ..Default::default()
        };
        assert_eq!(p.plan(6000, 0), vec![2048, 2048, 1904]);
        let d = ChunkPolicy::default();
        assert_eq!(d.plan(32, 1024), vec![1; 32]);
        assert_eq!(d.plan(33, 1024), vec![33]);
        assert_eq!(d.plan(20, 0), vec![20]);
        assert_eq!(
            ChunkPolicy::for_model(Some(512), 200_000_000_000).max_chunk(),
            512 * 16
        );
        assert_eq!(ChunkPolicy::for_model(None, 98_000_000).max_chunk(), 4096);
    }
}
