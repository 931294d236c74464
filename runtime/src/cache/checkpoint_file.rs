//! Checkpoint files (and the CLI's session files beside them) on disk:
//! written atomically, read with a size bound.
//!
//! A save writes a temporary file with a name unique to this process and
//! call, in the target's own directory (so the rename cannot cross file
//! systems), syncs it, renames it over the target and syncs the directory.
//! Readers therefore see the old file or the new one, never a mix: two
//! concurrent saves to one path each rename a complete file, and the last
//! rename wins. A failed save removes its temporary file.
//!
//! A load refuses a file larger than the caller's bound before reading it,
//! and stops reading at the bound if the file grows meanwhile, so a hostile
//! file cannot make the loader allocate more than the cache it targets.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a file operation failed: what was attempted, on which path.
#[derive(Debug)]
pub struct FileError {
    pub what: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

impl std::error::Error for FileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot {} {}: {}",
            self.what,
            self.path.display(),
            self.source
        )
    }
}

fn at<'p>(what: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> FileError + 'p {
    move |source| FileError {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// A temporary file removed on drop unless it was renamed into place.
struct Temporary {
    path: PathBuf,
    armed: bool,
}

impl Drop for Temporary {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `<dir>/.<name>.<pid>-<n>.tmp`, created exclusively (a leftover of a
/// crashed process with the same pid is skipped, not overwritten).
fn create_temporary(dir: &Path, name: &str) -> Result<(Temporary, File), FileError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut tries = 0;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".{name}.{}-{n}.tmp", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((Temporary { path, armed: true }, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 64 => tries += 1,
            Err(e) => return Err(at("create a temporary file", &path)(e)),
        }
    }
}

/// Replaces `path` by a file holding exactly `bytes`, atomically and
/// durably (see the module doc).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let name = path
        .file_name()
        .ok_or_else(|| {
            at("write", path)(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the path names no file",
            ))
        })?
        .to_string_lossy()
        .into_owned();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (mut temporary, mut file) = create_temporary(&dir, &name)?;
    file.write_all(bytes)
        .map_err(at("write", &temporary.path))?;
    file.sync_all().map_err(at("sync", &temporary.path))?;
    drop(file);
    std::fs::rename(&temporary.path, path).map_err(at("rename the temporary file onto", path))?;
    temporary.armed = false;
    sync_directory(&dir)
}

/// Makes a rename in `dir` durable.
#[cfg(unix)]
fn sync_directory(dir: &Path) -> Result<(), FileError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(at("sync the directory", dir))
}

/// Directories cannot be synced here; the rename is still atomic.
#[cfg(not(unix))]
fn sync_directory(_dir: &Path) -> Result<(), FileError> {
    Ok(())
}

/// What [`read_bounded`] found.
pub enum Bounded {
    Bytes(Vec<u8>),
    /// The file holds more than the bound (its size, or at least bound + 1).
    TooLarge(u64),
}

/// The bytes of `path` if it holds at most `limit` bytes.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Bounded, FileError> {
    let file = File::open(path).map_err(at("read", path))?;
    let len = file.metadata().map_err(at("read", path))?.len();
    if len > limit {
        return Ok(Bounded::TooLarge(len));
    }
    // `len <= limit`, which the caller derived from memory it already holds.
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(at("read", path))?;
    if bytes.len() as u64 > limit {
        return Ok(Bounded::TooLarge(bytes.len() as u64));
    }
    Ok(Bounded::Bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-ckfile-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn concurrent_writes_leave_one_complete_file_and_no_temporaries() {
        let dir = scratch("concurrent");
        let path = dir.join("seq.weftkv");
        // Two writers, each with its own content (large enough that a torn
        // write would show), replacing the same path many times.
        let contents: Vec<Vec<u8>> = (0..2u8).map(|i| vec![i + 1; 300_000]).collect();
        std::thread::scope(|s| {
            for content in &contents {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..25 {
                        write_atomically(path, content).unwrap();
                    }
                });
            }
            // A reader racing the writers only ever sees a whole file.
            s.spawn(|| {
                for _ in 0..200 {
                    if let Ok(b) = std::fs::read(&path) {
                        assert!(contents.contains(&b), "a torn file of {} bytes", b.len());
                    }
                }
            });
        });
        let last = std::fs::read(&path).unwrap();
        assert!(contents.contains(&last));
        assert_eq!(entries(&dir), vec!["seq.weftkv".to_string()]);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn failed_writes_leave_no_temporary() {
        let dir = scratch("failed");
        // The target is a directory: the rename fails after the write.
        let target = dir.join("taken");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("inside"), b"x").unwrap();
        let e = write_atomically(&target, b"data").unwrap_err();
        assert!(e.to_string().contains("rename"), "{e}");
        assert!(e.to_string().contains("taken"), "{e}");
        assert_eq!(entries(&dir), vec!["taken".to_string()]);
        // A missing directory: nothing can be created.
        let e = write_atomically(&dir.join("missing/seq.weftkv"), b"data").unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        assert_eq!(entries(&dir), vec!["taken".to_string()]);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn reads_are_bounded() {
        let dir = scratch("bounded");
        let path = dir.join("f");
        std::fs::write(&path, [7u8; 100]).unwrap();
        assert!(matches!(read_bounded(&path, 100).unwrap(), Bounded::Bytes(b) if b.len() == 100));
        assert!(matches!(
            read_bounded(&path, 99).unwrap(),
            Bounded::TooLarge(100)
        ));
        std::fs::remove_dir_all(dir).ok();
    }
}
