//! `weft run --session FILE`: a conversation continued across processes.
//!
//! The file is a KV checkpoint (`Model::save_session`) with its token list.
//! When it exists, its cache is loaded (a file of another model, or a
//! truncated or corrupted one, is refused before anything runs and stays
//! as it was) and the new prompt is appended: only its tokens are
//! prefilled. After generating, every token of the conversation (the
//! saved ones, the prompt, the generated ones) is in the cache and the
//! file is replaced atomically.
//!
//! `weft chat --session FILE` keeps the conversation's messages beside it
//! in `FILE.messages.json` (the template renders messages, not tokens):
//! written atomically before the cache file, so a stop between the two
//! leaves messages at least as new as the cache, and a turn whose render
//! departs from the cached tokens prefills from the start.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use weft::models::chat::Message;
use weft::models::{LogitRows, Model};
use weft::runtime::cache::{read_bounded, write_atomically, Bounded, ChunkPolicy, KvCache};
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
        announce: bool,
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
        if announce {
            crate::note!(
                "session saved to {} ({} tokens, {} bytes)",
                self.path.display(),
                info.position,
                info.file_bytes
            );
        }
        Ok(())
    }
}

/// The largest messages file read (a conversation's text, far more than any
/// context holds).
const MAX_MESSAGES_BYTES: u64 = 64 << 20;

/// `FILE.messages.json`: where `weft chat` keeps a session's messages.
pub fn messages_path(session: &Path) -> PathBuf {
    let mut name = session.as_os_str().to_os_string();
    name.push(".messages.json");
    PathBuf::from(name)
}

/// The messages saved beside `session`: `None` when there is no file.
pub fn load_messages(session: &Path) -> Result<Option<Vec<Message>>> {
    let path = messages_path(session);
    let bytes = match read_bounded(&path, MAX_MESSAGES_BYTES) {
        Ok(Bounded::Bytes(b)) => b,
        Ok(Bounded::TooLarge(len)) => bail!(
            "{}: {len} bytes, more than the {MAX_MESSAGES_BYTES} a session's messages may take",
            path.display()
        ),
        Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("{}: not a messages file (JSON)", path.display()))?;
    let list = value
        .get("messages")
        .and_then(|m| m.as_array())
        .with_context(|| format!("{}: no `messages` array", path.display()))?;
    let mut messages = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let field = |k: &str| m.get(k).and_then(|v| v.as_str());
        match (field("role"), field("content")) {
            (Some(role @ ("system" | "user" | "assistant")), Some(content)) => {
                messages.push(Message::new(role, content))
            }
            _ => bail!(
                "{}: message {i} needs a `role` (system, user or assistant) and a `content` string",
                path.display()
            ),
        }
    }
    Ok(Some(messages))
}

/// Replaces the messages file beside `session` atomically (the checkpoint
/// files' [`write_atomically`]).
pub fn save_messages(session: &Path, messages: &[Message]) -> Result<()> {
    let list: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
        .collect();
    let bytes = serde_json::to_vec_pretty(&serde_json::json!({ "messages": list }))?;
    write_atomically(&messages_path(session), &bytes)?;
    Ok(())
}
