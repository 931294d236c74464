//! `weft serve` against real clients: the release binary on a free
//! loopback port with SmolLM2, spoken to over raw HTTP/1.1, `curl`, and
//! the official `openai` Python package (`scripts/serve_openai_check.py`).

mod serve_common;

use serve_common::*;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn serve_openai_endpoints_streaming_and_concurrency() {
    let Some(model) = model_path() else { return };
    let server = start(
        &model,
        &["--parallel", "4", "--ctx", "512", "--prefill-chunk", "32"],
    );

    // /v1/models names the served id.
    let models = get(&server, "/v1/models").json();
    let id = models["data"][0]["id"]
        .as_str()
        .expect("model id")
        .to_string();
    assert_eq!(id, "SmolLM2-135M-Instruct.Q4_1");

    // Greedy completions are `weft run --temp 0`'s tokens.
    let (run_text, run_ids) = weft_run(&model, PROMPTS[0], 16);
    assert_eq!(run_ids.len(), 16);
    let r = post(
        &server,
        "/v1/completions",
        &serde_json::json!({"model": id, "prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0}),
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], run_text.as_str(), "{}", r.body);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 16);
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    // Prefix reuse: a prompt that extends the finished sequence (its
    // prompt and generated ids) continues from its cache and gives the
    // tokens an uninterrupted greedy run gives.
    let ids = weft_run_prompt_ids(&model, PROMPTS[0]);
    let (run_text_32, run_ids_32) = weft_run(&model, PROMPTS[0], 32);
    assert!(run_text_32.starts_with(&run_text));
    let extended: Vec<u64> = ids.iter().chain(&run_ids_32[..16]).copied().collect();
    let r = post(
        &server,
        "/v1/completions",
        &serde_json::json!({"prompt": extended, "max_tokens": 16, "temperature": 0}),
    );
    let v = r.json();
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"],
        ids.len() + 15,
        "{}",
        r.body
    );
    assert_eq!(
        v["choices"][0]["text"],
        &run_text_32[run_text.len()..],
        "{}",
        r.body
    );
    // Token ids in, the same tokens out (the kept prompt end, no prefill).
    let r = post(
        &server,
        "/v1/completions",
        &serde_json::json!({"prompt": ids, "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(r.json()["choices"][0]["text"], run_text.as_str());
    assert_eq!(
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        ids.len()
    );

    // Streaming: the same text, one chunk per token, framed as SSE.
    let (text, chunks, finish) = stream_completion(&server, PROMPTS[0], 16);
    assert_eq!(text, run_text);
    assert_eq!(chunks, 16);
    assert_eq!(finish, "length");

    // Stop strings cut before the stop, streamed or not.
    let stop = "United";
    let cut = &run_text[..run_text.find(stop).expect("the stop occurs")];
    for stream in [false, true] {
        let r = post(
            &server,
            "/v1/completions",
            &serde_json::json!({"prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0, "stop": [stop], "stream": stream}),
        );
        let text: String = if stream {
            let events = r.events();
            events[..events.len() - 1]
                .iter()
                .map(|e| {
                    let v: serde_json::Value = serde_json::from_str(e).expect("chunk");
                    v["choices"][0]["text"].as_str().unwrap_or("").to_string()
                })
                .collect()
        } else {
            assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");
            r.json()["choices"][0]["text"]
                .as_str()
                .expect("text")
                .to_string()
        };
        assert_eq!(text, cut, "stream = {stream}");
    }

    // Chat: streamed deltas add up to the whole answer; usage counts.
    let chat = serde_json::json!({
        "model": id,
        "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "max_tokens": 12, "temperature": 0, "logprobs": true, "top_logprobs": 3,
    });
    let whole = post(&server, "/v1/chat/completions", &chat).json();
    let answer = whole["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let lps = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs");
    let completion = whole["usage"]["completion_tokens"].as_u64().expect("usage") as usize;
    assert_eq!(lps.len(), completion);
    for lp in lps {
        let top = lp["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 3);
        let best = top[0]["logprob"].as_f64().expect("lp");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(lp["logprob"].as_f64(), Some(best));
        assert!(best <= 0.0);
    }
    let mut streamed = chat.clone();
    streamed["stream"] = true.into();
    streamed["stream_options"] = serde_json::json!({"include_usage": true});
    let r = post(&server, "/v1/chat/completions", &streamed);
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let deltas: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(deltas, answer);
    let usage = &chunks.last().expect("usage chunk")["usage"];
    assert_eq!(usage["completion_tokens"].as_u64(), Some(completion as u64));

    // curl reads the same SSE framing.
    let curl = Command::new("curl")
        .args(["-sN", &format!("http://{}/v1/completions", server.addr)])
        .args(["-H", "Content-Type: application/json", "-d"])
        .arg(serde_json::json!({"prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0, "stream": true}).to_string())
        .output();
    match curl {
        Ok(out) if out.status.success() => {
            let body = String::from_utf8(out.stdout).expect("utf-8");
            let reply = Reply {
                status: 200,
                headers: String::new(),
                body,
            };
            let events = reply.events();
            assert_eq!(events.len(), 16 + 2, "16 tokens, the finish chunk, [DONE]");
            assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        }
        other => panic!("curl failed: {other:?}"),
    }

    // Concurrency: every prompt alone, then all eight at once, streaming
    // (up to four sequences decoding in one batch step); each client gets
    // exactly its solo tokens.
    let solo: Vec<(String, usize, String)> = PROMPTS
        .iter()
        .map(|p| stream_completion(&server, p, 16))
        .collect();
    let (run_text_1, _) = weft_run(&model, PROMPTS[1], 16);
    assert_eq!(solo[1].0, run_text_1);
    let together: Vec<(String, usize, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let server = &server;
                s.spawn(move || stream_completion(server, p, 16))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    });
    assert_eq!(together, solo);
    let metrics = get(&server, "/metrics").body;
    assert!(
        metric(&metrics, "weft_prompt_tokens_cached_total") > 0.0,
        "{metrics}"
    );
    assert!(metric(&metrics, "weft_time_to_first_token_seconds_count") >= 8.0);
    // The concurrent streams decoded in batch steps (each row its own
    // sequence), and still got their solo tokens.
    assert!(
        metric(&metrics, "weft_batch_rows_total") >= 2.0,
        "{metrics}"
    );
    wait_for("an idle engine", || {
        metric(&get(&server, "/metrics").body, "weft_batch_size") == 0.0
    });

    // A long prompt is prefilled 32 tokens a round while another sequence
    // keeps decoding, and still gives `weft run`'s tokens (one chunk there).
    let long_prompt = "The history of the city includes many events, and ".repeat(30);
    let (long_text, _) = weft_run(&model, &long_prompt, 8);
    let (decoding, (submitted, long)) = std::thread::scope(|s| {
        let (started, first_token) = std::sync::mpsc::channel();
        let server = &server;
        let a = s.spawn(move || timed_stream(server, PROMPTS[5], 48, Some(started)));
        first_token.recv().expect("the first stream started");
        let submitted = Instant::now();
        let b = timed_stream(server, &long_prompt, 8, None);
        (a.join().expect("decoding client"), (submitted, b))
    });
    assert_eq!(long.0, long_text);
    assert_eq!(decoding.1.len(), 48);
    let first_long = long.1[0];
    let between = decoding
        .1
        .iter()
        .filter(|&&t| t > submitted && t < first_long)
        .count();
    assert!(
        between >= 8,
        "only {between} tokens of the other stream while 300 prompt tokens were prefilled"
    );

    // The official client.
    openai_check(&server, &id);
}

#[test]
fn serve_refuses_bad_requests() {
    let Some(model) = model_path() else { return };
    let server = start(
        &model,
        &[
            "--parallel",
            "1",
            "--queue",
            "1",
            "--ctx",
            "64",
            "--max-body",
            "4096",
            "--api-key",
            "sekrit",
        ],
    );
    let key = "Authorization: Bearer sekrit";
    let call = |path: &str, body: &serde_json::Value| {
        request(&server, "POST", path, &[key], body.to_string().as_bytes())
    };
    let ok = serde_json::json!({"prompt": "Hello", "max_tokens": 2, "temperature": 0});

    // The key: missing or wrong is 401; /health needs none.
    let e = error_of(&post(&server, "/v1/completions", &ok), 401);
    assert_eq!(e["code"], "invalid_api_key");
    let wrong = request(
        &server,
        "POST",
        "/v1/completions",
        &["Authorization: Bearer sekriT"],
        ok.to_string().as_bytes(),
    );
    assert_eq!(error_of(&wrong, 401)["code"], "invalid_api_key");
    assert_eq!(
        error_of(&get(&server, "/v1/models"), 401)["code"],
        "invalid_api_key"
    );
    assert_eq!(get(&server, "/health").status, 200);
    assert_eq!(call("/v1/completions", &ok).status, 200);

    // Malformed JSON, wrong types, oversized bodies, unknown models and routes.
    let r = request(&server, "POST", "/v1/completions", &[key], b"{\"prompt\": ");
    assert!(error_of(&r, 400)["message"]
        .as_str()
        .unwrap_or("")
        .contains("not valid JSON"));
    let r = call(
        "/v1/chat/completions",
        &serde_json::json!({"messages": "hi"}),
    );
    error_of(&r, 400);
    let big = serde_json::json!({"prompt": "x".repeat(5000)});
    let r = call("/v1/completions", &big);
    assert!(error_of(&r, 413)["message"]
        .as_str()
        .unwrap_or("")
        .contains("4096"));
    let r = call(
        "/v1/completions",
        &serde_json::json!({"model": "gpt-4", "prompt": "Hi"}),
    );
    let e = error_of(&r, 404);
    assert_eq!(e["code"], "model_not_found");
    assert!(e["message"].as_str().unwrap_or("").contains("gpt-4"));
    let r = call(
        "/v1/completions",
        &serde_json::json!({"prompt": "Hi", "n": 2}),
    );
    assert_eq!(error_of(&r, 400)["param"], "n");
    let r = request(&server, "GET", "/v1/nothing", &[key], b"");
    error_of(&r, 404);

    // A prompt longer than the context: 400 naming both lengths.
    let long = "one two three four five six seven eight nine ten ".repeat(10);
    let r = call(
        "/v1/completions",
        &serde_json::json!({"prompt": long, "max_tokens": 4}),
    );
    let e = error_of(&r, 400);
    assert_eq!(e["code"], "context_length_exceeded");
    let msg = e["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("the prompt has 101 tokens") && msg.contains("64"),
        "{msg}"
    );
    // The same error before a stream starts: a status, not an event.
    let r = call(
        "/v1/completions",
        &serde_json::json!({"prompt": long, "stream": true}),
    );
    error_of(&r, 400);
}

#[test]
fn serve_bounds_its_queue_and_cancels_a_dropped_stream() {
    let Some(model) = model_path() else { return };
    let server = start(
        &model,
        &["--parallel", "1", "--queue", "1", "--ctx", "4096"],
    );
    let metrics = || get(&server, "/metrics").body;
    let ok = serde_json::json!({"prompt": "Hello", "max_tokens": 2, "temperature": 0});
    // The queue: one running, one waiting, the next refused with 503. The
    // running stream cannot end on its own before the test drops it: it
    // never draws an end-of-generation token and asks for 4,000 tokens.
    let running = open_stream(
        &server,
        &[],
        &serde_json::json!({"prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0,
            "ignore_eos": true, "stream": true}),
    );
    let waiting = std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            post(
                &server,
                "/v1/completions",
                &serde_json::json!({"prompt": "Hi", "max_tokens": 4, "temperature": 0}),
            )
        });
        wait_for("a queued request", || {
            metric(&metrics(), "weft_queue_depth") == 1.0
        });
        let r = post(&server, "/v1/completions", &ok);
        error_of(&r, 503);
        assert!(r.header("retry-after").is_some(), "{}", r.headers);
        // The client of the running request goes away mid-stream: its
        // sequence is cancelled and the waiting request runs.
        drop(running);
        waiting.join().expect("waiting client")
    });
    assert_eq!(waiting.status, 200, "{}", waiting.body);
    wait_for("an idle engine", || {
        metric(&metrics(), "weft_batch_size") == 0.0
    });
    let m = metrics();
    let generated = metric(&m, "weft_completion_tokens_total");
    assert!(generated < 4000.0, "the cancelled stream ran on: {m}");
}

#[test]
fn serve_recovers_failed_steps_times_out_and_shuts_down() {
    let Some(model) = model_path() else { return };
    let (run_text, _) = weft_run(&model, PROMPTS[2], 16);
    // The 100th ffn_gate node fails once: a decode step of the first request.
    let server = start(
        &model,
        &[
            "--inject-fault",
            "ffn_gate:100",
            "--timeout",
            "8",
            "--shutdown-grace",
            "4",
        ],
    );
    let r = post(
        &server,
        "/v1/completions",
        &serde_json::json!({"prompt": PROMPTS[2], "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], run_text.as_str());
    let m = get(&server, "/metrics").body;
    assert_eq!(metric(&m, "weft_lane_recoveries_total"), 1.0, "{m}");

    // A request past its time limit: 504.
    let r = post(
        &server,
        "/v1/completions",
        &serde_json::json!({"prompt": "Count:", "max_tokens": 3000, "temperature": 0}),
    );
    assert_eq!(error_of(&r, 504)["code"], "timeout");

    // SIGTERM mid-stream: a short stream still finishes; one that would
    // outlast --shutdown-grace is cancelled with an error event (no
    // [DONE]); then the server exits.
    let mut short = open_stream(
        &server,
        &[],
        &serde_json::json!({"prompt": PROMPTS[3], "max_tokens": 16, "temperature": 0, "stream": true}),
    );
    let mut long = open_stream(
        &server,
        &[],
        &serde_json::json!({"prompt": PROMPTS[4], "max_tokens": 3000, "temperature": 0, "stream": true}),
    );
    let pid = server.child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let mut rest = String::new();
    let _ = short.read_to_string(&mut rest);
    assert!(rest.contains("data: [DONE]"), "the stream was cut: {rest}");
    let tokens = rest.matches("\"finish_reason\":null").count();
    assert_eq!(tokens, 15, "the tokens after the first: {rest}");
    let mut rest = String::new();
    let _ = long.read_to_string(&mut rest);
    assert!(!rest.contains("[DONE]"), "the long stream finished: {rest}");
    assert!(rest.contains("shutting down"), "no error event: {rest}");
    let mut server = server;
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = server.child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the server did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
    assert!(TcpStream::connect(&server.addr).is_err(), "still accepting");
}

#[test]
fn serve_reports_a_model_that_fails_to_load_as_degraded() {
    let dir = std::env::temp_dir().join(format!("weft-serve-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bad = dir.join("broken.gguf");
    std::fs::write(&bad, b"this is not a GGUF file").expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--port", "0", "--threads", "1", "--model"])
        .arg(&bad)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start weft serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the address line");
    let addr = line
        .trim()
        .strip_prefix("weft serve: listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let server = Server { child, addr };
    wait_for("a degraded health", || {
        get(&server, "/health").body.contains("degraded")
    });
    let h = get(&server, "/health");
    assert_eq!(h.status, 503);
    assert!(
        h.json()["reason"]
            .as_str()
            .unwrap_or("")
            .contains("failed to load"),
        "{}",
        h.body
    );
    let r = post(
        &server,
        "/v1/completions",
        &serde_json::json!({"prompt": "Hi"}),
    );
    let e = error_of(&r, 503);
    assert!(
        e["message"].as_str().unwrap_or("").contains("broken.gguf"),
        "{}",
        r.body
    );
    assert!(r.header("retry-after").is_some());
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
