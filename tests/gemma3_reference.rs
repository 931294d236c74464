//! Gemma 3 270M Q4_K_M against llama.cpp's reference outputs in
//! `tests/reference/gemma3.json`: prompt token ids (with BOS), the
//! top-5 logits at the last prompt position and at every step of the
//! 32-token greedy continuations, and the continuations themselves.
//!
//! **What is exact and what is not.** Every op of the Gemma 3 graph
//! follows llama.cpp's CPU arithmetic, and with llama.cpp's float orders for
//! the two K-quant paths Gemma hits on the reference machine (the CPU_REPACK
//! `q4_K_8x8` gemv/gemm kernels for Q4_K weights, the tiled matmul for Q6_K
//! weights with 8 or more rows, and `ggml_vec_dot_q6_K_q8_K`'s lane layout
//! below 8 rows) weft's logits are bit-identical to llama.cpp's at every
//! step of all five cases (checked against a llama.cpp built for the
//! reference machine's instruction set). Those three kernels belong to
//! `kernels/src/cpu/quant/`, which still sums Q4_K and Q6_K products in
//! `ggml_vec_dot_q4_K_q8_K`'s AVX2 lane order; until it follows the orders
//! above, a few float roundings differ, each flips some 8-bit activation
//! quantizations downstream, and logits move by up to ~1.3 (the size of the
//! quantization noise itself). [`bit_exact_with_llama_cpp`] states the exact
//! target and is ignored until then; the other tests hold today.

mod common;

use common::{load_gemma3, reference_json, Setup};
use weft::models::sampling::argmax;
use weft::models::{LogitRows, Model};
use weft::runtime::GraphExecutor;

/// Largest |logit - llama.cpp| accepted while the Q4_K/Q6_K kernels sum in
/// another order than llama.cpp's (see the module docs): measured up to 1.3
/// over the 5 x 32 teacher-forced steps, the size of a flipped 8-bit
/// activation rounding propagated through 18 layers. A wrong op (a missing
/// norm, a wrong rope base, no window) moves logits by far more.
const LOGIT_TOLERANCE: f32 = 1.5;

/// Greedy choices must agree wherever llama.cpp's top logit leads the
/// runner-up by more than this (twice the tolerance: no noise of the size
/// above can swap them).
const MARGIN: f32 = 2.0 * LOGIT_TOLERANCE;

struct Case {
    text: String,
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    /// `(id, logit)` top-5 per step: the last prompt position, then after
    /// each greedy token.
    top5: Vec<Vec<(usize, f32)>>,
}

fn cases() -> Vec<Case> {
    let reference = reference_json("gemma3.json");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        serde_json::from_value(v.clone()).expect("token ids")
    };
    reference["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().expect("text").to_string(),
            prompt: ids(&c["prompt_ids"]),
            greedy: ids(&c["greedy_ids"]),
            top5: c["top5_steps"]
                .as_array()
                .expect("top5_steps")
                .iter()
                .map(|step| {
                    step.as_array()
                        .expect("top5")
                        .iter()
                        .map(|p| {
                            let id = p[0].as_u64().expect("id") as usize;
                            (id, p[1].as_f64().expect("logit") as f32)
                        })
                        .collect()
                })
                .collect(),
        })
        .collect()
}

/// Logits at the last prompt position and after each of `forced` tokens.
fn teacher_forced(
    exec: &mut GraphExecutor,
    model: &Model,
    prompt: &[u32],
    forced: &[u32],
) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache(exec, 512, 512).expect("cache");
    let mut out = vec![model
        .prefill(
            exec,
            &mut cache,
            prompt,
            &model.chunk_policy(),
            LogitRows::Last,
        )
        .expect("prefill")];
    for &t in forced {
        out.push(
            model
                .step(exec, &mut cache, &[t], LogitRows::Last)
                .expect("decode"),
        );
    }
    out
}

#[test]
fn prompt_token_ids_match_llama_cpp() {
    let Some(Setup { model, .. }) = load_gemma3(1, None) else {
        return;
    };
    for (i, case) in cases().iter().enumerate() {
        assert_eq!(model.tokenizer.encode(&case.text), case.prompt, "case {i}");
        assert_eq!(case.prompt[0], 2, "case {i} starts with BOS");
    }
}

/// Top-5 logits within [`LOGIT_TOLERANCE`] at every one of the 32 steps,
/// fed llama.cpp's own greedy tokens (so one early disagreement cannot hide
/// the rest), and the same greedy choice wherever llama.cpp's margin is
/// wider than [`MARGIN`].
#[test]
fn logits_and_greedy_choices_match_llama_cpp() {
    let Some(Setup { mut exec, model }) = load_gemma3(2, None) else {
        return;
    };
    let mut failures = Vec::new();
    for (i, case) in cases().iter().enumerate() {
        let forced = &case.greedy[..case.greedy.len() - 1];
        let steps = teacher_forced(&mut exec, &model, &case.prompt, forced);
        let (mut worst, mut exact) = (0f32, 0);
        for (k, (logits, top5)) in steps.iter().zip(&case.top5).enumerate() {
            let diff = top5
                .iter()
                .map(|&(id, v)| (logits[id] - v).abs())
                .fold(0f32, f32::max);
            worst = worst.max(diff);
            exact += usize::from(diff == 0.0);
            let margin = top5[0].1 - top5[1].1;
            if margin > MARGIN && argmax(logits) != top5[0].0 {
                failures.push(format!(
                    "case {i} step {k}: argmax {} vs llama.cpp's {} (margin {margin})",
                    argmax(logits),
                    top5[0].0
                ));
            }
        }
        eprintln!(
            "case {i}: top-5 max |logit - llama.cpp| over {} steps = {worst:.6} ({exact} steps bit-exact)",
            steps.len()
        );
        if worst > LOGIT_TOLERANCE {
            failures.push(format!("case {i}: top-5 logits differ by {worst}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The target: every top-5 logit bit-identical at all 32 steps and the
/// free-running greedy continuations identical. Needs llama.cpp's float
/// orders in the Q4_K/Q6_K matmul kernels (module docs); run with
/// `cargo test --release --test gemma3_reference -- --ignored`.
#[test]
fn bit_exact_with_llama_cpp() {
    let Some(Setup { mut exec, model }) = load_gemma3(2, None) else {
        return;
    };
    let mut failures = Vec::new();
    for (i, case) in cases().iter().enumerate() {
        let mut cache = model.new_cache(&mut exec, 512, 512).expect("cache");
        let mut logits = model
            .prefill(
                &mut exec,
                &mut cache,
                &case.prompt,
                &model.chunk_policy(),
                LogitRows::Last,
            )
            .expect("prefill");
        let mut got = Vec::new();
        for k in 0..case.greedy.len() {
            if got[..] == case.greedy[..k] {
                for &(id, v) in &case.top5[k] {
                    if logits[id] != v {
                        failures.push(format!(
                            "case {i} step {k}: logit of {id} is {} vs {v}",
                            logits[id]
                        ));
                    }
                }
            }
            let t = argmax(&logits) as u32;
            got.push(t);
            if k + 1 < case.greedy.len() {
                logits = model
                    .step(&mut exec, &mut cache, &[t], LogitRows::Last)
                    .expect("decode");
            }
        }
        if got != case.greedy {
            failures.push(format!(
                "case {i}: greedy\n  got  {got:?}\n  want {:?}",
                case.greedy
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
