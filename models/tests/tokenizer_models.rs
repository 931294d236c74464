//! The tokenizers of the real models against llama.cpp.
//!
//! - `tests/reference/{smollm2,gemma3}.json` (in the workspace root;
//!   `WEFT_TEST_REFERENCE_DIR` overrides the folder): llama.cpp's prompt ids and
//!   greedy continuations for the reference prompts;
//! - `tests/data/tokenizer_cases_{smollm2,gemma3}.json`: a few hundred varied
//!   strings tokenized by llama.cpp itself, random id sequences rendered by
//!   it, and its token attributes and end-of-generation set (made by
//!   `scripts/gen_tokenizer_cases.py`).
//!
//! The models come from `fetch::ensure` (`$WEFT_CACHE` or the user's cache,
//! fetched on first use). When one cannot be obtained the test prints why and
//! passes, unless `WEFT_TEST_REQUIRE_MODEL=1` (CI sets it).

use std::sync::OnceLock;
use std::time::Instant;

use serde_json::Value;
use sha2::{Digest, Sha256};
use weft_models::fetch::{ModelSpec, GEMMA3_270M_Q4_K_M, SMOLLM2_135M_Q4_1};
use weft_models::gguf::GgufFile;
use weft_models::tokenizer::{EncodeOptions, ModelKind, TokenId, Tokenizer, Vocab};

use weft_testkit::reference::reference_json;
const DATA_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

/// A model's vocabulary and tokenizer.
struct Loaded {
    vocab: Vocab,
    tokenizer: Tokenizer,
}

fn load(spec: &ModelSpec) -> Option<Loaded> {
    let path = weft_testkit::require::model_path(spec)?;
    let file = GgufFile::open(&path).expect("the cached model opens");
    let start = Instant::now();
    let tokenizer = Tokenizer::from_gguf(&file).expect("the tokenizer loads");
    eprintln!("{}: tokenizer loaded in {:?}", spec.name, start.elapsed());
    let vocab = Vocab::from_gguf(&file).expect("the vocabulary reads");
    Some(Loaded { vocab, tokenizer })
}

fn smollm2() -> Option<&'static Loaded> {
    static LOADED: OnceLock<Option<Loaded>> = OnceLock::new();
    LOADED.get_or_init(|| load(&SMOLLM2_135M_Q4_1)).as_ref()
}

fn gemma3() -> Option<&'static Loaded> {
    static LOADED: OnceLock<Option<Loaded>> = OnceLock::new();
    LOADED.get_or_init(|| load(&GEMMA3_270M_Q4_K_M)).as_ref()
}

fn read_json(path: &str) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read test file {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {path}: {e}"))
}

fn ids(value: &Value) -> Vec<TokenId> {
    value
        .as_array()
        .expect("an id array")
        .iter()
        .map(|v| v.as_u64().expect("an id") as TokenId)
        .collect()
}

/// Prompt ids and greedy continuations of the reference file.
fn check_reference(tokenizer: &Tokenizer, file: &str) {
    let reference = reference_json(file);
    let cases = reference["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for case in cases {
        let text = case["text"].as_str().expect("text");
        assert_eq!(
            tokenizer.encode(text),
            ids(&case["prompt_ids"]),
            "prompt ids of {text:?}"
        );
        let greedy = ids(&case["greedy_ids"]);
        let expected = case["greedy_text"].as_str().expect("greedy_text");
        assert_eq!(
            tokenizer.decode(&greedy, false).expect("ids in range"),
            expected,
            "greedy text"
        );
        let mut stream = tokenizer.stream_decoder(false);
        let mut streamed = String::new();
        for &id in &greedy {
            streamed += &stream.push(id).expect("id in range");
        }
        streamed += &stream.flush();
        assert_eq!(streamed, expected, "streamed greedy text");
    }
}

#[test]
fn smollm2_reference_prompts_and_continuations() {
    let Some(Loaded { tokenizer, .. }) = smollm2() else {
        return;
    };
    assert_eq!(tokenizer.kind(), ModelKind::Bpe);
    assert_eq!(tokenizer.pre_tokenizer(), Some("smollm"));
    assert!(!tokenizer.add_bos());
    check_reference(tokenizer, "smollm2.json");
}

#[test]
fn gemma3_reference_prompts_and_continuations() {
    let Some(Loaded { tokenizer, .. }) = gemma3() else {
        return;
    };
    assert_eq!(tokenizer.kind(), ModelKind::Spm);
    assert!(tokenizer.add_bos());
    check_reference(tokenizer, "gemma3.json");
}

/// Every generated encode case; returns (passed, total) after printing the
/// first failures.
fn check_encode_cases(tokenizer: &Tokenizer, cases: &Value) -> (usize, usize) {
    let cases = cases.as_array().expect("encode cases");
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let options = EncodeOptions {
            add_special: case
                .get("add_special")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            parse_special: case
                .get("parse_special")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        };
        let got = tokenizer.encode_with(text, options);
        let expected = ids(&case["ids"]);
        if got != expected {
            failures.push(format!(
                "{text:?} {options:?}\n   llama.cpp {expected:?}\n   weft      {got:?}"
            ));
        }
    }
    for failure in failures.iter().take(10) {
        eprintln!("MISMATCH {failure}");
    }
    (cases.len() - failures.len(), cases.len())
}

/// Every generated decode case (concatenated pieces, as hex).
fn check_decode_cases(tokenizer: &Tokenizer, cases: &Value) -> (usize, usize) {
    let cases = cases.as_array().expect("decode cases");
    let mut passed = 0;
    for case in cases {
        let ids = ids(&case["ids"]);
        let special = case["special"].as_bool().expect("special");
        let got = tokenizer.decode_bytes(&ids, special).expect("ids in range");
        let hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
        if hex == case["hex"].as_str().expect("hex") {
            passed += 1;
        } else if passed + 10 > cases.len() {
            eprintln!("DECODE MISMATCH {ids:?} special={special}: weft {hex}");
        }
    }
    (passed, cases.len())
}

/// Attributes, end-of-generation ids and BOS/EOS settings.
fn check_vocab_facts(tokenizer: &Tokenizer, fixture: &Value) {
    assert_eq!(
        tokenizer.n_tokens() as u64,
        fixture["n_tokens"].as_u64().expect("n_tokens")
    );
    assert_eq!(tokenizer.bos().map(u64::from), fixture["bos"].as_u64());
    assert_eq!(tokenizer.eos().map(u64::from), fixture["eos"].as_u64());
    assert_eq!(Some(tokenizer.add_bos()), fixture["add_bos"].as_bool());
    assert_eq!(Some(tokenizer.add_eos()), fixture["add_eos"].as_bool());
    assert_eq!(
        tokenizer.eog_ids(),
        ids(&fixture["eog"]).as_slice(),
        "end-of-generation ids"
    );
    let mut expected = vec![2u16; tokenizer.n_tokens()]; // NORMAL
    for run in fixture["attr_runs"].as_array().expect("attr_runs") {
        let [first, last, attr] = [0, 1, 2].map(|i| run[i].as_u64().expect("number"));
        for id in first..=last {
            expected[id as usize] = attr as u16;
        }
    }
    for (id, &attr) in expected.iter().enumerate() {
        let got = tokenizer
            .token_attr(id as TokenId)
            .expect("in range")
            .bits();
        assert_eq!(
            got,
            attr,
            "attributes of token {id} {:?}",
            tokenizer.token_text(id as TokenId)
        );
    }
}

fn check_generated(tokenizer: &Tokenizer, name: &str) {
    let fixture = read_json(&format!("{DATA_DIR}/tokenizer_cases_{name}.json"));
    check_vocab_facts(tokenizer, &fixture);
    let (enc_ok, enc_total) = check_encode_cases(tokenizer, &fixture["encode"]);
    let (dec_ok, dec_total) = check_decode_cases(tokenizer, &fixture["decode"]);
    eprintln!("{name}: encode {enc_ok}/{enc_total} cases, decode {dec_ok}/{dec_total} cases equal llama.cpp");
    assert_eq!(
        (enc_ok, dec_ok),
        (enc_total, dec_total),
        "{name}: cases differing from llama.cpp"
    );
}

/// The model's vocabulary with metadata values replaced, against llama.cpp
/// on the same replacement (other pre-tokenizers, a space prefix).
fn check_variants(loaded: &Loaded, name: &str) {
    let fixture = read_json(&format!("{DATA_DIR}/tokenizer_cases_{name}.json"));
    let texts: Vec<&str> = fixture["encode"]
        .as_array()
        .expect("encode cases")
        .iter()
        .filter(|c| c.get("add_special").is_none() && c.get("parse_special").is_none())
        .map(|c| c["text"].as_str().expect("text"))
        .collect();
    for variant in fixture["variants"].as_array().expect("variants") {
        let mut vocab = loaded.vocab.clone();
        for (key, value) in variant["set"].as_object().expect("set") {
            match key.as_str() {
                "tokenizer.ggml.pre" => vocab.pre = value.as_str().map(str::to_owned),
                "tokenizer.ggml.add_space_prefix" => vocab.add_space_prefix = value.as_bool(),
                other => panic!("unexpected variant key {other}"),
            }
        }
        let tokenizer = Tokenizer::from_vocab(vocab).expect("the variant loads");
        let expected = variant["ids"].as_array().expect("ids");
        assert_eq!(expected.len(), texts.len());
        let mut passed = 0;
        for (text, expected) in texts.iter().zip(expected) {
            let expected = if expected.is_null() {
                loaded.tokenizer.encode(text)
            } else {
                ids(expected)
            };
            let got = tokenizer.encode(text);
            if got == expected {
                passed += 1;
            } else {
                eprintln!(
                    "MISMATCH {:?} {text:?}\n   llama.cpp {expected:?}\n   weft      {got:?}",
                    variant["set"]
                );
            }
        }
        eprintln!(
            "{name} with {}: {passed}/{} cases equal llama.cpp",
            variant["set"],
            texts.len()
        );
        assert_eq!(passed, texts.len(), "{name} with {}", variant["set"]);
    }
}

/// The whole corpus file (GPL-3), when this machine has it.
fn check_corpus(tokenizer: &Tokenizer, name: &str) {
    let fixture = read_json(&format!("{DATA_DIR}/tokenizer_cases_{name}.json"));
    let corpus = &fixture["corpus"];
    let path = corpus["path"].as_str().expect("corpus path");
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!("skipping the corpus check: {path} is not on this machine");
        return;
    };
    if format!("{:x}", Sha256::digest(text.as_bytes()))
        != corpus["sha256"].as_str().expect("sha256")
    {
        eprintln!(
            "skipping the corpus check: {path} differs from the one the fixture was made from"
        );
        return;
    }
    let start = Instant::now();
    let ids = tokenizer.encode(&text);
    eprintln!(
        "{name}: {} bytes -> {} tokens in {:?}",
        text.len(),
        ids.len(),
        start.elapsed()
    );
    assert_eq!(ids.len() as u64, corpus["n_ids"].as_u64().expect("n_ids"));
    let joined = ids
        .iter()
        .map(|id| id.to_string())
        .collect::<Vec<_>>()
        .join(",");
    assert_eq!(
        format!("{:x}", Sha256::digest(joined.as_bytes())),
        corpus["ids_sha256"].as_str().expect("hash")
    );
    assert_eq!(
        tokenizer.decode(&ids, false).expect("ids in range"),
        text,
        "the corpus round-trips"
    );
}

#[test]
fn smollm2_generated_cases_match_llama_cpp() {
    let Some(loaded) = smollm2() else { return };
    check_generated(&loaded.tokenizer, "smollm2");
    check_corpus(&loaded.tokenizer, "smollm2");
}

#[test]
fn gemma3_generated_cases_match_llama_cpp() {
    let Some(loaded) = gemma3() else { return };
    check_generated(&loaded.tokenizer, "gemma3");
    check_corpus(&loaded.tokenizer, "gemma3");
}

#[test]
fn other_bpe_pre_tokenizers_match_llama_cpp() {
    let Some(loaded) = smollm2() else { return };
    check_variants(loaded, "smollm2");
}

#[test]
fn sentencepiece_space_prefix_matches_llama_cpp() {
    let Some(loaded) = gemma3() else { return };
    check_variants(loaded, "gemma3");
}
