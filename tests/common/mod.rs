//! Shared set-up of the end-to-end tests: the real model, reference files.

#![allow(dead_code)]

use weft::models::Model;
use weft::runtime::{Device, DiagnosticsConfig, ExecutorConfig, GraphExecutor};
pub use weft_testkit::reference::{read_reference, reference_dir, reference_json};

/// Each case of reference file `name` as (prompt ids, greedy ids).
pub fn reference_greedy_cases(name: &str) -> Vec<(Vec<u32>, Vec<u32>)> {
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        serde_json::from_value(v.clone()).expect("token ids")
    };
    reference_json(name)["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| (ids(&c["prompt_ids"]), ids(&c["greedy_ids"])))
        .collect()
}

/// The full last-position logits of reference case `i`.
pub fn reference_logits(i: usize) -> Vec<f32> {
    let path = reference_dir().join(format!("smollm2_logits/logits_last_p{i}.f32"));
    read_reference(&path)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

pub struct Setup {
    pub exec: GraphExecutor,
    pub model: Model,
}

/// The default model (SmolLM2-135M-Instruct Q4_1) on a CPU executor, or
/// `None` (with a message) when it cannot be fetched and
/// `WEFT_TEST_REQUIRE_MODEL` is not set.
pub fn load_smollm2(threads: usize, layers_per_cb: Option<u32>) -> Option<Setup> {
    load_known(
        &weft::models::fetch::SMOLLM2_135M_Q4_1,
        threads,
        layers_per_cb,
    )
}

/// Gemma 3 270M Q4_K_M on a CPU executor, or `None` (with a message) when
/// it cannot be fetched and `WEFT_TEST_REQUIRE_MODEL` is not set.
pub fn load_gemma3(threads: usize, layers_per_cb: Option<u32>) -> Option<Setup> {
    load_known(
        &weft::models::fetch::GEMMA3_270M_Q4_K_M,
        threads,
        layers_per_cb,
    )
}

/// Qwen2.5-Coder-0.5B-Instruct Q4_K_M on a CPU executor, or `None` (with a
/// message) when it cannot be fetched and `WEFT_TEST_REQUIRE_MODEL` is not set.
pub fn load_qwen2(threads: usize, layers_per_cb: Option<u32>) -> Option<Setup> {
    load_known(
        &weft::models::fetch::QWEN25_CODER_05B_Q4_K_M,
        threads,
        layers_per_cb,
    )
}

/// Known model `spec` on a CPU executor that checks its schedules, or
/// `None` (with a message) when it cannot be fetched and
/// `WEFT_TEST_REQUIRE_MODEL` is not set.
pub fn load_known(
    spec: &weft::models::fetch::ModelSpec,
    threads: usize,
    layers_per_cb: Option<u32>,
) -> Option<Setup> {
    let path = weft_testkit::require::model_path(spec)?;
    let mut config = ExecutorConfig {
        threads,
        diagnostics: DiagnosticsConfig::checked(),
        ..Default::default()
    };
    config.cut.layers_per_cb = layers_per_cb;
    let mut exec = GraphExecutor::with_config(Device::Cpu, config).expect("executor");
    let model = Model::load(&path, &mut exec).unwrap_or_else(|e| panic!("load {}: {e}", spec.name));
    Some(Setup { exec, model })
}

/// A fresh cache of `context` rows, prefilled with `ids` under the model's
/// chunk policy: the cache and the last position's logits.
pub fn prefilled(
    exec: &mut GraphExecutor,
    model: &Model,
    context: u32,
    ids: &[u32],
) -> (weft::runtime::cache::KvCache, Vec<f32>) {
    let mut cache = model.new_cache(exec, context, context).expect("cache");
    let logits = model
        .prefill(
            exec,
            &mut cache,
            ids,
            &model.chunk_policy(),
            weft::models::LogitRows::Last,
        )
        .expect("prefill");
    (cache, logits)
}

/// Perplexity of `setup`'s model on the text of reference file
/// `reference`'s first `perplexity` case (read from `text`, else from the
/// path the case names) against llama.cpp's, within `tolerance` relative,
/// over the same number of windows (and tokens, where the case records
/// them). Skips, or fails under `WEFT_TEST_REQUIRE_MODEL=1`, without the text.
pub fn check_perplexity(setup: Setup, reference: &str, text: Option<&str>, tolerance: f64) {
    let Setup { mut exec, model } = setup;
    let reference = reference_json(reference);
    let case = &reference["perplexity"][0];
    let path = text.unwrap_or_else(|| case["file"].as_str().expect("file"));
    let Ok(text) = std::fs::read_to_string(path) else {
        weft_testkit::require::skip_or_fail(
            weft_testkit::require::REQUIRE_MODEL,
            &format!("the perplexity text {path} is not on this machine"),
        );
        return;
    };
    let want = case["ppl"].as_f64().expect("ppl");
    let ctx = case["ctx"].as_u64().expect("ctx") as usize;
    let tokens = model.tokenizer.encode(&text);
    if let Some(n) = case["tokens"].as_u64() {
        assert_eq!(tokens.len() as u64, n, "tokens of {path}");
    }
    let start = std::time::Instant::now();
    let got = weft::models::eval::perplexity(&model, &mut exec, &tokens, ctx, &mut |_, _| {})
        .expect("perplexity");
    eprintln!(
        "perplexity {:.4} vs llama.cpp {want} over {} chunks ({:+.3}%) in {:.1} s",
        got.ppl,
        got.chunks,
        (got.ppl - want) / want * 100.0,
        start.elapsed().as_secs_f64()
    );
    assert_eq!(
        got.chunks,
        case["chunks"].as_u64().expect("chunks") as usize
    );
    assert!(
        (got.ppl - want).abs() / want < tolerance,
        "perplexity {} vs {want}",
        got.ppl
    );
}
