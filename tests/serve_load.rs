//! A bounded load on `weft serve` over loopback: 64 concurrent streaming
//! greedy clients, twice, against a server decoding up to 16 sequences in
//! one batch step with the rest queued. Every client must get exactly the
//! tokens the same request gets alone: none lost, none duplicated, no
//! errors, no request refused.

mod serve_common;

use serve_common::*;
use std::time::{Duration, Instant};

const SUFFIXES: [&str; 8] = ["", " and", " the", " a", " in", " so", " my", " of"];
const CLIENTS: usize = 64;
const TOKENS: usize = 12;

#[test]
fn sixty_four_streaming_clients_get_their_solo_tokens() {
    let Some(model) = model_path() else { return };
    let server = start(
        &model,
        &["--parallel", "16", "--queue", "128", "--ctx", "256"],
    );
    let prompts: Vec<String> = PROMPTS
        .iter()
        .flat_map(|b| SUFFIXES.iter().map(move |s| format!("{b}{s}")))
        .collect();
    assert_eq!(prompts.len(), CLIENTS);
    // Each request alone, one after the other.
    let solo: Vec<(String, usize, String)> = prompts
        .iter()
        .map(|p| stream_completion(&server, p, TOKENS))
        .collect();
    for (p, (_, tokens, finish)) in prompts.iter().zip(&solo) {
        assert!(
            *tokens == TOKENS || finish == "stop",
            "{p:?}: {tokens} tokens, finish {finish:?}"
        );
    }
    let batch_rows_before = metric(&get(&server, "/metrics").body, "weft_batch_rows_total");
    // All at once, twice, within a bound on the whole load.
    let t0 = Instant::now();
    for round in 0..2 {
        let together: Vec<(String, usize, String)> = std::thread::scope(|s| {
            let handles: Vec<_> = prompts
                .iter()
                .map(|p| {
                    let server = &server;
                    s.spawn(move || stream_completion(server, p, TOKENS))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("client"))
                .collect()
        });
        for (i, (got, want)) in together.iter().zip(&solo).enumerate() {
            assert_eq!(
                got, want,
                "round {round}, client {i} ({:?}): concurrent and solo differ",
                prompts[i]
            );
        }
    }
    assert!(
        t0.elapsed() < Duration::from_secs(600),
        "the load took {:?}",
        t0.elapsed()
    );
    let metrics = get(&server, "/metrics").body;
    assert!(
        metric(&metrics, "weft_batch_rows_total") > batch_rows_before,
        "the concurrent clients were not decoded in batch steps: {metrics}"
    );
    assert!(
        metric(&metrics, "weft_time_to_first_token_seconds_count") >= (3 * CLIENTS) as f64,
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "weft_requests_failed_total"),
        0.0,
        "{metrics}"
    );
}
