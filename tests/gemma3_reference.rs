//! Gemma 3 270M Q4_K_M against llama.cpp's reference outputs in
//! `../shared/reference/gemma3.json`: prompt token ids (with BOS),
//! top-5 last-position logits and 32-token greedy continuations.

mod common;

use common::{load_gemma3, reference_json, Setup};
use weft::models::sampling::argmax;
use weft::models::LogitRows;

const LOGIT_TOLERANCE: f32 = 0.02;

#[test]
fn prompt_ids_logits_and_greedy_continuations_match_llama_cpp() {
    let Some(Setup { mut exec, model }) = load_gemma3(2, None) else {
        return;
    };
    let reference = reference_json("gemma3.json");
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
        let steps = case["top5_steps"].as_array().expect("steps");
        let want: Vec<u32> = serde_json::from_value(case["greedy_ids"].clone()).expect("greedy");
        let mut got = Vec::new();
        let mut l = logits;
        let mut worst = 0f32;
        let mut first_worst = 0f32;
        for k in 0..want.len() {
            if got == want[..k] {
                for pair in steps[k].as_array().expect("top5") {
                    let (id, v) = (
                        pair[0].as_u64().expect("id") as usize,
                        pair[1].as_f64().expect("logit") as f32,
                    );
                    worst = worst.max((l[id] - v).abs());
                    if k == 0 {
                        first_worst = first_worst.max((l[id] - v).abs());
                    }
                }
            }
            let t = argmax(&l) as u32;
            got.push(t);
            if k + 1 < want.len() {
                l = model
                    .step(&mut exec, &mut cache, &[t], LogitRows::Last)
                    .expect("decode");
            }
        }
        let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        eprintln!(
            "prompt {i}: top-5 |diff| last position {first_worst:.6}, all matched steps {worst:.6}; greedy agrees for {agree}/{}",
            want.len()
        );
        if first_worst > LOGIT_TOLERANCE {
            failures.push(format!("prompt {i}: top-5 logits differ by {first_worst}"));
        }
        if got != want {
            failures.push(format!(
                "prompt {i}: greedy\n  got  {got:?}\n  want {want:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
