//! Shared set-up of the end-to-end tests: the real model, reference files.

#![allow(dead_code)]

mod reference;

pub use reference::{read_reference, read_reference_json, reference_dir};
use weft::models::Model;
use weft::runtime::{Device, ExecutorConfig, GraphExecutor};

/// Reference file `name` (under [`reference_dir`]) as JSON.
pub fn reference_json(name: &str) -> serde_json::Value {
    read_reference_json(&reference_dir().join(name))
}

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

/// The default model on a CPU executor, or `None` (with a message) when it
/// cannot be fetched and `WEFT_TEST_REQUIRE_MODEL` is not set.
pub fn load_smollm2(threads: usize, layers_per_cb: Option<u32>) -> Option<Setup> {
    let path = match weft::models::fetch::ensure(
        &weft::models::fetch::SMOLLM2_135M_Q4_1,
        &mut |_| {},
    ) {
        Ok(p) => p,
        Err(e) if std::env::var_os("WEFT_TEST_REQUIRE_MODEL").is_none() => {
            eprintln!("skipping: the SmolLM2 model is not available ({e}); set WEFT_TEST_REQUIRE_MODEL=1 to fail instead");
            return None;
        }
        Err(e) => panic!("the SmolLM2 model is required: {e}"),
    };
    let mut config = ExecutorConfig {
        threads,
        check_schedules: true,
        ..Default::default()
    };
    config.cut.layers_per_cb = layers_per_cb;
    let mut exec = GraphExecutor::with_config(Device::Cpu, config).expect("executor");
    let model = Model::load(&path, &mut exec).expect("load SmolLM2");
    Some(Setup { exec, model })
}

/// Gemma 3 270M Q4_K_M on a CPU executor, or `None` (with a message) when
/// it cannot be fetched and `WEFT_TEST_REQUIRE_MODEL` is not set.
pub fn load_gemma3(threads: usize, layers_per_cb: Option<u32>) -> Option<Setup> {
    let path = match weft::models::fetch::ensure(
        &weft::models::fetch::GEMMA3_270M_Q4_K_M,
        &mut |_| {},
    ) {
        Ok(p) => p,
        Err(e) if std::env::var_os("WEFT_TEST_REQUIRE_MODEL").is_none() => {
            eprintln!("skipping: the Gemma 3 model is not available ({e}); set WEFT_TEST_REQUIRE_MODEL=1 to fail instead");
            return None;
        }
        Err(e) => panic!("the Gemma 3 model is required: {e}"),
    };
    let mut config = ExecutorConfig {
        threads,
        check_schedules: true,
        ..Default::default()
    };
    config.cut.layers_per_cb = layers_per_cb;
    let mut exec = GraphExecutor::with_config(Device::Cpu, config).expect("executor");
    let model = Model::load(&path, &mut exec).expect("load Gemma 3");
    Some(Setup { exec, model })
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
    let path = match weft::models::fetch::ensure(spec, &mut |_| {}) {
        Ok(p) => p,
        Err(e) if std::env::var_os("WEFT_TEST_REQUIRE_MODEL").is_none() => {
            eprintln!(
                "skipping: the model {} is not available ({e}); set WEFT_TEST_REQUIRE_MODEL=1 to fail instead",
                spec.name
            );
            return None;
        }
        Err(e) => panic!("the model {} is required: {e}", spec.name),
    };
    let mut config = ExecutorConfig {
        threads,
        check_schedules: true,
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
