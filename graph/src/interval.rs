//! Per-buffer interval maps of the highest level that wrote or read each byte.
//!
//! This is what makes the reorder pass exact and fast: a node's level is one
//! more than the highest level of any earlier access it conflicts with, and the
//! map answers that for a byte range in O(log n + segments touched).

use crate::range::{BufferId, ByteRange};
use std::collections::{BTreeMap, HashMap};

/// Buffer ids below this index a plain vector; larger ones a hash map.
const DENSE_IDS: u32 = 1 << 16;

#[derive(Clone, Copy, Debug)]
struct Segment {
    end: u64,
    /// Highest level of a write covering these bytes (0: none).
    write: u32,
    /// Highest level of a read since that write (0: none).
    read: u32,
}

/// Access levels of every byte touched so far, per buffer.
#[derive(Default)]
pub(crate) struct AccessMap {
    dense: Vec<BTreeMap<u64, Segment>>,
    sparse: HashMap<BufferId, BTreeMap<u64, Segment>>,
}

impl AccessMap {
    pub(crate) fn clear(&mut self) {
        self.dense.iter_mut().for_each(BTreeMap::clear);
        self.sparse.clear();
    }

    fn get(&self, id: BufferId) -> Option<&BTreeMap<u64, Segment>> {
        if id.0 < DENSE_IDS {
            self.dense.get(id.0 as usize)
        } else {
            self.sparse.get(&id)
        }
    }

    fn get_mut(&mut self, id: BufferId) -> &mut BTreeMap<u64, Segment> {
        if id.0 < DENSE_IDS {
            let i = id.0 as usize;
            if i >= self.dense.len() {
                self.dense.resize_with(i + 1, BTreeMap::new);
            }
            &mut self.dense[i]
        } else {
            self.sparse.entry(id).or_default()
        }
    }

    /// Highest level a new access to `range` must follow: earlier writes for a
    /// read; earlier writes and reads for a write.
    pub(crate) fn conflict_level(&self, range: &ByteRange, writing: bool) -> u32 {
        let Some(map) = self.get(range.buffer) else {
            return 0;
        };
        // Fast path: a segment with exactly these bounds (whole tensors);
        // segments are disjoint, so it is the only one overlapping.
        if let Some(seg) = map.get(&range.start) {
            if seg.end == range.end {
                return if writing {
                    seg.write.max(seg.read)
                } else {
                    seg.write
                };
            }
        }
        let mut level = 0;
        for seg in overlapping(map, range.start, range.end) {
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
        let map = self.get_mut(range.buffer);
        if let Some(seg) = map.get_mut(&range.start) {
            if seg.end == range.end {
                *seg = Segment {
                    end: range.end,
                    write: level,
                    read: 0,
                };
                return;
            }
        }
        split_at(map, range.start);
        split_at(map, range.end);
        while let Some((&s, _)) = map.range(range.start..range.end).next() {
            map.remove(&s);
        }
        map.insert(
            range.start,
            Segment {
                end: range.end,
                write: level,
                read: 0,
            },
        );
    }

    /// Notes that a node at `level` read `range`.
    pub(crate) fn note_read(&mut self, range: &ByteRange, level: u32) {
        let map = self.get_mut(range.buffer);
        if let Some(seg) = map.get_mut(&range.start) {
            if seg.end == range.end {
                seg.read = seg.read.max(level);
                return;
            }
        }
        split_at(map, range.start);
        split_at(map, range.end);
        // Raise existing segments, then fill the gaps between them.
        let mut cursor = range.start;
        let mut gaps = Vec::new();
        for (&s, seg) in map.range_mut(range.start..range.end) {
            if s > cursor {
                gaps.push((cursor, s));
            }
            seg.read = seg.read.max(level);
            cursor = seg.end;
        }
        if cursor < range.end {
            gaps.push((cursor, range.end));
        }
        for (s, e) in gaps {
            map.insert(
                s,
                Segment {
                    end: e,
                    write: 0,
                    read: level,
                },
            );
        }
    }
}

/// Segments overlapping `start..end`.
fn overlapping(
    map: &BTreeMap<u64, Segment>,
    start: u64,
    end: u64,
) -> impl Iterator<Item = &Segment> {
    let before = map
        .range(..start)
        .next_back()
        .map(|(_, seg)| seg)
        .filter(|seg| seg.end > start);
    before
        .into_iter()
        .chain(map.range(start..end).map(|(_, seg)| seg))
}

/// Splits the segment containing `at` (if any) so that a segment starts at `at`.
fn split_at(map: &mut BTreeMap<u64, Segment>, at: u64) {
    let Some((&s, seg)) = map.range(..at).next_back() else {
        return;
    };
    if seg.end > at {
        let tail = Segment {
            end: seg.end,
            ..*seg
        };
        map.get_mut(&s).expect("segment just found").end = at;
        map.insert(at, tail);
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
    }
}
