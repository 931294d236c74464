//! Snapshots and rollback of a sequence's frontier (speculative decoding,
//! cancelled prompts).
//!
//! Design: a snapshot is the published position plus a host copy of the
//! rows a later write could destroy but a rollback needs. Layers without a
//! window are append-only: a step at `p` writes rows `>= p`, so rows below a
//! snapshot's position stay as they were, and the snapshot only notes where
//! it was taken in the sequence's lineage (see `lineage.rs`) to prove it.
//! Windowed layers are rings: decoding `k` tokens past the snapshot
//! overwrites the slots of positions `p + j - ring`, some of which a query
//! at `p` still sees once `k` exceeds the chunk headroom of the ring. So the
//! snapshot copies the last `window - 1` positions of every windowed layer
//! (ring or not, so a snapshot also survives a swap out and back in), and
//! `restore` writes them back. The copy is small: windowed layers only.
//!
//! `restore` brings the position back, writes the saved rows, clears poison
//! and records the move back in the lineage (snapshots taken later than the
//! restored position can no longer be restored).

use super::image::{read_rows, write_rows, LayerRows};
use super::kv::KvCache;
use super::lineage::Mark;
use crate::{GraphExecutor, RuntimeError};

/// A sequence's frontier: its position and the windowed rows a rollback
/// needs.
#[derive(Clone, Debug)]
pub struct Snapshot {
    mark: Mark,
    position: u32,
    /// Saved rows of each windowed layer (`None` for append-only layers).
    layers: Vec<Option<LayerRows>>,
}

impl Snapshot {
    /// Position the snapshot returns to.
    pub fn position(&self) -> u32 {
        self.position
    }

    /// Host bytes the snapshot holds.
    pub fn bytes(&self) -> u64 {
        self.layers.iter().flatten().map(LayerRows::bytes).sum()
    }
}

impl KvCache {
    /// Captures the frontier. Refused (changing nothing) on a poisoned cache.
    pub fn snapshot(&self, exec: &mut GraphExecutor) -> Result<Snapshot, RuntimeError> {
        self.refuse_if_poisoned("take a snapshot")?;
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let saved = match layer.window {
                Some(_) => {
                    let first = layer.needed_from(self.position);
                    Some(read_rows(exec, layer, first, self.position)?)
                }
                None => None,
            };
            layers.push(saved);
        }
        Ok(Snapshot {
            mark: self.lineage.mark(),
            position: self.position,
            layers,
        })
    }

    /// Returns to `snapshot`: the position it holds, its windowed rows back
    /// in place, poison cleared. Refused (changing nothing) when the
    /// snapshot belongs to another sequence or the rows it relies on may
    /// have been rewritten since.
    pub fn restore(
        &mut self,
        exec: &mut GraphExecutor,
        snapshot: &Snapshot,
    ) -> Result<(), RuntimeError> {
        if let Err(why) = self.lineage.check(snapshot.mark, snapshot.position) {
            return Err(RuntimeError::Usage(format!(
                "KV cache: cannot restore the snapshot at position {}: {why}; \
                 restore a snapshot taken since, or reset() and replay",
                snapshot.position
            )));
        }
        if snapshot.layers.len() != self.layers.len() {
            return Err(RuntimeError::Usage(format!(
                "KV cache: the snapshot has {} layers, the cache {}; it was taken from another cache layout",
                snapshot.layers.len(),
                self.layers.len()
            )));
        }
        for (layer, saved) in self.layers.iter().zip(&snapshot.layers) {
            let Some(rows) = saved else { continue };
            if let Err(e) = write_rows(exec, layer, rows) {
                self.poison(&format!("a restore failed halfway: {e}"));
                return Err(e);
            }
        }
        self.position = snapshot.position;
        self.poisoned = None;
        self.lineage.move_back(snapshot.position);
        Ok(())
    }
}
