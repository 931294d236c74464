//! A SmolLM2 session saved after a prefill and loaded into a fresh cache
//! decodes exactly as the uninterrupted run (and so does a DeepSeek-V4
//! one, saved inside its compressor windows); files of another model
//! identity, truncated, corrupted or inconsistent ones are refused with
//! their reason and leave the target cache as it was.

mod common;

use common::{load_smollm2, prefilled, reference_dir, reference_json, Setup};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use weft::models::identity::{identity_of, ModelIdentity};
use weft::models::sampling::argmax;
use weft::models::{LogitRows, Model};
use weft::runtime::cache::KvCache;
use weft::runtime::{Device, DiagnosticsConfig, ExecutorConfig, GraphExecutor};

const CONTEXT: u32 = 256;
const STEPS: usize = 24;

/// A scratch directory per test, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("weft-session-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `STEPS` greedy ids after `first`, and the logits of the first step.
fn continue_greedy(
    exec: &mut GraphExecutor,
    model: &Model,
    cache: &mut KvCache,
    first: u32,
) -> (Vec<f32>, Vec<u32>) {
    let logits = model
        .step(exec, cache, &[first], LogitRows::Last)
        .expect("first step");
    let next = argmax(&logits) as u32;
    let mut ids = vec![next];
    model
        .decode_greedy(exec, cache, next, STEPS - 1, &mut |t| {
            ids.push(t);
            true
        })
        .expect("decode");
    (logits, ids)
}

#[test]
fn a_loaded_session_decodes_like_the_uninterrupted_run() {
    let Some(Setup { mut exec, model }) = load_smollm2(2, None) else {
        return;
    };
    let dir = Scratch::new("round-trip");
    let path = dir.path("prompt.weftkv");
    let ids = model
        .tokenizer
        .encode("The old lighthouse keeper climbed the stairs every evening and");
    let (mut cache, logits) = prefilled(&mut exec, &model, CONTEXT, &ids);
    let first = argmax(&logits) as u32;
    let info = model
        .save_session(&mut exec, &cache, &ids, &path)
        .expect("save the session");
    assert_eq!(info.tokens, ids);
    assert_eq!(info.position as usize, ids.len());
    assert_eq!(info.file_bytes, std::fs::metadata(&path).unwrap().len());
    let (want_logits, want) = continue_greedy(&mut exec, &model, &mut cache, first);

    // A fresh cache that held another sequence.
    let other = model
        .tokenizer
        .encode("Unrelated words fill this cache first.");
    let (mut fresh, _) = prefilled(&mut exec, &model, CONTEXT, &other);
    let loaded = model
        .load_session(&mut exec, &mut fresh, &path)
        .expect("load the session");
    assert_eq!(loaded, info);
    assert_eq!(fresh.position() as usize, ids.len());
    let (got_logits, got) = continue_greedy(&mut exec, &model, &mut fresh, first);
    assert!(
        got_logits
            .iter()
            .zip(&want_logits)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the first step's logits differ after loading"
    );
    assert_eq!(got, want, "greedy ids after loading");

    // The identity is the canonical one, and it is computed once per model.
    let config = fresh.config();
    assert_eq!(
        model.identity(config),
        identity_of(&model.file, config).unwrap()
    );
    assert!(std::ptr::eq(model.gguf_digest(), model.gguf_digest()));
}

/// DeepSeek-V4 keeps compressor values, gates and compressed rows in its
/// cache beside the window ring: a session saved in the middle of its
/// compressor windows continues bit for bit in a fresh cache.
#[test]
fn a_deepseek4_session_saved_inside_compressor_windows_continues_exactly() {
    let fixture = reference_dir().join("dsv4_tiny/flash-tiny-short");
    let reference = reference_json("dsv4_tiny/flash-tiny-short/reference_p43.json");
    let prompt: Vec<u32> =
        serde_json::from_value(reference["prompt"]["token_ids"].clone()).expect("prompt ids");
    let config = ExecutorConfig {
        threads: 2,
        diagnostics: DiagnosticsConfig::checked(),
        ..ExecutorConfig::default()
    };
    let mut exec = GraphExecutor::with_config(Device::Cpu, config).expect("executor");
    let model = Model::load(&fixture.join("model.gguf"), &mut exec).expect("model");
    let dir = Scratch::new("deepseek4");
    let path = dir.path("dsv4.weftkv");
    // 41 tokens: inside a CSA window (41 mod 4 = 1) and an HCA window
    // (41 mod 16 = 9), after the window ring (8) wrapped.
    let mut cache = model.new_cache(&mut exec, 256, 64).expect("cache");
    let logits = model
        .step(&mut exec, &mut cache, &prompt[..41], LogitRows::Last)
        .expect("prefill");
    let first = argmax(&logits) as u32;
    model
        .save_session(&mut exec, &cache, &prompt[..41], &path)
        .expect("save");
    let decode = |exec: &mut GraphExecutor, cache: &mut KvCache| -> Vec<Vec<f32>> {
        let mut t = first;
        (0..12)
            .map(|_| {
                let l = model
                    .step(exec, cache, &[t], LogitRows::Last)
                    .expect("decode");
                t = argmax(&l) as u32;
                l
            })
            .collect()
    };
    // Decoding 12 tokens (positions 41-52) closes CSA rows 10-12 and HCA row 2.
    let want = decode(&mut exec, &mut cache);
    let mut fresh = model.new_cache(&mut exec, 256, 64).expect("cache");
    model
        .load_session(&mut exec, &mut fresh, &path)
        .expect("load");
    assert_eq!(fresh.position(), 41);
    let got = decode(&mut exec, &mut fresh);
    let bits = |v: &[Vec<f32>]| -> Vec<u32> { v.iter().flatten().map(|x| x.to_bits()).collect() };
    assert!(bits(&got) == bits(&want), "decoding after loading differs");
}

/// A saved session of one prompt and a target cache holding another.
struct Refusals {
    exec: GraphExecutor,
    model: Model,
    target: KvCache,
    dir: Scratch,
    bytes: Vec<u8>,
}

impl Refusals {
    fn new(setup: Setup, name: &str) -> Refusals {
        let Setup { mut exec, model } = setup;
        let dir = Scratch::new(name);
        let ids = model.tokenizer.encode("A saved prompt of a few words.");
        let (cache, _) = prefilled(&mut exec, &model, CONTEXT, &ids);
        let good = dir.path("good.weftkv");
        model
            .save_session(&mut exec, &cache, &ids, &good)
            .expect("save");
        let bytes = std::fs::read(&good).unwrap();
        let other = model.tokenizer.encode("The target holds this sequence.");
        let (target, _) = prefilled(&mut exec, &model, CONTEXT, &other);
        Refusals {
            exec,
            model,
            target,
            dir,
            bytes,
        }
    }

    /// Writes `bytes` and checks loading them is refused with `needles`,
    /// leaving the target's position, health and rows as they were.
    fn refused(&mut self, bytes: &[u8], needles: &[&str]) {
        let path = self.dir.path("bad.weftkv");
        std::fs::write(&path, bytes).unwrap();
        self.refused_at(&path, needles);
    }

    fn refused_at(&mut self, path: &Path, needles: &[&str]) {
        let before = self.target.export(&mut self.exec).unwrap();
        let err = self
            .model
            .load_session(&mut self.exec, &mut self.target, path)
            .expect_err("the file must be refused");
        let msg = err.to_string();
        for n in needles {
            assert!(msg.contains(n), "`{msg}` does not mention `{n}`");
        }
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert_eq!(self.target.position(), before.position(), "{msg}");
        assert!(!self.target.is_poisoned(), "{msg}");
        assert_eq!(
            self.target.export(&mut self.exec).unwrap(),
            before,
            "rows changed after: {msg}"
        );
    }
}

#[test]
fn a_session_of_another_model_identity_is_refused() {
    let Some(setup) = load_smollm2(2, None) else {
        return;
    };
    let mut r = Refusals::new(setup, "foreign");
    // The same rows saved under another model's identity (another GGUF).
    let ids = r.model.tokenizer.encode("Rows of another model.");
    let (cache, _) = prefilled(&mut r.exec, &r.model, CONTEXT, &ids);
    let foreign = r.dir.path("foreign.weftkv");
    let other = ModelIdentity::from_parts(&[b"another model's GGUF digest"]);
    cache
        .save_checkpoint(&mut r.exec, &other, &ids, &foreign)
        .expect("save");
    r.refused_at(&foreign, &["written for model", &other.short()]);
}

#[test]
fn damaged_and_inconsistent_sessions_are_refused_and_change_nothing() {
    let Some(setup) = load_smollm2(2, None) else {
        return;
    };
    let mut r = Refusals::new(setup, "damaged");
    let good = r.bytes.clone();
    let len = good.len();
    r.refused(&good[..len / 2], &["truncated"]);
    r.refused(&good[..len - 1], &["truncated"]);
    let mut flipped = good.clone();
    flipped[len / 2] ^= 0x10;
    r.refused(&flipped, &["checksum mismatch"]);

    // Fields edited and the checksum recomputed: each is named.
    let resealed = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        edit(&mut b);
        let body = b.len() - 32;
        let digest: [u8; 32] = Sha256::digest(&b[..body]).into();
        b[body..].copy_from_slice(&digest);
        b
    };
    let put = |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    // Layer 5's width (layer table at 56, 12 bytes a layer).
    let b = resealed(&|b| put(b, 56 + 12 * 5, 193));
    r.refused(&b, &["layer 5: field `width` is 193", "holds 192"]);
    // f32 rows announced for an f16 cache.
    let b = resealed(&|b| put(b, 44, 0));
    r.refused(&b, &["field `row type` is f32"]);
    // Layer 0's first row past the position.
    let b = resealed(&|b| put(b, 56 + 8, 10_000));
    r.refused(&b, &["layer 0: field `first position` is 10000"]);
    // A layer count that would allocate a huge table.
    let b = resealed(&|b| put(b, 52, u32::MAX));
    r.refused(&b, &["field `layer count`"]);
    // A listed token outside the vocabulary (the last one, before the checksum).
    let vocab = r.model.vocab() as u32;
    let b = resealed(&|b| {
        let at = b.len() - 36;
        put(b, at, vocab)
    });
    r.refused(&b, &["outside the vocabulary", &vocab.to_string()]);
}
