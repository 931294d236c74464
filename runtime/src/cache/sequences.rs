//! Several sequences (conversations) sharing one executor and one resident
//! cache, each keeping its own frontier.
//!
//! A [`SequenceStore`] owns the device cache and, for every sequence that
//! is not resident, a host [`CacheImage`] of its frontier together with its
//! lineage. `swap_in(id)` parks the resident sequence (a host copy of its
//! rows) and writes the chosen one's rows into the cache; the sequence then
//! continues exactly where it stopped, and its snapshots stay restorable
//! because its lineage travels with it. Swapping costs a copy of the
//! frontier each way; the device holds one cache whatever the number of
//! sequences.

use super::image::CacheImage;
use super::kv::KvCache;
use super::lineage::Lineage;
use crate::{GraphExecutor, RuntimeError};
use std::collections::BTreeMap;

/// A caller-chosen name for a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SequenceId(pub u64);

impl std::fmt::Display for SequenceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sequence {}", self.0)
    }
}

/// A sequence that is not resident: its rows and its history.
struct Parked {
    image: CacheImage,
    lineage: Lineage,
}

/// Sequences sharing one resident cache.
pub struct SequenceStore {
    cache: KvCache,
    resident: Option<SequenceId>,
    parked: BTreeMap<SequenceId, Parked>,
}

impl SequenceStore {
    /// A store around `cache` (whatever it held is forgotten).
    pub fn new(mut cache: KvCache) -> SequenceStore {
        cache.reset();
        SequenceStore {
            cache,
            resident: None,
            parked: BTreeMap::new(),
        }
    }

    /// Registers a new, empty sequence (parked; nothing runs).
    pub fn open(&mut self, id: SequenceId) -> Result<(), RuntimeError> {
        if self.contains(id) {
            return Err(RuntimeError::Usage(format!(
                "sequence store: {id} is already open; close() it first or pick another id"
            )));
        }
        let config = self.cache.config();
        let image = CacheImage::empty(&config.layers, config.dtype);
        let lineage = Lineage::fresh();
        self.parked.insert(id, Parked { image, lineage });
        Ok(())
    }

    /// True when `id` is open (resident or parked).
    pub fn contains(&self, id: SequenceId) -> bool {
        self.resident == Some(id) || self.parked.contains_key(&id)
    }

    /// Every open sequence, in id order.
    pub fn ids(&self) -> Vec<SequenceId> {
        let mut ids: Vec<_> = self.parked.keys().copied().chain(self.resident).collect();
        ids.sort_unstable();
        ids
    }

    /// The resident sequence, if any.
    pub fn resident(&self) -> Option<SequenceId> {
        self.resident
    }

    /// The device cache (holding the resident sequence, if any).
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// The resident sequence's cache, to run steps on.
    pub fn cache_mut(&mut self) -> Option<(SequenceId, &mut KvCache)> {
        let id = self.resident?;
        Some((id, &mut self.cache))
    }

    /// Position of sequence `id`.
    pub fn position(&self, id: SequenceId) -> Option<u32> {
        if self.resident == Some(id) {
            return Some(self.cache.position());
        }
        self.parked.get(&id).map(|p| p.image.position())
    }

    /// Host bytes held by parked sequences.
    pub fn parked_bytes(&self) -> u64 {
        self.parked.values().map(|p| p.image.bytes()).sum()
    }

    /// Parks the resident sequence (copying its frontier to the host) and
    /// leaves the cache empty. Refused, changing nothing, when the resident
    /// sequence is poisoned.
    pub fn swap_out(
        &mut self,
        exec: &mut GraphExecutor,
    ) -> Result<Option<SequenceId>, RuntimeError> {
        let Some(id) = self.resident else {
            return Ok(None);
        };
        if let Some(why) = self.cache.poisoned() {
            return Err(RuntimeError::Usage(format!(
                "sequence store: cannot swap {id} out: its cache is poisoned ({why}); \
                 reset() and replay it, restore() a snapshot, or close() it"
            )));
        }
        let image = self.cache.export(exec)?;
        let lineage = std::mem::replace(&mut self.cache.lineage, Lineage::fresh());
        self.cache.reset();
        self.parked.insert(id, Parked { image, lineage });
        self.resident = None;
        Ok(Some(id))
    }

    /// Makes `id` resident (parking the current one first) and returns its
    /// cache. An unknown id, or a resident sequence that cannot be parked,
    /// is refused before anything moves.
    pub fn swap_in(
        &mut self,
        exec: &mut GraphExecutor,
        id: SequenceId,
    ) -> Result<&mut KvCache, RuntimeError> {
        if self.resident == Some(id) {
            return Ok(&mut self.cache);
        }
        if !self.parked.contains_key(&id) {
            return Err(RuntimeError::Usage(format!(
                "sequence store: {id} is not open; open() it first"
            )));
        }
        self.swap_out(exec)?;
        let Some(parked) = self.parked.remove(&id) else {
            return Err(RuntimeError::Usage(format!(
                "sequence store: {id} vanished while swapping in"
            )));
        };
        let Parked { image, lineage } = parked;
        if let Err(e) = self.cache.check_image(&image) {
            self.parked.insert(id, Parked { image, lineage });
            return Err(e);
        }
        // The image was checked, so only a device write can fail here; the
        // parked copy and its lineage are kept either way.
        match self.cache.import_rows(exec, &image) {
            Ok(()) => {
                self.cache.lineage = lineage;
                self.resident = Some(id);
                Ok(&mut self.cache)
            }
            Err(e) => {
                self.parked.insert(id, Parked { image, lineage });
                Err(e)
            }
        }
    }

    /// Forgets sequence `id` (the cache is emptied if it was resident).
    pub fn close(&mut self, id: SequenceId) -> Result<(), RuntimeError> {
        if self.resident == Some(id) {
            self.resident = None;
            self.cache.reset();
            return Ok(());
        }
        match self.parked.remove(&id) {
            Some(_) => Ok(()),
            None => Err(RuntimeError::Usage(format!(
                "sequence store: {id} is not open; nothing to close"
            ))),
        }
    }

    /// The cache, giving up every parked sequence.
    pub fn into_cache(self) -> KvCache {
        self.cache
    }
}
