//! Schedule figures of DeepSeek-V4 steps (recorded, scheduled, checked,
//! not run): barriers, levels and command buffers per decode token and per
//! prefill chunk, for weft's reorder pass against recorded order and the
//! seed's greedy 64-node look-ahead, at 1, 2, 4 and all layers per command
//! buffer. The tiny fixture runs always; the Flash-shaped 43-layer stack
//! (real dimensions, zero weights in a sparse GGUF) is `#[ignore]`d:
//! `cargo test --release --test dsv4_schedule -- --ignored --nocapture`.

mod dsv4_common;

use dsv4_common::Fixture;
use weft::graph::checker;
use weft::graph::cut::cut;
use weft::graph::reorder::{schedule, Strategy};
use weft::models::deepseek4::synthetic::{flash_config, write_sparse, TensorTypes};
use weft::models::deepseek4::{DeepSeek4, LoadOptions};
use weft::models::gguf::GgufFile;
use weft::models::weights::WeightMap;
use weft::models::LogitRows;
use weft::runtime::cache::KvCache;
use weft::runtime::{Device, ExecutorConfig, GraphExecutor};

/// One row of figures: (strategy, command buffers, levels, barriers).
type Row = (&'static str, usize, usize, usize);

/// Records `tokens` at `start` with `layers_per_cb`, then schedules the
/// recording three ways; every schedule passes the checker.
fn figures(
    exec: &mut GraphExecutor,
    model: &DeepSeek4,
    cache: &KvCache,
    start: u32,
    tokens: &[u32],
    layers_per_cb: Option<u32>,
) -> (usize, Vec<Row>) {
    exec.config_mut().cut.layers_per_cb = layers_per_cb;
    exec.config_mut().reorder = true;
    let mut s = exec.begin_recorded();
    model
        .record_step(&mut s, &[cache], start, tokens, LogitRows::Last)
        .expect("record");
    let (nodes, _) = s.into_schedule().expect("schedule");
    let cuts = cut(&nodes, &exec.config().cut);
    let mut rows = Vec::new();
    for (name, strategy) in [
        ("weft reorder", Strategy::Reorder),
        ("greedy 64-node window", Strategy::GreedyWindow(64)),
        ("recorded order", Strategy::RecordedOrder),
    ] {
        let sched = schedule(&nodes, &cuts, strategy);
        checker::check(&nodes, &sched).expect("schedule passes the checker");
        rows.push((
            name,
            sched.command_buffers.len(),
            sched.levels(),
            sched.barriers(),
        ));
    }
    (nodes.len(), rows)
}

fn table(
    what: &str,
    exec: &mut GraphExecutor,
    model: &DeepSeek4,
    cache: &KvCache,
    start: u32,
    tokens: &[u32],
) {
    println!("\n{what}: start {start}, {} rows", tokens.len());
    println!("| layers/cb | strategy | nodes | command buffers | levels | barriers |");
    println!("|---|---|---|---|---|---|");
    for cb in [Some(1), Some(2), Some(4), None] {
        let (nodes, rows) = figures(exec, model, cache, start, tokens, cb);
        let label = cb.map_or("all".to_string(), |k| k.to_string());
        for (name, cbs, levels, barriers) in &rows {
            println!("| {label} | {name} | {nodes} | {cbs} | {levels} | {barriers} |");
        }
        let best = rows[0].3;
        assert!(
            rows.iter().all(|r| r.3 >= best),
            "the reorder pass has the fewest barriers"
        );
    }
}

fn cpu() -> GraphExecutor {
    GraphExecutor::with_config(
        Device::Cpu,
        ExecutorConfig {
            threads: 1,
            ..ExecutorConfig::default()
        },
    )
    .expect("executor")
}

#[test]
fn tiny_fixture_schedule_figures() {
    let f = Fixture::load("flash-tiny", "");
    let mut exec = cpu();
    let file = GgufFile::open(&f.gguf()).expect("gguf");
    let weights = WeightMap::new(&file, &mut exec).expect("weights");
    let model = DeepSeek4::load(&weights, &mut exec, LoadOptions::default()).expect("model");
    let cache = model.new_cache(&mut exec, 512, 512).expect("cache");
    table("flash-tiny decode", &mut exec, &model, &cache, 300, &[5]);
    table(
        "flash-tiny prefill",
        &mut exec,
        &model,
        &cache,
        0,
        &f.prompt,
    );
}

#[test]
#[ignore = "a Flash-shaped 43-layer stack: ~8 GB of pool and cache memory for the 4,096-row chunk"]
fn flash_shaped_schedule_figures() {
    let c = flash_config();
    let path =
        std::env::temp_dir().join(format!("weft-dsv4-flash-sched-{}.gguf", std::process::id()));
    write_sparse(&path, &c, &TensorTypes::flash_gguf()).expect("write");
    let result = std::panic::catch_unwind(|| {
        let file = GgufFile::open(&path).expect("open");
        let mut exec = cpu();
        let weights = WeightMap::new(&file, &mut exec).expect("map");
        let model =
            DeepSeek4::load(&weights, &mut exec, LoadOptions { widen_f16: false }).expect("load");
        let cache = model.new_cache(&mut exec, 8192, 1).expect("cache");
        table(
            "Flash-shaped decode (43 layers)",
            &mut exec,
            &model,
            &cache,
            4096,
            &[5],
        );
        drop(cache);
        exec.release_pool_scratch();
        let rows = std::env::var("WEFT_TEST_DSV4_CHUNK")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4096);
        let cache = model.new_cache(&mut exec, rows, rows).expect("cache");
        let tokens: Vec<u32> = (0..rows).map(|i| (i * 7919) % 129_280).collect();
        table(
            "Flash-shaped prefill chunk (43 layers)",
            &mut exec,
            &model,
            &cache,
            0,
            &tokens,
        );
    });
    let _ = std::fs::remove_file(&path);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
