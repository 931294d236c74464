//! `weft run --chat` and `weft chat` on SmolLM2, through the binary.
//!
//! The model comes from `fetch::ensure`; without it the tests print why and
//! pass, unless `WEFT_TEST_REQUIRE_MODEL=1`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use weft::models::chat::{encode_rendered, ChatTemplate, Message};
use weft::models::gguf::GgufFile;
use weft::models::tokenizer::Tokenizer;

fn smollm2() -> Option<PathBuf> {
    weft_testkit::require::model_path(&weft::models::fetch::SMOLLM2_135M_Q4_1)
}

fn weft(model: &std::path::Path, args: &[&str], stdin: Option<&str>) -> (String, String) {
    let (ok, stdout, stderr) = weft_status(model, args, stdin.unwrap_or(""));
    assert!(ok, "weft {args:?} failed:\n{stderr}");
    (stdout, stderr)
}

/// `weft ARGS --backend cpu --threads 2 --model MODEL` with `stdin`:
/// (success, stdout, stderr).
fn weft_status(model: &std::path::Path, args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .args(["--backend", "cpu", "--threads", "2", "--model"])
        .arg(model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("weft runs");
    let mut pipe = child.stdin.take().expect("stdin");
    pipe.write_all(stdin.as_bytes()).expect("write stdin");
    drop(pipe);
    let out = child.wait_with_output().expect("weft ends");
    (
        out.status.success(),
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
    )
}

fn template(model: &std::path::Path) -> (ChatTemplate, Tokenizer) {
    let file = GgufFile::open(model).expect("gguf");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let t = ChatTemplate::from_gguf(&file, &tok)
        .expect("template")
        .expect("SmolLM2 has a template");
    (t, tok)
}

const QUESTION: &str = "What is 2+2?";

#[test]
fn run_chat_renders_the_template_and_stops_at_end_of_turn() {
    let Some(model) = smollm2() else { return };
    let (stdout, _) = weft(
        &model,
        &[
            "run", "--chat", "--prompt", QUESTION, "-n", "16", "--temp", "0", "--format", "json",
        ],
        None,
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let ids = |k: &str| -> Vec<u32> { serde_json::from_value(v[k].clone()).expect("ids") };
    let (t, tok) = template(&model);
    let rendered = t.render(&[Message::new("user", QUESTION)], true).unwrap();
    assert_eq!(ids("prompt_ids"), encode_rendered(&tok, &rendered));
    let generated = ids("generated_ids");
    assert!(
        !generated.is_empty() && generated.len() < 16,
        "the answer should end at <|im_end|> before 16 tokens: {generated:?}"
    );
    let text = v["text"].as_str().unwrap();
    assert!(text.contains('4'), "{text:?}");
    for markup in ["<|im_start|>", "<|im_end|>", "assistant\n"] {
        assert!(!text.contains(markup), "{text:?}");
    }
    // With a system prompt, the template's default one is replaced.
    let (stdout, _) = weft(
        &model,
        &[
            "run",
            "--chat",
            "--system",
            "Answer with one word.",
            "--prompt",
            QUESTION,
            "-n",
            "4",
            "--temp",
            "0",
            "--format",
            "json",
        ],
        None,
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let prompt: Vec<u32> = serde_json::from_value(v["prompt_ids"].clone()).unwrap();
    let msgs = [
        Message::new("system", "Answer with one word."),
        Message::new("user", QUESTION),
    ];
    assert_eq!(
        prompt,
        encode_rendered(&tok, &t.render(&msgs, true).unwrap())
    );
}

/// `[chat] turn N: prompt P tokens, R from the cache, F prefilled` and
/// `[chat] turn N: answer A tokens, ended by ..., cache at C`.
fn numbers(line: &str) -> Vec<usize> {
    line.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect()
}

#[test]
fn chat_keeps_the_history_in_the_cache() {
    let Some(model) = smollm2() else { return };
    let second = "And what is 3+3?";
    let (stdout, stderr) = weft(
        &model,
        &["chat", "--temp", "0", "-n", "16", "--verbose"],
        Some(&format!("{QUESTION}\n{second}\n")),
    );
    let answers: Vec<&str> = stdout.lines().collect();
    assert_eq!(answers.len(), 2, "two answers: {stdout:?}");
    assert!(answers.iter().all(|a| !a.trim().is_empty()), "{stdout:?}");
    let log: Vec<&str> = stderr.lines().filter(|l| l.starts_with("[chat]")).collect();
    assert_eq!(log.len(), 4, "{stderr}");
    let (p1, a1, p2) = (numbers(log[0]), numbers(log[1]), numbers(log[2]));
    // turn 1: everything prefilled.
    assert_eq!((p1[0], p1[2], p1[3]), (1, 0, p1[1]), "{}", log[0]);
    let cached = a1[2];
    assert_eq!(
        cached,
        p1[1] + a1[1],
        "prompt and answer in the cache: {}",
        log[1]
    );
    // turn 2: the cache's ids reused, only the new ones prefilled.
    assert_eq!(p2[0], 2);
    assert_eq!(p2[2], cached, "{}", log[2]);
    assert_eq!(p2[2] + p2[3], p2[1], "{}", log[2]);
    assert!(!log[2].contains("went back"), "{}", log[2]);
    // The rendered second prompt is what the cache plus the prefill hold.
    let (t, tok) = template(&model);
    let msgs = [
        Message::new("user", QUESTION),
        Message::new("assistant", answers[0]),
        Message::new("user", second),
    ];
    let ids = encode_rendered(&tok, &t.render(&msgs, true).unwrap());
    assert_eq!(ids.len(), p2[1]);
    // The first answer is `weft run --chat`'s.
    let (run_out, _) = weft(
        &model,
        &[
            "run", "--chat", "--prompt", QUESTION, "-n", "16", "--temp", "0",
        ],
        None,
    );
    assert_eq!(run_out.trim_end_matches('\n'), answers[0]);
}

#[test]
fn chat_rolls_back_when_the_template_rewrites_history() {
    let Some(model) = smollm2() else { return };
    // ChatML that upper-cases what the assistant said: the history no longer
    // matches the answer's ids in the cache.
    let dir = std::env::temp_dir().join(format!("weft-chat-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("upper.jinja");
    std::fs::write(
        &path,
        "{% for m in messages %}<|im_start|>{{ m.role }}\n\
         {% if m.role == 'assistant' %}{{ m.content | upper }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n\
         {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    .unwrap();
    let (stdout, stderr) = weft(
        &model,
        &[
            "chat",
            "--temp",
            "0",
            "-n",
            "8",
            "-v",
            "--template",
            path.to_str().unwrap(),
        ],
        Some("Say hello.\n/reset\nSay hello.\nAgain.\n"),
    );
    std::fs::remove_dir_all(&dir).ok();
    let answers: Vec<&str> = stdout.lines().collect();
    assert_eq!(answers.len(), 3, "{stdout:?}");
    // The same first turn after /reset: the same answer.
    assert_eq!(answers[0], answers[1]);
    let log: Vec<&str> = stderr.lines().filter(|l| l.starts_with("[chat]")).collect();
    assert_eq!(log.len(), 6, "{stderr}");
    let (p1, p2, p3) = (numbers(log[0]), numbers(log[2]), numbers(log[4]));
    assert_eq!(p2[2], 0, "after /reset nothing is reused: {}", log[2]);
    assert_eq!(p1[1], p2[1]);
    // The third turn went back to the snapshot after the second prompt.
    assert!(log[4].contains("went back"), "{}", log[4]);
    assert_eq!(p3[2], p2[1], "{}", log[4]);
    assert_eq!(p3[2] + p3[3], p3[1]);
}

#[test]
fn template_errors_name_the_file_and_the_place() {
    let Some(model) = smollm2() else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args([
            "run",
            "--chat",
            "--prompt",
            "hi",
            "--template",
            "/nonexistent/t.jinja",
            "--backend",
            "cpu",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/t.jinja"), "{err}");
    // A template that fails to render says where.
    let dir = std::env::temp_dir().join(format!("weft-chat-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.jinja");
    std::fs::write(
        &path,
        "{% for m in messages %}\n{{ m.content + 1 }}{% endfor %}",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args([
            "run",
            "--chat",
            "--prompt",
            "hi",
            "--backend",
            "cpu",
            "--template",
        ])
        .arg(&path)
        .arg("--model")
        .arg(&model)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2, column 4"), "{err}");
    assert!(err.contains("m.content + 1"), "{err}");
}

#[test]
fn chat_session_continues_across_processes() {
    let Some(model) = smollm2() else { return };
    let second = "And what is 3+3?";
    let greedy = ["--temp", "0", "-n", "16"];
    let (stdout, _) = weft(
        &model,
        &["chat", "--temp", "0", "-n", "16"],
        Some(&format!("{QUESTION}\n{second}\n")),
    );
    let one_process: Vec<&str> = stdout.lines().collect();
    assert_eq!(one_process.len(), 2, "{stdout:?}");

    let dir = std::env::temp_dir().join(format!("weft-chat-session-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("talk.kv");
    let messages = dir.join("talk.kv.messages.json");
    let f = file.to_str().unwrap();
    let with_session = |extra: &[&str], input: &str| {
        let mut args: Vec<&str> = greedy.to_vec();
        args.extend(["--session", f]);
        args.extend(extra);
        weft_status(&model, &[&["chat"], &args[..]].concat(), input)
    };
    // First process: the first answer, both files written.
    let (ok, out1, err1) = with_session(&[], &format!("{QUESTION}\n"));
    assert!(ok, "{err1}");
    assert_eq!(out1.trim_end_matches('\n'), one_process[0]);
    assert!(file.is_file() && messages.is_file(), "{err1}");
    // Second process: the history comes from the files, only the new
    // message is prefilled, and the answer is the one-process answer.
    let (ok, out2, err2) = with_session(&["--verbose"], &format!("{second}\n"));
    assert!(ok, "{err2}");
    assert_eq!(out2.trim_end_matches('\n'), one_process[1]);
    let log: Vec<&str> = err2.lines().filter(|l| l.starts_with("[chat]")).collect();
    let p = numbers(log[0]);
    assert!(p[2] > 0 && p[2] + p[3] == p[1], "{}", log[0]);
    assert!(!log[0].contains("went back"), "{}", log[0]);
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&messages).unwrap()).unwrap();
    let roles: Vec<&str> = saved["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"]);

    // Refused, naming the cause, and both files left as they were: a
    // corrupted messages file, another system prompt, a cache without
    // messages (as `weft run --session` saves).
    let before = (
        std::fs::read(&file).unwrap(),
        std::fs::read(&messages).unwrap(),
    );
    let (ok, _, err) = with_session(&["--system", "Be brief."], "Hi\n");
    assert!(!ok && err.contains("--system differs"), "{err}");
    std::fs::write(&messages, b"{\"messages\": [{\"role\": \"user\"}]}").unwrap();
    let (ok, _, err) = with_session(&[], "Hi\n");
    assert!(!ok && err.contains("talk.kv.messages.json"), "{err}");
    assert!(err.contains("message 0"), "{err}");
    std::fs::write(&messages, &before.1).unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), before.0);
    std::fs::remove_file(&messages).unwrap();
    let (ok, _, err) = with_session(&[], "Hi\n");
    assert!(!ok && err.contains("no messages"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), before.0);
    std::fs::remove_dir_all(&dir).ok();
}
