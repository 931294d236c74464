//! `weft run --session FILE`: a conversation continued across processes.
//!
//! The file is a KV checkpoint (`Model::save_session`) with its token list.
//! When it exists, its cache is loaded (a file of another model, or a
//! truncated or corrupted one, is refused before anything runs and stays
//! as it was) and the new prompt is appended: only its tokens are
//! prefilled. After generating, every token of the conversation (the
//! saved ones, the prompt, the generated ones) is in the cache and the
//! file is replaced atomically.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use weft::models::{LogitRows, Model};
use weft::runtime::cache::{ChunkPolicy, KvCache};
use weft::runtime::GraphExecutor;

/// A session file and the tokens its cache holds.
pub struct Session {
    path: PathBuf,
    /// The tokens loaded from the file (empty for a new session).
    pub tokens: Vec<u32>,
}

impl Session {
    /// Loads `path` into `cache` when it exists; a new session otherwise
    /// (its directory must exist, so the save at the end can succeed).
    pub fn open(
        exec: &mut GraphExecutor,
        model: &Model,
        cache: &mut KvCache,
        path: &Path,
    ) -> Result<Session> {
        let session = Session {
            path: path.to_path_buf(),
            tokens: Vec::new(),
        };
        if !path.exists() {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            if !dir.is_dir() {
                bail!(
                    "--session {}: the directory {} does not exist",
                    path.display(),
                    dir.display()
                );
            }
            return Ok(session);
        }
        let info = model
            .load_session(exec, cache, path)
            .with_context(|| format!("--session {}: cannot continue from it", path.display()))?;
        if info.tokens.len() != info.position as usize {
            bail!(
                "--session {}: the file holds {} cached positions but no token list (it was saved \
                 without one); weft run continues only sessions it saved",
                path.display(),
                info.position
            );
        }
        Ok(Session {
            tokens: info.tokens,
            ..session
        })
    }

    /// Whether the file held a conversation.
    pub fn resumed(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// Steps whatever of `history` the cache lacks (the last generated
    /// token) and saves the cache with `history` as its token list.
    pub fn save(
        &self,
        exec: &mut GraphExecutor,
        model: &Model,
        cache: &mut KvCache,
        policy: &ChunkPolicy,
        history: &[u32],
    ) -> Result<()> {
        let held = cache.position() as usize;
        if held > history.len() {
            bail!(
                "--session {}: the cache holds {held} positions, more than the {} tokens of the conversation; not saved",
                self.path.display(),
                history.len()
            );
        }
        if held < history.len() {
            model
                .prefill(exec, cache, &history[held..], policy, LogitRows::Last)
                .with_context(|| {
                    format!(
                        "--session {}: stepping the last tokens failed; not saved",
                        self.path.display()
                    )
                })?;
        }
        let info = model
            .save_session(exec, cache, history, &self.path)
            .with_context(|| format!("--session {}: cannot save", self.path.display()))?;
        crate::note!(
            "weft run: session saved to {} ({} tokens, {} bytes)",
            self.path.display(),
            info.position,
            info.file_bytes
        );
        Ok(())
    }
}
