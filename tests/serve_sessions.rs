//! `weft serve --slots-dir DIR`: sessions saved by one server continue in
//! another exactly as they would have in the first; session names are
//! plain file names inside DIR; files of another model, truncated or
//! corrupted ones are refused with their reason and left untouched.

mod serve_common;

use serde_json::json;
use serve_common::*;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const FIRST: &str = "The old lighthouse keeper climbed the stairs every evening and";
const SECOND: &str = " Years later, his daughter";

/// A scratch directory holding the slots directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("weft-serve-sessions-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("slots")).expect("scratch directory");
        Scratch(dir)
    }

    fn slots(&self) -> PathBuf {
        self.0.join("slots")
    }

    fn slots_arg(&self) -> String {
        self.slots().to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The token list of a checkpoint file (format version 2: the position at
/// offset 48, the tokens just before the 32-byte checksum).
fn file_tokens(path: &Path) -> Vec<u64> {
    let b = std::fs::read(path).expect("the session file");
    let position = u32::from_le_bytes(b[48..52].try_into().unwrap()) as usize;
    let end = b.len() - 32;
    b[end - 4 * position..end]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as u64)
        .collect()
}

fn complete(server: &Server, prompt: serde_json::Value, session: &str) -> serde_json::Value {
    let r = post(
        server,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "session": session}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn cached(v: &serde_json::Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached tokens")
}

fn session_call(server: &Server, name: &str, action: &str) -> Reply {
    request(
        server,
        "POST",
        &format!("/v1/sessions/{name}/{action}"),
        &[],
        b"",
    )
}

#[test]
fn a_session_saved_by_one_server_continues_in_another() {
    let Some(model) = model_path() else { return };
    let dir = Scratch::new("round-trip");
    let args = [
        "--ctx",
        "512",
        "--keep",
        "2",
        "--slots-dir",
        &dir.slots_arg(),
    ];
    let a = start(&model, &args);
    // A new session: nothing cached, the file written when it finishes.
    let v = complete(&a, json!(FIRST), "talk");
    assert_eq!(cached(&v), 0);
    let talk = dir.slots().join("talk");
    let saved = file_tokens(&talk);
    let prompt_ids = weft_run_prompt_ids(&model, FIRST);
    assert_eq!(
        saved.len(),
        prompt_ids.len() + 7,
        "the prompt and 7 stepped tokens"
    );
    assert_eq!(saved[..prompt_ids.len()], prompt_ids[..]);
    std::fs::copy(&talk, dir.slots().join("fork")).expect("copy the session");
    // Continued in the same server, from the kept sequence.
    let mut extended = saved.clone();
    extended.extend(weft_run_prompt_ids(&model, SECOND));
    let in_memory = complete(&a, json!(extended), "talk");
    assert_eq!(cached(&in_memory), saved.len() as u64);
    drop(a);

    // Another server: the copy, restored explicitly, continues the same way.
    let b = start(&model, &args);
    let r = session_call(&b, "fork", "restore");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["tokens"], saved.len());
    let from_file = complete(&b, json!(extended), "fork");
    assert_eq!(cached(&from_file), saved.len() as u64);
    assert_eq!(
        from_file["choices"][0]["text"], in_memory["choices"][0]["text"],
        "the continuation after a restore"
    );
    let forked = file_tokens(&dir.slots().join("fork"));
    assert_eq!(forked[..extended.len()], extended[..]);
    assert_eq!(
        forked,
        file_tokens(&talk),
        "both sessions hold the same tokens"
    );
    // An explicit save writes the kept sequence again.
    let r = session_call(&b, "fork", "save");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["tokens"], forked.len());
    // Without a restore, a request naming a session loads its file.
    let mut third = file_tokens(&talk);
    third.extend(weft_run_prompt_ids(&model, " The end."));
    let v = complete(&b, json!(third), "talk");
    assert_eq!(cached(&v), forked.len() as u64);
    assert_eq!(names(&dir.slots()), ["fork", "talk"], "no temporary files");
}

#[test]
fn session_names_and_files_are_checked() {
    let Some(model) = model_path() else { return };
    let dir = Scratch::new("checked");
    // Sessions are off without --slots-dir.
    let off = start(&model, &["--ctx", "256"]);
    let r = post(
        &off,
        "/v1/completions",
        &json!({"prompt": FIRST, "max_tokens": 2, "session": "talk"}),
    );
    assert!(error_of(&r, 400)["message"]
        .as_str()
        .unwrap()
        .contains("--slots-dir"));
    error_of(&session_call(&off, "talk", "restore"), 400);
    drop(off);

    let s = start(&model, &["--ctx", "256", "--slots-dir", &dir.slots_arg()]);
    // Names that are not plain file names, in the request and in the path.
    for bad in ["../outside", "a/b", "/tmp/outside", ".hidden", "a b", ""] {
        let r = post(
            &s,
            "/v1/completions",
            &json!({"prompt": FIRST, "max_tokens": 2, "session": bad}),
        );
        let e = error_of(&r, 400);
        assert_eq!(e["param"], "session", "{bad:?}: {}", r.body);
    }
    for bad in ["..", "..%2Foutside", "%2Ftmp%2Foutside", "a%5Cb"] {
        for action in ["save", "restore"] {
            let e = error_of(&session_call(&s, bad, action), 400);
            assert_eq!(e["param"], "session", "{bad:?} {action}");
        }
    }
    assert_eq!(
        names(&dir.0),
        ["slots"],
        "nothing written beside the directory"
    );
    assert!(names(&dir.slots()).is_empty());
    // Nothing to act on: 404.
    let e = error_of(&session_call(&s, "missing", "restore"), 404);
    assert!(e["message"].as_str().unwrap().contains("no session file"));
    let e = error_of(&session_call(&s, "missing", "save"), 404);
    assert!(e["message"].as_str().unwrap().contains("kept in memory"));

    // A good file, then damaged copies of it.
    complete(&s, json!(FIRST), "good");
    let good = std::fs::read(dir.slots().join("good")).expect("saved");
    let reseal = |mut b: Vec<u8>| {
        let body = b.len() - 32;
        let digest: [u8; 32] = Sha256::digest(&b[..body]).into();
        b[body..].copy_from_slice(&digest);
        b
    };
    let mut foreign = good.clone();
    foreign[12..44].copy_from_slice(&[0xa5; 32]);
    let mut flipped = good.clone();
    flipped[good.len() / 3] ^= 0x01;
    let cases = [
        (
            "foreign",
            reseal(foreign),
            "written for model a5a5a5a5a5a5a5a5",
        ),
        ("cut", good[..good.len() - 77].to_vec(), "truncated"),
        ("flipped", flipped, "checksum mismatch"),
    ];
    for (name, bytes, reason) in &cases {
        let path = dir.slots().join(name);
        std::fs::write(&path, bytes).expect("write the case");
        let e = error_of(&session_call(&s, name, "restore"), 400);
        let msg = e["message"].as_str().unwrap();
        assert!(msg.contains(reason), "{name}: {msg}");
        let mut prompt = file_tokens(&dir.slots().join("good"));
        prompt.extend(weft_run_prompt_ids(&model, SECOND));
        let r = post(
            &s,
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 2, "session": name}),
        );
        let e = error_of(&r, 400);
        assert!(e["message"].as_str().unwrap().contains(reason), "{name}");
        assert_eq!(&std::fs::read(&path).expect("still there"), bytes, "{name}");
    }
    // The server still serves, and the good session still continues.
    let mut prompt = file_tokens(&dir.slots().join("good"));
    prompt.extend(weft_run_prompt_ids(&model, SECOND));
    let v = complete(&s, json!(prompt), "good");
    assert!(cached(&v) > 0);
    assert_eq!(names(&dir.slots()), ["cut", "flipped", "foreign", "good"]);
}
