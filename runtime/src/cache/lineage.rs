//! Which rows of a cache still belong to a snapshot's sequence.
//!
//! Rows below the published position are written once per sequence and
//! never again, until the position moves back (a `reset`, a `restore` to an
//! earlier snapshot, an import). A lineage counts those moves: every move
//! back starts a new generation and records its *floor* (the position it
//! went back to; rows below it were kept). A snapshot taken in generation
//! `g` at position `p` can be restored while every floor since `g` is at
//! least `p`: then the rows below `p` are still the ones it saw. Rows a
//! later write may overwrite even so (ring slots, windowed layers) travel
//! inside the snapshot.
//!
//! A lineage belongs to a sequence, not to a device buffer: swapping a
//! sequence out and back in (`SequenceStore`) carries its lineage along, so
//! its snapshots stay valid.

use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The history of one sequence's moves back.
/// Not `Clone`: a lineage moves with its sequence, it is never duplicated.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Lineage {
    id: u64,
    floors: Vec<u32>,
}

/// Where a snapshot was taken in a lineage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    id: u64,
    generation: usize,
}

impl Lineage {
    /// A new sequence.
    pub(crate) fn fresh() -> Lineage {
        Lineage {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            floors: Vec::new(),
        }
    }

    /// The current point of the history.
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            id: self.id,
            generation: self.floors.len(),
        }
    }

    /// Records a move back to `floor`.
    pub(crate) fn move_back(&mut self, floor: u32) {
        self.floors.push(floor);
    }

    /// Why rows below `position` may have changed since `mark`, if they may.
    pub(crate) fn check(&self, mark: Mark, position: u32) -> Result<(), String> {
        if mark.id != self.id {
            return Err("it belongs to another sequence (or one that was reset since)".into());
        }
        let since = self.floors.get(mark.generation..).unwrap_or(&[]);
        match since.iter().min() {
            Some(&floor) if floor < position => Err(format!(
                "the sequence went back to position {floor} since, below the snapshot's {position}, and may have rewritten those rows"
            )),
            _ => Ok(()),
        }
    }
}
