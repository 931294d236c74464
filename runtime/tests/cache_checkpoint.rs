//! Checkpoints: a round trip through a file gives the same next-token
//! logits (in a fresh executor, too), and every damaged or foreign file is
//! refused with its own error, leaving the target cache as it was.

mod support;

use std::path::{Path, PathBuf};
use support::{assert_err_contains, assert_same_bits, executor, tokens, Tiny, TinyConfig};
use weft_runtime::cache::{
    CacheImage, ChunkPolicy, KvCache, ModelIdentity, CHECKPOINT_MAGIC, CHECKPOINT_VERSION,
};
use weft_runtime::GraphExecutor;

const CONTEXT: u32 = 64;
const CHUNK: u32 = 8;

/// A scratch directory per test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-ckpt-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn identity(config: &TinyConfig) -> ModelIdentity {
    ModelIdentity::from_parts(&[b"tiny-random", format!("{config:?}").as_bytes()])
}

/// A model and a cache that has seen a prompt and a few decode steps.
fn filled(exec: &mut GraphExecutor) -> (Tiny, KvCache) {
    let m = Tiny::new(exec, TinyConfig::small()).unwrap();
    let mut c = m.new_cache(exec, CONTEXT, CHUNK).unwrap();
    let prompt = tokens(19, 1, m.config.vocab);
    m.prefill(exec, &mut c, &prompt, &ChunkPolicy::single(CHUNK))
        .unwrap();
    m.decode_all(exec, &mut c, &tokens(6, 2, m.config.vocab))
        .unwrap();
    (m, c)
}

#[test]
fn round_trip_gives_identical_next_token_logits() {
    let dir = scratch("round-trip");
    let path = dir.join("seq.weftkv");
    let mut exec = executor();
    let (m, mut cache) = filled(&mut exec);
    let id = identity(&m.config);
    let info = cache.save_checkpoint(&mut exec, &id, &path).unwrap();
    assert_eq!(info.position, 25);
    assert_eq!(info.file_bytes, std::fs::metadata(&path).unwrap().len());
    let next = tokens(10, 3, m.config.vocab);
    let want = m.decode_all(&mut exec, &mut cache, &next).unwrap();

    // A fresh executor, model (same seed) and cache.
    let mut exec2 = executor();
    let m2 = Tiny::new(&mut exec2, TinyConfig::small()).unwrap();
    let mut loaded = m2.new_cache(&mut exec2, CONTEXT, CHUNK).unwrap();
    let info2 = loaded.load_checkpoint(&mut exec2, &id, &path).unwrap();
    assert_eq!(info2, info);
    assert_eq!(loaded.position(), 25);
    let got = m2.decode_all(&mut exec2, &mut loaded, &next).unwrap();
    for (t, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_same_bits(a, b, &format!("step {t} after loading"));
    }

    // Back into the original cache, which moved on and got poisoned.
    cache.poison("test");
    cache.load_checkpoint(&mut exec, &id, &path).unwrap();
    assert!(!cache.is_poisoned());
    let again = m.decode(&mut exec, &mut cache, next[0]).unwrap();
    assert_same_bits(&again, &want[0], "reloaded into the original cache");
    std::fs::remove_dir_all(dir).ok();
}

/// Loads `bytes` into `cache` and checks it is refused with `needles`
/// while the cache keeps its position, health and rows.
fn refused(
    exec: &mut GraphExecutor,
    cache: &mut KvCache,
    id: &ModelIdentity,
    path: &Path,
    bytes: &[u8],
    needles: &[&str],
) {
    std::fs::write(path, bytes).unwrap();
    let before = cache.export(exec).unwrap();
    let msg = assert_err_contains(cache.load_checkpoint(exec, id, path), needles);
    assert!(msg.contains("KV checkpoint"), "{msg}");
    assert_eq!(cache.position(), before.position(), "{msg}");
    assert!(!cache.is_poisoned(), "{msg}");
    assert_eq!(
        cache.export(exec).unwrap(),
        before,
        "rows changed after: {msg}"
    );
}

#[test]
fn damaged_or_foreign_files_are_refused_and_change_nothing() {
    let dir = scratch("refusals");
    let (good, bad) = (dir.join("good.weftkv"), dir.join("bad.weftkv"));
    let mut exec = executor();
    let (m, cache) = filled(&mut exec);
    let id = identity(&m.config);
    cache.save_checkpoint(&mut exec, &id, &good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    assert_eq!(bytes[..8], CHECKPOINT_MAGIC);
    assert_eq!(bytes[8..12], CHECKPOINT_VERSION.to_le_bytes());

    // The target: another sequence at another position.
    let mut target = m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap();
    m.prefill(
        &mut exec,
        &mut target,
        &tokens(5, 9, m.config.vocab),
        &ChunkPolicy::single(CHUNK),
    )
    .unwrap();
    let t = &mut target;
    for cut in [0, 5, 11, 40, 70, bytes.len() / 2, bytes.len() - 1] {
        refused(&mut exec, t, &id, &bad, &bytes[..cut], &["truncated"]);
    }
    let mut b = bytes.clone();
    b[0] = b'X';
    refused(
        &mut exec,
        t,
        &id,
        &bad,
        &b,
        &["not a weft KV checkpoint", "magic"],
    );
    let mut b = bytes.clone();
    b[8..12].copy_from_slice(&(CHECKPOINT_VERSION + 1).to_le_bytes());
    refused(
        &mut exec,
        t,
        &id,
        &bad,
        &b,
        &["format version 2", "reads version 1"],
    );
    let mut b = bytes.clone();
    let mid = bytes.len() - 100;
    b[mid] ^= 0x40;
    refused(&mut exec, t, &id, &bad, &b, &["checksum mismatch"]);
    let mut b = bytes.clone();
    let last = b.len() - 1;
    b[last] ^= 1;
    refused(&mut exec, t, &id, &bad, &b, &["checksum mismatch"]);
    let mut b = bytes.clone();
    b.push(0);
    refused(&mut exec, t, &id, &bad, &b, &["unexpected bytes"]);
    let other = ModelIdentity::from_parts(&[b"another model"]);
    refused(
        &mut exec,
        t,
        &other,
        &bad,
        &bytes,
        &["written for model", "load it with the model that saved it"],
    );
    let msg = assert_err_contains(
        t.load_checkpoint(&mut exec, &id, &dir.join("missing")),
        &["cannot read"],
    );
    assert!(msg.contains("missing"), "{msg}");

    // Same model identity, another cache layout: refused by the layout check.
    let mut other_layout = KvCache::new(
        &mut exec,
        weft_runtime::cache::CacheConfig {
            layers: m.cache_config(CONTEXT, CHUNK).layers[..2].to_vec(),
            ..m.cache_config(CONTEXT, CHUNK)
        },
    )
    .unwrap();
    let msg = assert_err_contains(
        other_layout.load_checkpoint(&mut exec, &id, &good),
        &["does not fit this cache"],
    );
    assert!(msg.contains("layers"), "{msg}");
    assert_eq!(other_layout.position(), 0);
    // A shorter context that cannot hold the saved position.
    let mut short = m.new_cache(&mut exec, 16, CHUNK).unwrap();
    assert_err_contains(
        short.load_checkpoint(&mut exec, &id, &good),
        &["past the context length"],
    );

    // A poisoned cache cannot be saved.
    let mut p = m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap();
    p.poison("test");
    assert_err_contains(p.save_checkpoint(&mut exec, &id, &bad), &["poisoned"]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn images_round_trip_in_memory() {
    let mut exec = executor();
    let (m, cache) = filled(&mut exec);
    let id = identity(&m.config);
    let image = cache.export(&mut exec).unwrap();
    assert_eq!(image.position(), 25);
    // Full layers hold 25 rows, the windowed one its last 5: (2*25 + 5) rows of K and V.
    assert_eq!(image.bytes(), (2 * 25 + 5) * 2 * 64);
    let bytes = image.to_checkpoint_bytes(&id);
    assert_eq!(
        CacheImage::from_checkpoint_bytes(&bytes, &id).unwrap(),
        image
    );
    let a = ModelIdentity::from_parts(&[b"ab", b"c"]);
    let b = ModelIdentity::from_parts(&[b"a", b"bc"]);
    assert_ne!(a, b, "parts are length-prefixed");
}
