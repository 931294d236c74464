//! Checkpoints: a round trip through a file gives the same next-token
//! logits (in a fresh executor, too), and every damaged, foreign or
//! inconsistent file (even one whose checksum was recomputed) is refused
//! with its own error, leaving the target cache as it was.

mod support;

use sha2::{Digest, Sha256};
use std::path::PathBuf;
use support::{assert_err_contains, assert_same_bits, executor, tokens, Tiny, TinyConfig};
use weft_runtime::cache::{
    checkpoint_bound, CacheConfig, CacheImage, ChunkPolicy, KvCache, ModelIdentity,
    CHECKPOINT_MAGIC, CHECKPOINT_VERSION,
};
use weft_runtime::GraphExecutor;

const CONTEXT: u32 = 64;
/// The tiny model's vocabulary (`TinyConfig::small`).
const VOCAB: u32 = 96;
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
    let info = cache.save_checkpoint(&mut exec, &id, &[], &path).unwrap();
    assert_eq!(info.position, 25);
    assert_eq!(info.file_bytes, std::fs::metadata(&path).unwrap().len());
    let next = tokens(10, 3, m.config.vocab);
    let want = m.decode_all(&mut exec, &mut cache, &next).unwrap();

    // A fresh executor, model (same seed) and cache.
    let mut exec2 = executor();
    let m2 = Tiny::new(&mut exec2, TinyConfig::small()).unwrap();
    let mut loaded = m2.new_cache(&mut exec2, CONTEXT, CHUNK).unwrap();
    let info2 = loaded
        .load_checkpoint(&mut exec2, &id, u32::MAX, &path)
        .unwrap();
    assert_eq!(info2, info);
    assert_eq!(loaded.position(), 25);
    let got = m2.decode_all(&mut exec2, &mut loaded, &next).unwrap();
    for (t, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_same_bits(a, b, &format!("step {t} after loading"));
    }

    // Back into the original cache, which moved on and got poisoned.
    cache.poison("test");
    cache
        .load_checkpoint(&mut exec, &id, u32::MAX, &path)
        .unwrap();
    assert!(!cache.is_poisoned());
    let again = m.decode(&mut exec, &mut cache, next[0]).unwrap();
    assert_same_bits(&again, &want[0], "reloaded into the original cache");
    std::fs::remove_dir_all(dir).ok();
}

/// The tokens `filled` runs: its prompt, then its decode steps.
fn filled_tokens(vocab: usize) -> Vec<u32> {
    let mut t = tokens(19, 1, vocab);
    t.extend(tokens(6, 2, vocab));
    t
}

/// A saved checkpoint (with its token list) and a target cache holding
/// another sequence.
struct Refusals {
    exec: GraphExecutor,
    model: Tiny,
    target: KvCache,
    id: ModelIdentity,
    dir: PathBuf,
    good: PathBuf,
    bytes: Vec<u8>,
}

impl Refusals {
    fn new(name: &str) -> Refusals {
        let dir = scratch(name);
        let good = dir.join("good.weftkv");
        let mut exec = executor();
        let (model, cache) = filled(&mut exec);
        let id = identity(&model.config);
        let listed = filled_tokens(model.config.vocab);
        let info = cache
            .save_checkpoint(&mut exec, &id, &listed, &good)
            .unwrap();
        assert_eq!(info.tokens, listed);
        let bytes = std::fs::read(&good).unwrap();
        let mut target = model.new_cache(&mut exec, CONTEXT, CHUNK).unwrap();
        let prompt = tokens(5, 9, model.config.vocab);
        let policy = ChunkPolicy::single(CHUNK);
        model
            .prefill(&mut exec, &mut target, &prompt, &policy)
            .unwrap();
        Refusals {
            exec,
            model,
            target,
            id,
            dir,
            good,
            bytes,
        }
    }

    /// Loads `bytes` (as written to a file) for `id` into the target and
    /// checks it is refused with `needles` while the target keeps its
    /// position, health and rows.
    fn refused(&mut self, bytes: &[u8], id: &ModelIdentity, needles: &[&str]) {
        let path = self.dir.join("bad.weftkv");
        std::fs::write(&path, bytes).unwrap();
        let exec = &mut self.exec;
        let before = self.target.export(exec).unwrap();
        let msg = assert_err_contains(self.target.load_checkpoint(exec, id, VOCAB, &path), needles);
        assert!(
            msg.contains("KV checkpoint") && msg.contains("bad.weftkv"),
            "{msg}"
        );
        assert_eq!(self.target.position(), before.position(), "{msg}");
        assert!(!self.target.is_poisoned(), "{msg}");
        assert_eq!(
            self.target.export(exec).unwrap(),
            before,
            "rows changed after: {msg}"
        );
    }

    /// The saved bytes with `edit` applied.
    fn edited(&self, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut b = self.bytes.clone();
        edit(&mut b);
        b
    }
}

impl Drop for Refusals {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

#[test]
fn damaged_files_are_refused_and_change_nothing() {
    let mut r = Refusals::new("damaged");
    let id = r.id;
    assert_eq!(r.bytes[..8], CHECKPOINT_MAGIC);
    assert_eq!(r.bytes[8..12], CHECKPOINT_VERSION.to_le_bytes());
    let len = r.bytes.len();
    // Cut inside the magic, the version, the identity, the layer table, the
    // rows and the checksum.
    for cut in [0, 5, 11, 40, 70, len / 2, len - 1] {
        let b = r.bytes[..cut].to_vec();
        r.refused(&b, &id, &["truncated"]);
    }
    let b = r.edited(|b| b[0] = b'X');
    r.refused(&b, &id, &["not a weft KV checkpoint", "magic"]);
    let b = r.edited(|b| b[8..12].copy_from_slice(&(CHECKPOINT_VERSION + 1).to_le_bytes()));
    r.refused(&b, &id, &["format version 3", "reads versions 1 to 2"]);
    let b = r.edited(|b| b[len - 100] ^= 0x40);
    r.refused(&b, &id, &["checksum mismatch"]);
    let b = r.edited(|b| b[len - 1] ^= 1);
    r.refused(&b, &id, &["checksum mismatch"]);
    let b = r.edited(|b| b.push(0));
    r.refused(&b, &id, &["unexpected bytes"]);
}

#[test]
fn foreign_files_are_refused_and_change_nothing() {
    let mut r = Refusals::new("foreign");
    let (id, bytes) = (r.id, r.bytes.clone());
    let other = ModelIdentity::from_parts(&[b"another model"]);
    r.refused(
        &bytes,
        &other,
        &["written for model", "load it with the model that saved it"],
    );
    let missing = r.dir.join("missing");
    let msg = assert_err_contains(
        r.target.load_checkpoint(&mut r.exec, &id, VOCAB, &missing),
        &["cannot read"],
    );
    assert!(msg.contains("missing"), "{msg}");

    // Same model identity, another cache layout: refused by the layout check.
    let (m, exec) = (&r.model, &mut r.exec);
    let config = m.cache_config(CONTEXT, CHUNK);
    let two_layers = CacheConfig {
        layers: config.layers[..2].to_vec(),
        ..config
    };
    let mut other_layout = KvCache::new(exec, two_layers).unwrap();
    let msg = assert_err_contains(
        other_layout.load_checkpoint(exec, &id, VOCAB, &r.good),
        &["does not fit this cache"],
    );
    assert!(msg.contains("layers"), "{msg}");
    assert_eq!(other_layout.position(), 0);
    // A shorter context that cannot hold the saved position: the file is
    // larger than any checkpoint of that cache, refused before reading.
    let mut short = m.new_cache(exec, 16, CHUNK).unwrap();
    assert_err_contains(
        short.load_checkpoint(exec, &id, VOCAB, &r.good),
        &["more than the", "context 16"],
    );
    assert_eq!(short.position(), 0);
    // A poisoned cache cannot be saved.
    let mut p = m.new_cache(exec, CONTEXT, CHUNK).unwrap();
    p.poison("test");
    let path = r.dir.join("poisoned.weftkv");
    assert_err_contains(p.save_checkpoint(exec, &id, &[], &path), &["poisoned"]);
    assert!(!path.exists());
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
    let listed = filled_tokens(m.config.vocab);
    let bytes = image.to_checkpoint_bytes(&id, &listed);
    assert_eq!(
        CacheImage::from_checkpoint_bytes(&bytes, &id).unwrap(),
        (image.clone(), listed)
    );
    let bytes = image.to_checkpoint_bytes(&id, &[]);
    assert_eq!(
        CacheImage::from_checkpoint_bytes(&bytes, &id).unwrap(),
        (image, Vec::new())
    );
    let a = ModelIdentity::from_parts(&[b"ab", b"c"]);
    let b = ModelIdentity::from_parts(&[b"a", b"bc"]);
    assert_ne!(a, b, "parts are length-prefixed");
}

/// Offsets of the header fields (see the format table in `checkpoint.rs`).
const ROW_TYPE: usize = 44;
const POSITION: usize = 48;
const LAYER_COUNT: usize = 52;
const LAYER_TABLE: usize = 56;

/// Offset of field `field` (0 width, 1 window, 2 first position) of `layer`.
fn layer_field(layer: usize, field: usize) -> usize {
    LAYER_TABLE + 12 * layer + 4 * field
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// The bytes with their trailing checksum recomputed: what a careless or
/// hostile writer produces.
fn resealed(mut b: Vec<u8>) -> Vec<u8> {
    let body = b.len() - 32;
    let digest: [u8; 32] = Sha256::digest(&b[..body]).into();
    b[body..].copy_from_slice(&digest);
    b
}

#[test]
fn inconsistent_fields_with_a_valid_checksum_are_refused_and_change_nothing() {
    let mut r = Refusals::new("inconsistent");
    let id = r.id;
    let layers = get_u32(&r.bytes, LAYER_COUNT) as usize;
    assert_eq!(layers, 3);
    let position = get_u32(&r.bytes, POSITION);
    assert_eq!(position, 25);
    let payload_at = LAYER_TABLE + 12 * layers;
    // The token list: its count, then one id per position, before the checksum.
    let count_at = r.bytes.len() - 32 - 4 * position as usize - 4;
    assert_eq!(get_u32(&r.bytes, count_at), position);
    // The untouched file, resealed, still loads: the edits below are what is refused.
    let same = resealed(r.bytes.clone());
    assert_eq!(same, r.bytes);

    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        (
            "f32 rows for an f16 cache",
            resealed(r.edited(|b| put_u32(b, ROW_TYPE, 0))),
            vec!["field `row type` is f32", "this cache holds f16"],
        ),
        (
            "a quantized row type",
            resealed(r.edited(|b| put_u32(b, ROW_TYPE, 8))),
            vec!["field `row type` is 8"],
        ),
        (
            "a position past the context",
            resealed(r.edited(|b| put_u32(b, POSITION, CONTEXT + 1))),
            vec!["field `position` is 65", "past the context length of 64"],
        ),
        (
            "the largest position",
            resealed(r.edited(|b| put_u32(b, POSITION, u32::MAX))),
            vec!["field `position`"],
        ),
        (
            "a wider layer",
            resealed(r.edited(|b| put_u32(b, layer_field(0, 0), 33))),
            vec!["layer 0: field `width` is 33", "holds 32"],
        ),
        (
            "the widest layer",
            resealed(r.edited(|b| put_u32(b, layer_field(2, 0), u32::MAX))),
            vec!["layer 2: field `width` is 4294967295"],
        ),
        (
            "a window removed",
            resealed(r.edited(|b| put_u32(b, layer_field(1, 1), 0))),
            vec!["layer 1: field `window` is 0", "has 6"],
        ),
        (
            "a layer's first row past the position",
            resealed(r.edited(|b| put_u32(b, layer_field(0, 2), position + 1))),
            vec![
                "layer 0: field `first position` is 26",
                "past field `position` 25",
            ],
        ),
        (
            "a windowed layer starting too early",
            resealed(r.edited(|b| put_u32(b, layer_field(1, 2), 0))),
            vec!["layer 1: field `first position` is 0", "keeps rows from 20"],
        ),
        (
            "a full layer starting late",
            resealed(r.edited(|b| put_u32(b, layer_field(2, 2), 3))),
            vec!["layer 2: field `first position` is 3", "keeps rows from 0"],
        ),
        (
            "a huge layer count",
            resealed(r.edited(|b| put_u32(b, LAYER_COUNT, u32::MAX))),
            vec!["field `layer count` announces 4294967295"],
        ),
        (
            "one layer fewer",
            resealed(r.edited(|b| put_u32(b, LAYER_COUNT, 2))),
            vec!["field `payload bytes`"],
        ),
        (
            "a huge payload",
            resealed(r.edited(|b| {
                b[payload_at..payload_at + 8].copy_from_slice(&u64::MAX.to_le_bytes())
            })),
            vec!["truncated", "field `payload bytes` = 18446744073709551615"],
        ),
        (
            "a payload longer than its layer table",
            resealed(r.edited(|b| {
                let p = u64::from_le_bytes(b[payload_at..payload_at + 8].try_into().unwrap());
                b[payload_at..payload_at + 8].copy_from_slice(&(p + 2).to_le_bytes());
                b.splice(count_at..count_at, [0u8, 0]);
            })),
            vec!["field `payload bytes` is", "the layer table needs"],
        ),
        (
            "a token count that is neither 0 nor the position",
            resealed(r.edited(|b| {
                put_u32(b, count_at, position - 1);
                b.drain(count_at + 4..count_at + 8);
            })),
            vec!["field `token count` is 24", "field `position` = 25"],
        ),
        (
            "a token count past the file",
            resealed(r.edited(|b| put_u32(b, count_at, u32::MAX))),
            vec!["truncated", "field `token count` = 4294967295"],
        ),
        (
            "a token outside the vocabulary",
            resealed(r.edited(|b| put_u32(b, count_at + 4 + 4 * 7, VOCAB))),
            vec!["token 7 is id 96", "outside the vocabulary of 96"],
        ),
    ];
    for (what, bytes, needles) in cases {
        eprintln!("case: {what}");
        r.refused(&bytes, &id, &needles);
    }
}

#[test]
fn version_1_files_without_a_token_list_still_load() {
    let mut r = Refusals::new("version-1");
    let position = get_u32(&r.bytes, POSITION);
    let count_at = r.bytes.len() - 32 - 4 * position as usize - 4;
    let v1 = resealed(r.edited(|b| {
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b.drain(count_at..b.len() - 32);
    }));
    let path = r.dir.join("v1.weftkv");
    std::fs::write(&path, &v1).unwrap();
    let info = r
        .target
        .load_checkpoint(&mut r.exec, &r.id, VOCAB, &path)
        .unwrap();
    assert_eq!((info.position, info.tokens.len()), (position, 0));
    let from_v2 = {
        let mut c = r.model.new_cache(&mut r.exec, CONTEXT, CHUNK).unwrap();
        let info = c
            .load_checkpoint(&mut r.exec, &r.id, VOCAB, &r.good)
            .unwrap();
        assert_eq!(info.tokens, filled_tokens(r.model.config.vocab));
        c.export(&mut r.exec).unwrap()
    };
    assert_eq!(r.target.export(&mut r.exec).unwrap(), from_v2);
}

#[test]
fn parsing_without_a_cache_bounds_every_field_before_allocating() {
    let r = Refusals::new("parse-bounds");
    let id = r.id;
    let parse = |b: &[u8]| CacheImage::from_checkpoint_bytes(b, &id);
    // A width whose rows would need hundreds of gigabytes: refused by the
    // payload size check, before any row is copied.
    let wide = resealed(r.edited(|b| put_u32(b, layer_field(2, 0), u32::MAX)));
    assert_err_contains(
        parse(&wide),
        &["field `payload bytes`", "layer table needs"],
    );
    let late = resealed(r.edited(|b| put_u32(b, layer_field(0, 2), 26)));
    assert_err_contains(parse(&late), &["layer 0: field `first position` is 26"]);
    let many = resealed(r.edited(|b| put_u32(b, LAYER_COUNT, u32::MAX)));
    assert_err_contains(parse(&many), &["field `layer count`"]);
    assert!(parse(&r.bytes).is_ok());
}

#[test]
fn files_larger_than_the_cache_can_hold_are_refused_before_reading() {
    let mut r = Refusals::new("oversized");
    let id = r.id;
    let bound = checkpoint_bound(r.target.config());
    let mut big = r.bytes.clone();
    big.resize(bound as usize + 1, 0);
    r.refused(&big, &id, &["more than the", "can take"]);
}

#[test]
fn the_bound_is_the_size_of_a_full_cache() {
    let dir = scratch("bound");
    let path = dir.join("full.weftkv");
    let mut exec = executor();
    let m = Tiny::new(&mut exec, TinyConfig::small()).unwrap();
    let mut c = m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap();
    let prompt = tokens(CONTEXT as usize, 4, m.config.vocab);
    m.prefill(&mut exec, &mut c, &prompt, &ChunkPolicy::single(CHUNK))
        .unwrap();
    let info = c
        .save_checkpoint(&mut exec, &identity(&m.config), &prompt, &path)
        .unwrap();
    assert_eq!(info.position, CONTEXT);
    assert_eq!(info.file_bytes, checkpoint_bound(c.config()));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn saves_leave_no_temporary_files() {
    let dir = scratch("temporaries");
    let mut exec = executor();
    let (m, cache) = filled(&mut exec);
    let id = identity(&m.config);
    let path = dir.join("seq.weftkv");
    cache.save_checkpoint(&mut exec, &id, &[], &path).unwrap();
    cache.save_checkpoint(&mut exec, &id, &[], &path).unwrap();
    // A save that cannot rename (the target is a directory) fails, names
    // the path and leaves nothing behind.
    let taken = dir.join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("inside"), b"x").unwrap();
    let msg = assert_err_contains(
        cache.save_checkpoint(&mut exec, &id, &[], &taken),
        &["KV checkpoint", "rename", "taken"],
    );
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["seq.weftkv", "taken"], "{msg}");
    std::fs::remove_dir_all(dir).ok();
}
