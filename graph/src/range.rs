//! Buffers and half-open byte ranges: the only thing hazards are computed from.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Identity of a buffer within one executor. Dense, small integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufferId(pub u32);

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

/// Bytes `start..end` of one buffer (half-open, like Rust ranges).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ByteRange {
    pub buffer: BufferId,
    pub start: u64,
    pub end: u64,
}

impl ByteRange {
    pub fn new(buffer: BufferId, start: u64, end: u64) -> Self {
        Self { buffer, start, end }
    }

    /// Number of bytes covered.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// True when the range covers no byte (or is inverted).
    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }

    /// Two ranges overlap when they share at least one byte of one buffer.
    pub fn overlaps(&self, other: &ByteRange) -> bool {
        self.buffer == other.buffer && self.start < other.end && other.start < self.end
    }
}

impl fmt::Display for ByteRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}..{})", self.buffer, self.start, self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_open_ranges_touching_do_not_overlap() {
        let a = ByteRange::new(BufferId(0), 0, 16);
        let b = ByteRange::new(BufferId(0), 16, 32);
        let c = ByteRange::new(BufferId(1), 0, 16);
        assert!(!a.overlaps(&b));
        assert!(!a.overlaps(&c));
        assert!(a.overlaps(&ByteRange::new(BufferId(0), 15, 16)));
    }
}
