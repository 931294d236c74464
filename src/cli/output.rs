//! Writing to stdout, stderr and output files without panicking.
//!
//! Standard output is written through [`Stdout`], which flushes and turns
//! every write error into an error naming stdout. A reader that goes away
//! (`weft tokenize ... | head -c 10`: a broken pipe) is [`StdoutClosed`],
//! which `main` turns into a quiet exit with status 0, as `head`-style
//! pipelines expect; any other failure (a full disk) is an error.
//!
//! Standard error carries notes, progress and error messages; writing them
//! is best effort ([`note!`](crate::note)): when stderr is closed there is
//! nowhere to report a failure, and the exit status still says how the
//! command ended.
//!
//! Output files ([`OutputFile`]) and folders ([`OutputDir`]) are opened
//! before any work, so a path that cannot be written is an error naming it
//! before the model is loaded rather than after the run.

use anyhow::{Context, Result};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, Write};
use std::path::{Path, PathBuf};

/// The reader of stdout went away (a broken pipe): a quiet exit.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed by its reader")]
pub struct StdoutClosed;

/// An error for a failed write to stdout.
fn stdout_error(e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        anyhow::Error::new(StdoutClosed)
    } else {
        anyhow::Error::new(e).context("cannot write to stdout")
    }
}

/// Locked standard output; every write is checked.
pub struct Stdout(io::StdoutLock<'static>);

impl Stdout {
    pub fn lock() -> Stdout {
        Stdout(io::stdout().lock())
    }

    /// Writes `text` and flushes (streamed output appears as it comes).
    pub fn write(&mut self, text: &str) -> Result<()> {
        self.0.write_all(text.as_bytes()).map_err(stdout_error)?;
        self.0.flush().map_err(stdout_error)
    }

    /// Writes `text` and a newline, and flushes.
    pub fn line(&mut self, text: impl std::fmt::Display) -> Result<()> {
        writeln!(self.0, "{text}").map_err(stdout_error)?;
        self.0.flush().map_err(stdout_error)
    }
}

/// One line on stdout.
pub fn print_line(text: impl std::fmt::Display) -> Result<()> {
    Stdout::lock().line(text)
}

/// Writes one line to stderr, ignoring failures (see the module docs).
pub fn stderr_line(args: std::fmt::Arguments<'_>) {
    let mut err = io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|()| err.write_all(b"\n"));
}

/// Writes to stderr without a newline, ignoring failures.
pub fn stderr_text(args: std::fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(args);
}

/// `eprintln!` that cannot panic: a line on stderr, best effort.
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::cli::output::stderr_line(format_args!($($arg)*))
    };
}

/// A file the command writes at the end, opened before the work starts.
///
/// Opening does not truncate an existing file; [`OutputFile::write`]
/// replaces its contents. A file this command created and never wrote is
/// removed again when the command fails.
pub struct OutputFile {
    file: Option<File>,
    path: PathBuf,
    flag: &'static str,
    created: bool,
}

impl OutputFile {
    /// Opens `path` for writing; `flag` (`--out`) names it in errors.
    pub fn open(path: &Path, flag: &'static str) -> Result<OutputFile> {
        let existed = path.exists();
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("{flag}: cannot write `{}`", path.display()))?;
        Ok(OutputFile {
            file: Some(file),
            path: path.to_path_buf(),
            flag,
            created: !existed,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps the file as it is now (something else wrote it).
    pub fn keep(mut self) {
        self.created = false;
    }

    /// Replaces the file's contents with `bytes`.
    pub fn write(mut self, bytes: &[u8]) -> Result<()> {
        let result = self.replace(bytes);
        if result.is_ok() {
            self.created = false;
        }
        result.with_context(|| format!("{}: cannot write `{}`", self.flag, self.path.display()))
    }

    fn replace(&mut self, bytes: &[u8]) -> io::Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        if file.metadata()?.is_file() {
            file.set_len(0)?;
            file.rewind()?;
        }
        file.write_all(bytes)?;
        file.flush()
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        drop(self.file.take());
        if self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A folder the command writes files into, created (and checked to be
/// writable) before the work starts.
#[derive(Clone, Debug)]
pub struct OutputDir {
    path: PathBuf,
    flag: &'static str,
}

impl OutputDir {
    /// Creates `path` if needed and checks a file can be created in it.
    pub fn create(path: &Path, flag: &'static str) -> Result<OutputDir> {
        std::fs::create_dir_all(path)
            .with_context(|| format!("{flag}: cannot create the folder `{}`", path.display()))?;
        let probe = path.join(format!(".weft-write-check-{}", std::process::id()));
        File::create(&probe).with_context(|| {
            format!("{flag}: cannot write into the folder `{}`", path.display())
        })?;
        let _ = std::fs::remove_file(&probe);
        Ok(OutputDir {
            path: path.to_path_buf(),
            flag,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `bytes` to `name` in the folder.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let path = self.path.join(name);
        std::fs::write(&path, bytes)
            .with_context(|| format!("{}: cannot write `{}`", self.flag, path.display()))
    }
}
