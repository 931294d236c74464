//! Caches of finished sequences kept for reuse: a new prompt that starts
//! with a kept sequence's tokens continues from its rows instead of
//! prefilling them again.
//!
//! A kept sequence offers points to continue from: its end (the cache as
//! it stopped, with the logits of its last step) and the ends of the
//! prompts it served (snapshots, restored with `KvCache::restore`, with the
//! logits each prompt produced; a sequence that continued an earlier one
//! keeps that one's points below its own). A point `p` serves a new prompt
//! when the prompt's first `p` tokens are the kept sequence's; then only
//! the rest of the prompt is prefilled, and a prompt equal to the first `p`
//! tokens needs no step at all (the kept logits are the ones a prefill
//! would give). The store is a least-recently-used list of a fixed number
//! of caches.

use crate::runtime::cache::{KvCache, Snapshot};
use crate::runtime::GraphExecutor;

/// A point of a sequence to continue from: its position and the logits
/// predicting the token after it.
pub struct ResumePoint {
    pub snapshot: Option<Snapshot>,
    pub position: usize,
    pub logits: Vec<f32>,
}

/// A finished sequence's cache.
pub struct KeptSequence {
    pub cache: KvCache,
    /// The tokens whose rows the cache holds, in order.
    pub tokens: Vec<u32>,
    /// Prompt ends it can be rolled back to (snapshots), in order.
    pub points: Vec<ResumePoint>,
    /// The logits after the cache's last token.
    pub end_logits: Option<Vec<f32>>,
    /// The session (`--slots-dir`) this sequence is the latest state of.
    pub session: Option<String>,
}

/// A cache handed to a new sequence from the store.
pub struct Reused {
    pub cache: KvCache,
    /// The prompt tokens the cache already holds.
    pub position: usize,
    /// The logits after them, when they are the whole prompt.
    pub logits: Option<Vec<f32>>,
    /// The kept points still valid at `position` (at or below it).
    pub points: Vec<ResumePoint>,
}

/// The kept sequences, most recently used last.
pub struct PrefixStore {
    kept: Vec<KeptSequence>,
    capacity: usize,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixStore {
    pub fn new(capacity: usize) -> PrefixStore {
        PrefixStore {
            kept: Vec::new(),
            capacity,
        }
    }

    /// Rows held by kept sequences.
    pub fn used_tokens(&self) -> u64 {
        self.kept.iter().map(|k| k.cache.position() as u64).sum()
    }

    /// Keeps a finished sequence; returns the caches that no longer fit
    /// (the least recently used), emptied.
    pub fn keep(&mut self, seq: KeptSequence) -> Vec<KvCache> {
        let mut freed = Vec::new();
        if self.capacity == 0 || seq.tokens.is_empty() || seq.cache.is_poisoned() {
            let mut cache = seq.cache;
            cache.reset();
            return vec![cache];
        }
        if let Some(name) = &seq.session {
            // One kept sequence per session: the newest.
            for k in &mut self.kept {
                if k.session.as_ref() == Some(name) {
                    k.session = None;
                }
            }
        }
        self.kept.push(seq);
        while self.kept.len() > self.capacity {
            let mut cache = self.kept.remove(0).cache;
            cache.reset();
            freed.push(cache);
        }
        freed
    }

    /// Whether sequences can be kept at all (`--keep` above 0).
    pub fn keeps(&self) -> bool {
        self.capacity > 0
    }

    /// The kept sequence of session `name`.
    pub fn session(&self, name: &str) -> Option<&KeptSequence> {
        self.kept
            .iter()
            .find(|k| k.session.as_deref() == Some(name))
    }

    /// Gives up the least recently used cache, emptied.
    pub fn evict(&mut self) -> Option<KvCache> {
        if self.kept.is_empty() {
            return None;
        }
        let mut cache = self.kept.remove(0).cache;
        cache.reset();
        Some(cache)
    }

    /// The kept cache that covers the longest start of `prompt`, moved to
    /// that point; `None` when no kept sequence shares a usable prefix.
    pub fn take(&mut self, exec: &mut GraphExecutor, prompt: &[u32]) -> Option<Reused> {
        // (kept index, position, the point's index or None for the end)
        let mut best: Option<(usize, usize, Option<usize>)> = None;
        for (i, k) in self.kept.iter().enumerate() {
            let shared = common_prefix(&k.tokens, prompt);
            let end = k.tokens.len();
            let mut consider = |p: usize, point: Option<usize>| {
                if p > 0 && best.is_none_or(|(_, q, _)| p > q) {
                    best = Some((i, p, point));
                }
            };
            if end <= shared
                && (end < prompt.len() || (end == prompt.len() && k.end_logits.is_some()))
            {
                consider(end, None);
            }
            for (j, pt) in k.points.iter().enumerate() {
                if pt.position <= shared && pt.position <= prompt.len() && pt.position < end {
                    consider(pt.position, Some(j));
                }
            }
        }
        let (i, position, point) = best?;
        let mut k = self.kept.remove(i);
        let whole = position == prompt.len();
        let logits = match point {
            None => {
                k.points.retain(|p| p.position <= position);
                if whole {
                    k.end_logits
                } else {
                    None
                }
            }
            Some(j) => {
                let restored = match &k.points[j].snapshot {
                    Some(snapshot) => k.cache.restore(exec, snapshot).is_ok(),
                    None => false,
                };
                if !restored {
                    k.cache.reset();
                    return Some(Reused {
                        cache: k.cache,
                        position: 0,
                        logits: None,
                        points: Vec::new(),
                    });
                }
                k.points.retain(|p| p.position <= position);
                whole
                    .then(|| {
                        k.points
                            .iter()
                            .find(|p| p.position == position)
                            .map(|p| p.logits.clone())
                    })
                    .flatten()
            }
        };
        Some(Reused {
            cache: k.cache,
            position,
            logits,
            points: k.points,
        })
    }
}
