//! What the `weft serve` tests share: starting the release binary on a
//! free port, a small HTTP/1.1 client over `TcpStream`, SSE parsing, and
//! `weft run` for reference tokens.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Short prompts the tests send, one per client.
pub const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Once upon a time",
    "The three primary colors are",
    "def fibonacci(n):",
    "My favourite food is",
    "Water boils at",
    "The quick brown fox",
    "In 1969, astronauts",
];

/// A running server, killed when dropped.
pub struct Server {
    pub child: Child,
    pub addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The SmolLM2 path, or `None` (skipping) when it cannot be had.
pub fn model_path() -> Option<String> {
    weft_testkit::require::model_path(&weft::models::fetch::SMOLLM2_135M_Q4_1)
        .map(|p| p.to_string_lossy().into_owned())
}

/// Starts `weft serve --port 0 ARGS` and waits until `/health` says ok.
pub fn start(model: &str, args: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--model", model, "--port", "0", "--threads", "1"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start weft serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the address line");
    let addr = line
        .trim()
        .strip_prefix("weft serve: listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let server = Server { child, addr };
    let t0 = Instant::now();
    loop {
        let r = get(&server, "/health");
        if r.status == 200 {
            assert_eq!(r.json()["status"], "ok");
            break;
        }
        assert_eq!(r.status, 503, "health while loading: {}", r.body);
        assert_eq!(r.json()["status"], "loading");
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the model never loaded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }

    /// The `data:` payloads of a server-sent event stream, checking the
    /// framing: every event is one `data:` line followed by a blank line.
    pub fn events(&self) -> Vec<String> {
        let mut out = Vec::new();
        for block in self.body.split("\n\n") {
            if block.is_empty() {
                continue;
            }
            assert!(!block.contains('\n'), "one line per event: {block:?}");
            let data = block
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("an event that is not `data: `: {block:?}"));
            out.push(data.to_string());
        }
        assert!(self.body.ends_with("\n\n"), "the stream ends an event");
        out
    }
}

/// Decodes a `Transfer-Encoding: chunked` body.
pub fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = std::str::from_utf8(&raw[..eol]).expect("chunk size");
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .expect("hex chunk size");
        if size == 0 {
            return out;
        }
        raw = &raw[eol + 2..];
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// One HTTP/1.1 exchange (`Connection: close`).
pub fn request(server: &Server, method: &str, path: &str, headers: &[&str], body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(&server.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).ok();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
        server.addr,
        body.len()
    );
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("send head");
    // A refused body may be answered before it is all sent.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(&raw)));
    let headers = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    let status = headers
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    Reply {
        status,
        headers,
        body: String::from_utf8(body).expect("utf-8 body"),
    }
}

pub fn get(server: &Server, path: &str) -> Reply {
    request(server, "GET", path, &[], b"")
}

pub fn post(server: &Server, path: &str, body: &serde_json::Value) -> Reply {
    request(server, "POST", path, &[], body.to_string().as_bytes())
}

/// Asserts OpenAI's error shape and returns the error object.
pub fn error_of(r: &Reply, status: u16) -> serde_json::Value {
    assert_eq!(r.status, status, "{}", r.body);
    let e = r.json()["error"].clone();
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        r.body
    );
    assert!(e["type"].is_string(), "{}", r.body);
    e
}

/// `weft run --temp 0 -n N --format json`: (text, ids).
pub fn weft_run(model: &str, prompt: &str, n: usize) -> (String, Vec<u64>) {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args([
            "run",
            "--model",
            model,
            "--threads",
            "1",
            "--temp",
            "0",
            "--format",
            "json",
        ])
        .args(["--prompt", prompt, "-n", &n.to_string()])
        .output()
        .expect("weft run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("run json");
    let ids = v["generated_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|i| i.as_u64().expect("id"))
        .collect();
    (v["text"].as_str().expect("text").to_string(), ids)
}

/// A streamed greedy completion: (text, chunks with text, finish reason).
pub fn stream_completion(server: &Server, prompt: &str, n: usize) -> (String, usize, String) {
    let r = post(
        server,
        "/v1/completions",
        &serde_json::json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    let events = r.events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.body
    );
    let mut text = String::new();
    let mut tokens = 0;
    let mut finish = String::new();
    for e in &events[..events.len() - 1] {
        let v: serde_json::Value = serde_json::from_str(e).expect("chunk json");
        assert_eq!(v["object"], "text_completion");
        let c = &v["choices"][0];
        match c["finish_reason"].as_str() {
            Some(f) => finish = f.to_string(),
            None => {
                tokens += 1;
                text.push_str(c["text"].as_str().expect("chunk text"));
            }
        }
    }
    (text, tokens, finish)
}

/// A streamed greedy completion read as it arrives: (text, the arrival
/// time of each token chunk). `started` hears of the first token.
pub fn timed_stream(
    server: &Server,
    prompt: &str,
    n: usize,
    started: Option<std::sync::mpsc::Sender<()>>,
) -> (String, Vec<Instant>) {
    let body =
        serde_json::json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": true});
    let mut s = TcpStream::connect(&server.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).ok();
    let body = body.to_string();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut text = String::new();
    let mut times = Vec::new();
    let mut line = String::new();
    let mut reader = BufReader::new(s);
    loop {
        line.clear();
        if reader.read_line(&mut line).expect("read") == 0 {
            break;
        }
        let Some(data) = line.trim().strip_prefix("data: {") else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&format!("{{{data}")).expect("chunk");
        if v["choices"][0]["finish_reason"].is_null() {
            times.push(Instant::now());
            text.push_str(v["choices"][0]["text"].as_str().expect("text"));
            if let (1, Some(tx)) = (times.len(), &started) {
                let _ = tx.send(());
            }
        }
    }
    (text, times)
}

/// `weft tokenize`'s ids of `prompt`.
pub fn weft_run_prompt_ids(model: &str, prompt: &str) -> Vec<u64> {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["tokenize", "--model", model, "--text", prompt])
        .output()
        .expect("weft tokenize");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("ids")
}

/// The value of an unlabelled metric.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in {text}"))
}

/// Runs `scripts/serve_openai_check.py` when python3 can import `openai`
/// (`WEFT_TEST_REQUIRE_OPENAI=1`: required).
pub fn openai_check(server: &Server, id: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/serve_openai_check.py");
    let has = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        use weft_testkit::require::{skip_or_fail, REQUIRE_OPENAI};
        skip_or_fail(
            REQUIRE_OPENAI,
            "python3 cannot import openai (pip install openai) for the openai client check",
        );
        return;
    }
    let out = Command::new("python3")
        .args([script, &format!("http://{}/v1", server.addr), id])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "serve_openai_check.py failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Opens a streamed completion and reads until its first token chunk;
/// returns the socket (dropping it disconnects).
pub fn open_stream(
    server: &Server,
    headers: &[&str],
    body: &serde_json::Value,
) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(&server.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let body = body.to_string();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        headers.iter().map(|h| format!("{h}\r\n")).collect::<String>(),
        body.len()
    )
    .expect("send");
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).expect("read the stream");
        assert!(n > 0, "the stream ended before its first token");
        if line.starts_with("data: {") {
            return reader;
        }
    }
}

pub fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
