//! How long loading a tokenizer and tokenizing a 35 KB text take, on the
//! real models: `cargo bench -p weft-models --bench tokenizer_speed`
//! prints the medians of five runs (a model that cannot be fetched is
//! skipped with a message, or fails under `WEFT_TEST_REQUIRE_MODEL=1`).
//!
//! Targets (release, this project's 2-core build machine): SmolLM2 load
//! < 50 ms, Gemma 3 load < 300 ms, 35 KB tokenized in well under 100 ms.

use std::time::{Duration, Instant};

use weft_models::fetch::{ModelSpec, GEMMA3_270M_Q4_K_M, SMOLLM2_135M_Q4_1};
use weft_models::gguf::GgufFile;
use weft_models::tokenizer::{EncodeOptions, Tokenizer};

const CORPUS: &str = "/usr/share/common-licenses/GPL-3";

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn measure(spec: &ModelSpec) {
    let Some(path) = weft_testkit::require::model_path(spec) else {
        return;
    };
    let file = GgufFile::open(&path).expect("the cached model opens");
    let mut loads = Vec::new();
    let mut tokenizer = None;
    for _ in 0..5 {
        let start = Instant::now();
        tokenizer = Some(Tokenizer::from_gguf(&file).expect("the tokenizer loads"));
        loads.push(start.elapsed());
    }
    let Some(tokenizer) = tokenizer else { return };
    let load = median(loads);
    let Ok(text) = std::fs::read_to_string(CORPUS) else {
        return eprintln!(
            "{}: load {load:?}; {CORPUS} missing, no encode timing",
            spec.name
        );
    };
    let mut encodes = Vec::new();
    let mut n_tokens = 0;
    for _ in 0..5 {
        let start = Instant::now();
        n_tokens = tokenizer.encode(&text).len();
        encodes.push(start.elapsed());
    }
    let encode = median(encodes);
    let start = Instant::now();
    let parse = EncodeOptions {
        add_special: true,
        parse_special: true,
    };
    let n_parsed = tokenizer.encode_with(&text, parse).len();
    let encode_special = start.elapsed();
    let ids = tokenizer.encode(&text);
    let start = Instant::now();
    let decoded = tokenizer.decode(&ids, false).expect("ids in range");
    let decode = start.elapsed();
    eprintln!(
        "{}: load {load:?} ({} tokens); encode {} bytes -> {n_tokens} tokens in {encode:?} \
         ({:.1} MB/s); with parse_special {encode_special:?}; decode {decode:?}",
        spec.name,
        tokenizer.n_tokens(),
        text.len(),
        text.len() as f64 / encode.as_secs_f64() / 1e6,
    );
    assert_eq!(decoded.len(), text.len(), "the corpus round-trips");
    assert_eq!(n_parsed, n_tokens, "the corpus has no special-token text");
}

fn main() {
    measure(&SMOLLM2_135M_Q4_1);
    measure(&GEMMA3_270M_Q4_K_M);
}
