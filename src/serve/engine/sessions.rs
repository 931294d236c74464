//! The engine's side of sessions on disk (`--slots-dir`): a request that
//! names a session continues from its file (when no newer state of it is
//! kept in memory) and saves into it when it finishes; the explicit save
//! and restore endpoints act on the kept sequence of a session.
//!
//! A file is loaded into a cache that nothing else uses; one the model
//! refuses (another model's, truncated, corrupted) leaves that cache empty
//! and is answered with the reason, so it changes nothing.

use super::super::error::ApiError;
use super::super::prefix::{KeptSequence, Reused};
use super::super::slots::{self, SessionAction, SessionInfo, SessionJob, SlotsDir};
use super::Engine;
use crate::runtime::cache::KvCache;

/// A session file loaded into a cache, with its tokens.
struct Loaded {
    cache: KvCache,
    tokens: Vec<u32>,
    file_bytes: u64,
}

impl Engine<'_> {
    /// Answers an explicit save or restore.
    pub(super) fn session_job(&mut self, job: SessionJob) {
        let result = match job.action {
            SessionAction::Save => self.save_kept(&job.name),
            SessionAction::Restore => self.restore_kept(&job.name),
        };
        let _ = job.reply.send(result);
    }

    fn slots(&self) -> Result<&SlotsDir, ApiError> {
        self.slots.as_ref().ok_or_else(|| {
            ApiError::invalid_param(
                "session",
                "sessions are off: start the server with --slots-dir DIR",
            )
        })
    }

    /// Loads session `name`'s file; `Ok(None)` when there is none.
    fn load(&mut self, name: &str) -> Result<Option<Loaded>, ApiError> {
        let path = self.slots()?.path(name);
        if !path.exists() {
            return Ok(None);
        }
        let mut cache = self.fresh_cache()?;
        match self.model.load_session(&mut self.exec, &mut cache, &path) {
            Ok(info) if info.tokens.len() == info.position as usize => Ok(Some(Loaded {
                cache,
                tokens: info.tokens,
                file_bytes: info.file_bytes,
            })),
            Ok(info) => {
                cache.reset();
                self.free.push(cache);
                Err(slots::refused(
                    name,
                    format!(
                        "the file holds {} positions but no token list (it was saved without one)",
                        info.position
                    ),
                ))
            }
            Err(e) => {
                cache.reset();
                self.free.push(cache);
                Err(slots::refused(name, e))
            }
        }
    }

    /// The cache a request of session `name` with `prompt` continues from,
    /// loaded from its file: `None` when a newer state is kept in memory
    /// (the prefix store finds it), when there is no file, or when the
    /// prompt does not continue the saved tokens.
    pub(super) fn session_start(
        &mut self,
        name: &str,
        prompt: &[u32],
    ) -> Result<Option<Reused>, ApiError> {
        if self.prefix.session(name).is_some() {
            return Ok(None);
        }
        let Some(loaded) = self.load(name)? else {
            return Ok(None);
        };
        let n = loaded.tokens.len();
        if n == 0 || n >= prompt.len() || prompt[..n] != loaded.tokens[..] {
            let mut cache = loaded.cache;
            cache.reset();
            self.free.push(cache);
            return Ok(None);
        }
        Ok(Some(Reused {
            cache: loaded.cache,
            position: n,
            logits: None,
            points: Vec::new(),
        }))
    }

    /// Saves a finished sequence into session `name`'s file.
    pub(super) fn save_into(
        &mut self,
        name: &str,
        cache: &KvCache,
        tokens: &[u32],
    ) -> Result<SessionInfo, ApiError> {
        let path = self.slots()?.path(name);
        let info = self
            .model
            .save_session(&mut self.exec, cache, tokens, &path)
            .map_err(|e| ApiError::internal(format!("cannot save session {name:?}: {e}")))?;
        Ok(SessionInfo {
            name: name.to_string(),
            tokens: info.position as usize,
            file_bytes: info.file_bytes,
        })
    }

    /// `save`: the kept sequence of session `name` to its file.
    fn save_kept(&mut self, name: &str) -> Result<SessionInfo, ApiError> {
        self.slots()?;
        let Some(k) = self.prefix.session(name) else {
            return Err(slots::missing(format!(
                "no sequence of session {name:?} is kept in memory (a finished request with \
                 \"session\": {name:?}, or a restore, leaves one; --keep kept sequences at most)"
            )));
        };
        let path = self.slots()?.path(name);
        let info = self
            .model
            .save_session(&mut self.exec, &k.cache, &k.tokens, &path)
            .map_err(|e| ApiError::internal(format!("cannot save session {name:?}: {e}")))?;
        Ok(SessionInfo {
            name: name.to_string(),
            tokens: info.position as usize,
            file_bytes: info.file_bytes,
        })
    }

    /// `restore`: session `name`'s file into a kept sequence.
    fn restore_kept(&mut self, name: &str) -> Result<SessionInfo, ApiError> {
        self.slots()?;
        if !self.prefix.keeps() {
            return Err(ApiError::invalid_param(
                "session",
                "the server keeps no finished sequences (--keep 0), so a restored session \
                 has nowhere to wait; restart with --keep 1 or more",
            ));
        }
        let Some(loaded) = self.load(name)? else {
            return Err(slots::missing(format!(
                "there is no session file {name:?} in --slots-dir"
            )));
        };
        let info = SessionInfo {
            name: name.to_string(),
            tokens: loaded.tokens.len(),
            file_bytes: loaded.file_bytes,
        };
        let freed = self.prefix.keep(KeptSequence {
            cache: loaded.cache,
            tokens: loaded.tokens,
            points: Vec::new(),
            end_logits: None,
            session: Some(name.to_string()),
        });
        self.free.extend(freed);
        Ok(info)
    }
}
