//! Where the tests find their reference files (llama.cpp's outputs, the
//! DeepSeek-V4 fixtures): the folder named by `$WEFT_TEST_REFERENCE_DIR`, else
//! the repository's own `tests/reference`. Nothing outside the repository
//! is searched, and a missing file fails the test with its path.

use std::path::{Path, PathBuf};

/// Environment variable naming another folder of reference files.
pub const REFERENCE_ENV: &str = "WEFT_TEST_REFERENCE_DIR";

/// The repository's root folder (the workspace this crate belongs to).
pub fn repo_root() -> PathBuf {
    let kit = Path::new(env!("CARGO_MANIFEST_DIR"));
    kit.parent().unwrap_or(kit).to_path_buf()
}

/// `$WEFT_TEST_REFERENCE_DIR`, else `tests/reference` of this repository.
pub fn reference_dir() -> PathBuf {
    match std::env::var_os(REFERENCE_ENV) {
        Some(dir) if dir.is_empty() => {
            panic!("{REFERENCE_ENV} is set but empty; unset it to use tests/reference")
        }
        Some(dir) => PathBuf::from(dir),
        None => repo_root().join("tests/reference"),
    }
}

/// The bytes of reference file `path`, or a panic naming it and where the
/// reference files come from.
pub fn read_reference(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| {
        let from = match std::env::var_os(REFERENCE_ENV) {
            Some(dir) => format!("{REFERENCE_ENV}={}", Path::new(&dir).display()),
            None => format!("the repository's tests/reference ({REFERENCE_ENV} is unset)"),
        };
        panic!(
            "cannot read reference file {}: {e}; reference files come from {from}",
            path.display()
        )
    })
}

/// Reference file `path` as JSON.
pub fn read_reference_json(path: &Path) -> serde_json::Value {
    let bytes = read_reference(path);
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("reference file {} is not valid JSON: {e}", path.display()))
}

/// Reference file `name` (under [`reference_dir`]) as JSON.
pub fn reference_json(name: &str) -> serde_json::Value {
    read_reference_json(&reference_dir().join(name))
}
