//! Sessions on disk (`--slots-dir DIR`): a sequence's KV cache and its
//! tokens saved as a checkpoint file named by the client, and loaded back.
//!
//! A session name is a plain file name inside the directory: 1 to 128
//! ASCII letters, digits, `.`, `_` or `-`, not starting with a dot (so
//! never `..`, a hidden file or a save's temporary file). Slashes,
//! backslashes, absolute paths and anything else are refused before a path
//! is formed, so no name can reach outside the directory.

use super::error::ApiError;
use axum::http::StatusCode;
use std::path::{Path, PathBuf};
use tokio::sync::oneshot;

/// Longest session name, in bytes.
pub const MAX_NAME: usize = 128;

/// What a session operation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    pub name: String,
    /// Tokens the saved or restored cache holds.
    pub tokens: usize,
    /// Bytes of the file.
    pub file_bytes: u64,
}

/// An explicit save or restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionAction {
    /// Writes the session's sequence kept in memory to its file.
    Save,
    /// Loads the session's file into a kept sequence, where the next
    /// request that continues it finds it.
    Restore,
}

impl SessionAction {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionAction::Save => "save",
            SessionAction::Restore => "restore",
        }
    }
}

/// A save or restore on its way to the engine.
pub struct SessionJob {
    pub action: SessionAction,
    pub name: String,
    pub reply: oneshot::Sender<Result<SessionInfo, ApiError>>,
}

/// Checks a client-given session name (`param` names the field in errors).
pub fn check_name(name: &str, param: &str) -> Result<(), ApiError> {
    let refuse = |why: String| Err(ApiError::invalid_param(param, why));
    if name.is_empty() || name.len() > MAX_NAME {
        return refuse(format!(
            "the session name is {} bytes long; give 1 to {MAX_NAME}",
            name.len()
        ));
    }
    if name.starts_with('.') {
        return refuse(format!(
            "the session name {name:?} starts with a dot; a name is a plain file name inside --slots-dir"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return refuse(format!(
            "the session name {name:?} contains {c:?}; use ASCII letters, digits, `.`, `_` and `-` \
             (a plain file name inside --slots-dir, no path)"
        ));
    }
    Ok(())
}

/// The directory sessions live in.
#[derive(Clone, Debug)]
pub struct SlotsDir {
    dir: PathBuf,
}

impl SlotsDir {
    /// `dir`, which must be an existing directory.
    pub fn new(dir: &Path) -> anyhow::Result<SlotsDir> {
        anyhow::ensure!(
            dir.is_dir(),
            "--slots-dir {}: not a directory (create it first)",
            dir.display()
        );
        Ok(SlotsDir {
            dir: dir.to_path_buf(),
        })
    }

    /// The file of session `name` (a name [`check_name`] accepted).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// 400 for a session file that was refused (another model, damaged).
pub fn refused(name: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_param(
        "session",
        format!("session {name:?} cannot be restored: {why}"),
    )
}

/// 404 for a session with nothing to act on.
pub fn missing(message: String) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        code: Some("session_not_found"),
        ..ApiError::invalid_param("session", message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_file_names() {
        for good in [
            "chat1",
            "user-42.weftkv",
            "a_b.c",
            "X",
            &"n".repeat(MAX_NAME),
        ] {
            assert!(check_name(good, "session").is_ok(), "{good}");
        }
        for (bad, says) in [
            ("", "1 to 128"),
            ("..", "starts with a dot"),
            (".hidden", "starts with a dot"),
            ("../etc", "starts with a dot"),
            ("a/../b", "'/'"),
            ("/etc/passwd", "'/'"),
            ("a\\b", "'\\\\'"),
            ("c:x", "':'"),
            ("a b", "' '"),
            ("é", "'é'"),
            ("nul\0", "'\\0'"),
        ] {
            let e = check_name(bad, "session").expect_err(bad);
            assert_eq!(e.param.as_deref(), Some("session"));
            assert!(e.message.contains(says), "{bad:?}: {}", e.message);
        }
        let long = "n".repeat(MAX_NAME + 1);
        assert!(check_name(&long, "session").is_err());
    }
}
