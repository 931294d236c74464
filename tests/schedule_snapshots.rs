//! Schedule snapshots: the CPU schedules of a SmolLM2 decode token (at a
//! cached position) and prefill (a short prompt), and of a tiny DeepSeek-V4
//! decode step and prompt, rebuilt and compared with `tests/snapshots/`
//! (node, level, barrier and command buffer counts; the level of every
//! node). A refactor of the models, the fusion pass, the cut or the reorder
//! pass must leave them as they are; a change meant to alter a schedule
//! rewrites them with `WEFT_TEST_BLESS=1 cargo test --release --test
//! schedule_snapshots` and commits the diff.

mod common;
mod dsv4_common;

use dsv4_common::Fixture;
use weft::graph::checker;
use weft::models::deepseek4::{DeepSeek4, LoadOptions};
use weft::models::gguf::GgufFile;
use weft::models::weights::WeightMap;
use weft::models::LogitRows;
use weft::runtime::{Device, DiagnosticsConfig, ExecutorConfig, GraphExecutor};
use weft_testkit::snapshot::{check, render, snapshot_path};

/// Decode: the position the one-token step is recorded at.
const DECODE_AT: u32 = 16;
/// The SmolLM2 prefill prompt length.
const PREFILL_TOKENS: u32 = 7;

#[test]
fn smollm2_schedules_match_their_snapshots() {
    let Some(common::Setup { mut exec, model }) = common::load_smollm2(2, None) else {
        return;
    };
    let context = 64;
    // Decode: the cache holds DECODE_AT tokens, then one more is recorded.
    let filler: Vec<u32> = (0..DECODE_AT).map(|i| 100 + i).collect();
    let (cache, _) = common::prefilled(&mut exec, &model, context, &filler);
    let span = cache.plan_prefill(1).expect("decode span");
    let mut s = exec.begin_recorded();
    model
        .record(&mut s, &cache, &span, &[200], LogitRows::Last)
        .expect("record the decode step");
    let (nodes, schedule) = s.into_schedule().expect("schedule");
    checker::check(&nodes, &schedule).expect("the schedule passes the checker");
    let title = format!("SmolLM2-135M-Instruct Q4_1, CPU: decode, 1 token at position {DECODE_AT}");
    check(
        &snapshot_path("smollm2_decode.txt"),
        &render(&title, &nodes, &schedule),
    );

    // Prefill: a short prompt into an empty cache.
    let cache = model.new_cache(&mut exec, context, context).expect("cache");
    let span = cache.plan_prefill(PREFILL_TOKENS).expect("prefill span");
    let prompt: Vec<u32> = (0..PREFILL_TOKENS).map(|i| 300 + i).collect();
    let mut s = exec.begin_recorded();
    model
        .record(&mut s, &cache, &span, &prompt, LogitRows::Last)
        .expect("record the prefill step");
    let (nodes, schedule) = s.into_schedule().expect("schedule");
    checker::check(&nodes, &schedule).expect("the schedule passes the checker");
    let title =
        format!("SmolLM2-135M-Instruct Q4_1, CPU: prefill, {PREFILL_TOKENS} tokens at position 0");
    check(
        &snapshot_path("smollm2_prefill.txt"),
        &render(&title, &nodes, &schedule),
    );
}

#[test]
fn tiny_deepseek4_schedules_match_their_snapshots() {
    let f = Fixture::load("flash-tiny", "");
    let mut exec = GraphExecutor::with_config(
        Device::Cpu,
        ExecutorConfig {
            threads: 1,
            diagnostics: DiagnosticsConfig::checked(),
            ..ExecutorConfig::default()
        },
    )
    .expect("executor");
    let file = GgufFile::open(&f.gguf()).expect("gguf");
    let weights = WeightMap::new(&file, &mut exec).expect("weights");
    let model = DeepSeek4::load(&weights, &mut exec, LoadOptions::default()).expect("model");
    let cache = model.new_cache(&mut exec, 512, 512).expect("cache");
    let steps: [(&str, &str, u32, &[u32]); 2] = [
        ("dsv4_tiny_decode.txt", "decode", 300, &[5]),
        (
            "dsv4_tiny_prefill.txt",
            "prefill of the fixture's prompt",
            0,
            &f.prompt,
        ),
    ];
    for (file_name, what, start, tokens) in steps {
        let mut s = exec.begin_recorded();
        model
            .record_step(&mut s, &[&cache], start, tokens, LogitRows::Last)
            .expect("record");
        let (nodes, schedule) = s.into_schedule().expect("schedule");
        checker::check(&nodes, &schedule).expect("the schedule passes the checker");
        let title = format!(
            "DeepSeek-V4 flash-tiny fixture, CPU: {what}, {} token(s) at position {start}",
            tokens.len()
        );
        check(
            &snapshot_path(file_name),
            &render(&title, &nodes, &schedule),
        );
    }
}
