//! SmolLM2-135M-Instruct Q4_1 against llama.cpp's reference outputs in
//! `tests/reference/`: prompt token ids, last-position logits (top-5 and
//! the full vector), and 32-token greedy continuations.

mod common;

use common::{load_smollm2, reference_json, Setup};
use weft::models::sampling::argmax;
use weft::models::LogitRows;

/// Tolerance on logits, absolute. llama.cpp and weft both quantize the
/// activations to 8 bits per block before every quantized matmul and round
/// the KV cache to f16; what differs is only the order of float sums
/// (SIMD lane layout) — a relative error around 1e-6 per dot product that
/// grows through 30 layers. Logits are O(10-30); 0.02 leaves an order of
/// magnitude of head room over the differences measured (see the closing
/// note) while still catching any real numerical mistake (a wrong
/// rounding mode or a missing f16 conversion moves logits by 0.1-1).
const LOGIT_TOLERANCE: f32 = 0.02;

#[test]
fn prompt_ids_logits_and_greedy_continuations_match_llama_cpp() {
    let Some(Setup { mut exec, model }) = load_smollm2(2, None) else {
        return;
    };
    let reference = reference_json("smollm2.json");
    let cases = reference["cases"].as_array().expect("cases");
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let text = case["text"].as_str().expect("text");
        let want_ids: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).expect("ids");
        let ids = model.tokenizer.encode(text);
        assert_eq!(ids, want_ids, "prompt {i} token ids");
        let mut cache = model.new_cache(&mut exec, 512, 512).expect("cache");
        let logits = model
            .prefill(
                &mut exec,
                &mut cache,
                &ids,
                &model.chunk_policy(),
                LogitRows::Last,
            )
            .expect("prefill");
        let full = common::reference_logits(i);
        let worst = logits
            .iter()
            .zip(&full)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!("prompt {i}: max |logit - llama.cpp| = {worst:.5}");
        if worst > LOGIT_TOLERANCE {
            failures.push(format!("prompt {i}: logits differ by {worst}"));
        }
        for pair in case["top5_last"].as_array().expect("top5") {
            let (id, v) = (
                pair[0].as_u64().expect("id") as usize,
                pair[1].as_f64().expect("logit") as f32,
            );
            assert!(
                (logits[id] - v).abs() <= LOGIT_TOLERANCE,
                "prompt {i}: logit of {id} is {} vs {v}",
                logits[id]
            );
        }
        let want: Vec<u32> = serde_json::from_value(case["greedy_ids"].clone()).expect("greedy");
        let mut got = Vec::new();
        let mut l = logits;
        for k in 0..want.len() {
            let t = argmax(&l) as u32;
            got.push(t);
            if k + 1 < want.len() {
                l = model
                    .step(&mut exec, &mut cache, &[t], LogitRows::Last)
                    .expect("decode");
            }
        }
        if got != want {
            failures.push(format!(
                "prompt {i}: greedy\n  got  {got:?}\n  want {want:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Longer prompts (70 to 400 tokens) and decodes past 256 cached tokens:
/// llama.cpp's tiled attention kernel and its split-KV decode, which the
/// short reference prompts never reach. Ground truth from
/// `scripts/gen_long_cases.py` (the reference llama.cpp through
/// llama-cpp-python, n_ctx 512, 2 threads).
#[test]
fn long_prompts_match_llama_cpp() {
    let Some(Setup { mut exec, model }) = load_smollm2(2, None) else {
        return;
    };
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/smollm2_long_cases.json"
    );
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("cases")).expect("json");
    let mut failures = Vec::new();
    for (i, case) in data["cases"].as_array().expect("cases").iter().enumerate() {
        let ids: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).expect("ids");
        let want: Vec<u32> = serde_json::from_value(case["greedy_ids"].clone()).expect("greedy");
        let mut cache = model.new_cache(&mut exec, 512, 512).expect("cache");
        let mut logits = model
            .prefill(
                &mut exec,
                &mut cache,
                &ids,
                &model.chunk_policy(),
                LogitRows::Last,
            )
            .expect("prefill");
        let mut worst = 0f32;
        for pair in case["top5_last"].as_array().expect("top5") {
            let (id, v) = (
                pair[0].as_u64().expect("id") as usize,
                pair[1].as_f64().expect("logit") as f32,
            );
            worst = worst.max((logits[id] - v).abs());
        }
        eprintln!(
            "long case {i} ({} tokens): top-5 max |diff| = {worst}",
            ids.len()
        );
        if worst > LOGIT_TOLERANCE {
            failures.push(format!("long case {i}: top-5 logits differ by {worst}"));
        }
        let mut got = Vec::new();
        for k in 0..want.len() {
            let t = argmax(&logits) as u32;
            got.push(t);
            if k + 1 < want.len() {
                logits = model
                    .step(&mut exec, &mut cache, &[t], LogitRows::Last)
                    .expect("decode");
            }
        }
        if got != want {
            failures.push(format!(
                "long case {i}: greedy\n  got  {got:?}\n  want {want:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
