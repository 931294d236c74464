//! Per-buffer interval maps of the highest level that wrote or read each byte.
//!
//! This is what makes the reorder pass exact and fast: a node's level is one
//! more than the highest level of any earlier access it conflicts with, and
//! the map answers that for a byte range by a binary search plus the
//! segments the range touches. Each buffer keeps a sorted vector of disjoint
//! segments: model recordings touch whole tensors, so most buffers hold a
//! handful of segments and a lookup is a few comparisons.

use crate::range::{BufferId, ByteRange};
use std::collections::HashMap;

/// Buffer ids below this index a plain vector; larger ones a hash map.
const DENSE_IDS: u32 = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    start: u64,
    end: u64,
    /// Highest level of a write covering these bytes (0: none).
    write: u32,
    /// Highest level of a read since that write (0: none).
    read: u32,
}

/// Access levels of every byte touched so far, per buffer.
#[derive(Default)]
pub(crate) struct AccessMap {
    dense: Vec<Vec<Segment>>,
    sparse: HashMap<BufferId, Vec<Segment>>,
    /// Reused for the segments that replace an updated region.
    scratch: Vec<Segment>,
}

/// Index of the first segment ending after `at` (segments are sorted and disjoint).
fn first_after(segs: &[Segment], at: u64) -> usize {
    segs.partition_point(|s| s.end <= at)
}

impl AccessMap {
    pub(crate) fn clear(&mut self) {
        self.dense.iter_mut().for_each(Vec::clear);
        self.sparse.clear();
    }

    fn get(&self, id: BufferId) -> Option<&Vec<Segment>> {
        if id.0 < DENSE_IDS {
            self.dense.get(id.0 as usize)
        } else {
            self.sparse.get(&id)
        }
    }

    /// The buffer's segments and the scratch vector.
    fn get_mut(&mut self, id: BufferId) -> (&mut Vec<Segment>, &mut Vec<Segment>) {
        let scratch = &mut self.scratch;
        scratch.clear();
        if id.0 < DENSE_IDS {
            let i = id.0 as usize;
            if i >= self.dense.len() {
                self.dense.resize_with(i + 1, Vec::new);
            }
            (&mut self.dense[i], scratch)
        } else {
            (self.sparse.entry(id).or_default(), scratch)
        }
    }

    /// Highest level a new access to `range` must follow: earlier writes for a
    /// read; earlier writes and reads for a write.
    pub(crate) fn conflict_level(&self, range: &ByteRange, writing: bool) -> u32 {
        let Some(segs) = self.get(range.buffer) else {
            return 0;
        };
        let mut level = 0;
        for seg in &segs[first_after(segs, range.start)..] {
            if seg.start >= range.end {
                break;
            }
            level = level.max(seg.write);
            if writing {
                level = level.max(seg.read);
            }
        }
        level
    }

    /// Notes that a node at `level` wrote `range`. Earlier reads of those bytes
    /// are all below `level`, so the write level alone orders later accesses.
    pub(crate) fn note_write(&mut self, range: &ByteRange, level: u32) {
        let (segs, replacement) = self.get_mut(range.buffer);
        let (s, e) = (range.start, range.end);
        let lo = first_after(segs, s);
        let hi = lo + segs[lo..].iter().take_while(|g| g.start < e).count();
        if let Some(first) = segs.get(lo).filter(|g| lo < hi && g.start < s) {
            replacement.push(Segment { end: s, ..*first });
        }
        replacement.push(Segment {
            start: s,
            end: e,
            write: level,
            read: 0,
        });
        if let Some(last) = segs
            .get(hi.wrapping_sub(1))
            .filter(|g| hi > lo && g.end > e)
        {
            replacement.push(Segment { start: e, ..*last });
        }
        segs.splice(lo..hi, replacement.drain(..));
    }

    /// Notes that a node at `level` read `range`.
    pub(crate) fn note_read(&mut self, range: &ByteRange, level: u32) {
        let (segs, replacement) = self.get_mut(range.buffer);
        let (s, e) = (range.start, range.end);
        let lo = first_after(segs, s);
        let hi = lo + segs[lo..].iter().take_while(|g| g.start < e).count();
        // Fast path: one segment with exactly these bounds.
        if hi == lo + 1 && segs[lo].start == s && segs[lo].end == e {
            segs[lo].read = segs[lo].read.max(level);
            return;
        }
        let mut cursor = s;
        for g in &segs[lo..hi] {
            if g.start < s {
                replacement.push(Segment { end: s, ..*g });
            }
            let (a, b) = (g.start.max(s), g.end.min(e));
            if a > cursor {
                replacement.push(Segment {
                    start: cursor,
                    end: a,
                    write: 0,
                    read: level,
                });
            }
            replacement.push(Segment {
                start: a,
                end: b,
                write: g.write,
                read: g.read.max(level),
            });
            if g.end > e {
                replacement.push(Segment { start: e, ..*g });
            }
            cursor = b;
        }
        if cursor < e {
            replacement.push(Segment {
                start: cursor,
                end: e,
                write: 0,
                read: level,
            });
        }
        segs.splice(lo..hi, replacement.drain(..));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: u64, e: u64) -> ByteRange {
        ByteRange::new(BufferId(0), s, e)
    }

    #[test]
    fn partial_overlaps_are_tracked_per_byte() {
        let mut m = AccessMap::default();
        m.note_write(&r(0, 100), 1);
        m.note_read(&r(50, 150), 2);
        assert_eq!(m.conflict_level(&r(0, 10), false), 1);
        assert_eq!(m.conflict_level(&r(0, 10), true), 1);
        assert_eq!(m.conflict_level(&r(120, 130), false), 0);
        assert_eq!(m.conflict_level(&r(120, 130), true), 2);
        assert_eq!(m.conflict_level(&r(99, 101), true), 2);
        m.note_write(&r(60, 70), 3);
        assert_eq!(m.conflict_level(&r(65, 66), false), 3);
        assert_eq!(m.conflict_level(&r(55, 60), true), 2);
        assert_eq!(m.conflict_level(&r(150, 160), true), 0);
        m.note_write(&r(10, 20), 4);
        assert_eq!(m.conflict_level(&r(0, 5), true), 1);
        assert_eq!(m.conflict_level(&r(15, 16), false), 4);
    }

    #[test]
    fn segments_stay_sorted_and_disjoint() {
        let mut m = AccessMap::default();
        let mut x = 12345u64;
        for i in 0..2000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let s = (x >> 33) % 1000;
            let len = 1 + (x >> 20) % 50;
            if i % 3 == 0 {
                m.note_write(&r(s, s + len), i + 1);
            } else {
                m.note_read(&r(s, s + len), i + 1);
            }
            let segs = &m.dense[0];
            assert!(segs.windows(2).all(|w| w[0].end <= w[1].start));
            assert!(segs.iter().all(|g| g.start < g.end));
        }
    }

    /// Against a per-byte model: every query answers what the bytes say.
    #[test]
    fn answers_match_a_per_byte_model() {
        for seed in 0..20u64 {
            let mut m = AccessMap::default();
            let (mut wl, mut rl) = (vec![0u32; 300], vec![0u32; 300]);
            let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n
            };
            for _ in 0..400 {
                let s = next(299);
                let e = s + 1 + next(300 - s - 1 + 1).min(299 - s);
                let writing = next(3) == 0;
                let want = (s..e)
                    .map(|i| {
                        let i = i as usize;
                        if writing {
                            wl[i].max(rl[i])
                        } else {
                            wl[i]
                        }
                    })
                    .max()
                    .unwrap();
                assert_eq!(m.conflict_level(&r(s, e), writing), want, "seed {seed}");
                // Levels as the reorder pass assigns them: above the conflict,
                // sometimes further up (other accesses of the same node).
                let level = want + 1 + next(3) as u32;
                for i in s as usize..e as usize {
                    if writing {
                        wl[i] = level;
                        rl[i] = 0;
                    } else {
                        rl[i] = rl[i].max(level);
                    }
                }
                if writing {
                    m.note_write(&r(s, e), level);
                } else {
                    m.note_read(&r(s, e), level);
                }
            }
        }
    }
}
