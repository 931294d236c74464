//! What one step may write: start position, token count and, per layer, the
//! rows (or ring slots) it fills.

use super::kv::LayerCache;
use std::ops::Range;

/// One layer's rows of a span.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSpan {
    /// Ring size when the layer is a ring.
    pub ring: Option<u32>,
    /// Row ranges written, in order (two when a ring wraps).
    pub rows: Vec<Range<u32>>,
}

/// A planned step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheSpan {
    pub start: u32,
    pub tokens: u32,
    pub layers: Vec<LayerSpan>,
}

impl CacheSpan {
    pub(crate) fn new(start: u32, tokens: u32, layers: &[LayerCache]) -> CacheSpan {
        let layers = layers
            .iter()
            .map(|l| LayerSpan {
                ring: l.ring,
                rows: rows_written(start, tokens, l.ring),
            })
            .collect();
        CacheSpan {
            start,
            tokens,
            layers,
        }
    }

    /// Position after the step.
    pub fn end(&self) -> u32 {
        self.start + self.tokens
    }

    /// True for a single-token step.
    pub fn is_decode(&self) -> bool {
        self.tokens == 1
    }
}

/// Slot ranges (in position order) that positions `start..start + tokens`
/// occupy: one range, or two when a ring wraps.
pub(super) fn rows_written(start: u32, tokens: u32, ring: Option<u32>) -> Vec<Range<u32>> {
    match ring {
        None => std::iter::once(start..start + tokens).collect(),
        Some(r) => {
            let first = start % r;
            let n = tokens.min(r);
            if first + n <= r {
                std::iter::once(first..first + n).collect()
            } else {
                vec![first..r, 0..first + n - r]
            }
        }
    }
}
