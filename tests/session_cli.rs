//! `weft run --session FILE` on SmolLM2, through the binary: a
//! conversation continued in a second process gives the tokens one process
//! gives when it does the same steps, and a file of another model, a
//! truncated or a corrupted one is refused with its reason and left as it
//! was.
//!
//! The model comes from `fetch::ensure`; without it the tests print why and
//! pass, unless `WEFT_TEST_REQUIRE_MODEL` is set.

mod common;

use common::{load_smollm2, Setup};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use weft::models::sampling::argmax;
use weft::models::tokenizer::EncodeOptions;
use weft::models::{LogitRows, Model};
use weft::runtime::cache::KvCache;
use weft::runtime::GraphExecutor;

const CONTEXT: u32 = 256;
const FIRST: &str = "The old lighthouse keeper climbed the stairs every evening and";
const SECOND: &str = " Years later, his daughter";

/// A scratch directory per test, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("weft-session-cli-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }

    fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn model_path() -> Option<PathBuf> {
    match weft_testkit::require::fetch_config().and_then(|c| {
        weft::models::fetch::ensure(&weft::models::fetch::SMOLLM2_135M_Q4_1, &c, &mut |_| {})
    }) {
        Ok(p) => Some(p),
        Err(e) if std::env::var_os("WEFT_TEST_REQUIRE_MODEL").is_none() => {
            eprintln!("skipping: the SmolLM2 model is not available ({e})");
            None
        }
        Err(e) => panic!("the SmolLM2 model is required: {e}"),
    }
}

/// `weft run --session FILE -p PROMPT -n N --temp 0 --format ids`: the
/// exit status, the generated ids (on success) and stderr.
fn run_session(model: &Path, file: &Path, prompt: &str, n: usize) -> (bool, Vec<u32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["run", "--backend", "cpu", "--threads", "2", "--temp", "0"])
        .args(["--numerics", "exact", "--format", "ids", "--ctx"])
        .arg(CONTEXT.to_string())
        .arg("-n")
        .arg(n.to_string())
        .arg("--prompt")
        .arg(prompt)
        .arg("--session")
        .arg(file)
        .arg("--model")
        .arg(model)
        .env_remove("WEFT_PREFILL_WINDOWS")
        .output()
        .expect("weft runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return (false, Vec::new(), stderr);
    }
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    let ids = serde_json::from_str(stdout.trim()).expect("a JSON array of ids");
    (true, ids, stderr)
}

/// Greedy generation as `weft run --temp 0` does it: the argmax of
/// `logits`, then device-side greedy steps, ending before an
/// end-of-generation token.
fn greedy(
    exec: &mut GraphExecutor,
    model: &Model,
    cache: &mut KvCache,
    logits: &[f32],
    n: usize,
) -> Vec<u32> {
    let first = argmax(logits) as u32;
    if model.tokenizer.is_eog(first) {
        return Vec::new();
    }
    let mut ids = vec![first];
    model
        .decode_greedy(exec, cache, first, n - 1, &mut |t| {
            if model.tokenizer.is_eog(t) {
                return false;
            }
            ids.push(t);
            true
        })
        .expect("decode");
    ids
}

#[test]
fn a_conversation_continued_in_a_second_process_matches_one_process() {
    let Some(path) = model_path() else { return };
    let Some(Setup { mut exec, model }) = load_smollm2(2, None) else {
        return;
    };
    let dir = Scratch::new("round-trip");
    let file = dir.0.join("talk.weftkv");
    let (ok, first_ids, err) = run_session(&path, &file, FIRST, 12);
    assert!(ok, "the first process failed: {err}");
    assert!(err.contains("session saved"), "{err}");
    let (ok, second_ids, err) = run_session(&path, &file, SECOND, 12);
    assert!(ok, "the second process failed: {err}");

    // One process doing the same steps.
    let policy = model.chunk_policy();
    let mut cache = model
        .new_cache(&mut exec, CONTEXT, policy.max_chunk())
        .expect("cache");
    let mut history = model.tokenizer.encode(FIRST);
    let logits = model
        .prefill(&mut exec, &mut cache, &history, &policy, LogitRows::Last)
        .expect("prefill");
    let want_first = greedy(&mut exec, &model, &mut cache, &logits, 12);
    assert_eq!(first_ids, want_first, "the first process's tokens");
    history.extend(&want_first);
    let held = cache.position() as usize;
    model
        .prefill(
            &mut exec,
            &mut cache,
            &history[held..],
            &policy,
            LogitRows::Last,
        )
        .expect("the last token");
    let second = model.tokenizer.encode_with(
        SECOND,
        EncodeOptions {
            add_special: false,
            parse_special: false,
        },
    );
    history.extend(&second);
    let logits = model
        .prefill(&mut exec, &mut cache, &second, &policy, LogitRows::Last)
        .expect("prefill the second prompt");
    let want_second = greedy(&mut exec, &model, &mut cache, &logits, 12);
    assert_eq!(second_ids, want_second, "the second process's tokens");
    history.extend(&want_second);

    // The file holds the whole conversation.
    let mut loaded = model
        .new_cache(&mut exec, CONTEXT, policy.max_chunk())
        .expect("cache");
    let info = model
        .load_session(&mut exec, &mut loaded, &file)
        .expect("load the saved conversation");
    assert_eq!(info.tokens, history);
    assert_eq!(dir.entries(), ["talk.weftkv"], "no temporary files remain");
}

#[test]
fn foreign_truncated_and_corrupted_sessions_are_refused_and_left_untouched() {
    let Some(path) = model_path() else { return };
    let dir = Scratch::new("refused");
    let good = dir.0.join("good.weftkv");
    let (ok, _, err) = run_session(&path, &good, FIRST, 4);
    assert!(ok, "{err}");
    let bytes = std::fs::read(&good).expect("the saved session");
    let reseal = |mut b: Vec<u8>| {
        let body = b.len() - 32;
        let digest: [u8; 32] = Sha256::digest(&b[..body]).into();
        b[body..].copy_from_slice(&digest);
        b
    };
    let hex = |b: &[u8]| -> String { b.iter().map(|x| format!("{x:02x}")).collect() };
    let own = hex(&bytes[12..20]);
    // The identity (bytes 12..44) of another model, the checksum recomputed.
    let mut foreign = bytes.clone();
    foreign[12..44].copy_from_slice(&[0x5a; 32]);
    let foreign = reseal(foreign);
    let mut flipped = bytes.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x08;
    let cases: Vec<(&str, Vec<u8>, Vec<String>)> = vec![
        (
            "another model",
            foreign,
            vec![
                "written for model 5a5a5a5a5a5a5a5a".into(),
                format!("belongs to model {own}"),
            ],
        ),
        (
            "truncated",
            bytes[..bytes.len() - 1000].to_vec(),
            vec!["truncated".into()],
        ),
        ("corrupted", flipped, vec!["checksum mismatch".into()]),
    ];
    for (what, content, needles) in cases {
        let file = dir.0.join(format!("{}.weftkv", what.replace(' ', "-")));
        std::fs::write(&file, &content).expect("write the case");
        let (ok, _, err) = run_session(&path, &file, SECOND, 4);
        assert!(!ok, "{what}: the file must be refused");
        for n in &needles {
            assert!(err.contains(n.as_str()), "{what}: `{err}` lacks `{n}`");
        }
        assert!(err.contains(&file.display().to_string()), "{what}: {err}");
        assert_eq!(
            std::fs::read(&file).expect("still there"),
            content,
            "{what}: the file changed"
        );
    }
    assert_eq!(
        dir.entries(),
        [
            "another-model.weftkv",
            "corrupted.weftkv",
            "good.weftkv",
            "truncated.weftkv"
        ],
        "no temporary files remain"
    );
}
