//! Host cost of one SmolLM2 decode step, without running it: recording the
//! nodes, then fusion + the reorder pass (`into_schedule`). On a GPU this
//! time is serial with every token, so it bounds decode speed.
//! `cargo bench --bench record_step` (fetches the model on first use).

/// The allocator the `weft` binary uses (src/main.rs).
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;
use weft::models::fetch::{ensure, SMOLLM2_135M_Q4_1};
use weft::models::{LogitRows, Model};
use weft::runtime::{Device, ExecutorConfig, GraphExecutor};

fn main() {
    let path = weft_testkit::require::fetch_config()
        .and_then(|c| ensure(&SMOLLM2_135M_Q4_1, &c, &mut |_| {}))
        .expect("model");
    let config = ExecutorConfig {
        threads: 1,
        ..Default::default()
    };
    let mut exec = GraphExecutor::with_config(Device::Cpu, config).expect("executor");
    let model = Model::load(&path, &mut exec).expect("load");
    let mut cache = model.new_cache(&mut exec, 512, 512).expect("cache");
    let prompt: Vec<u32> = (0..32).map(|i| 100 + i).collect();
    model
        .prefill(
            &mut exec,
            &mut cache,
            &prompt,
            &model.chunk_policy(),
            LogitRows::Last,
        )
        .expect("prefill");
    // The best of several batches: this VM's speed drifts, and the best
    // batch is the host cost without interference.
    let (batches, per_batch) = (12, 30);
    let (mut record, mut schedule) = (f64::MAX, f64::MAX);
    let mut nodes = 0;
    for b in 0..batches + 1 {
        let (mut r, mut sc) = (0f64, 0f64);
        for _ in 0..per_batch {
            let span = cache.plan_next_step().expect("span");
            let t0 = Instant::now();
            let mut s = exec.begin_recorded();
            model
                .record(&mut s, &cache, &span, &[7], LogitRows::Last)
                .expect("record");
            let t1 = Instant::now();
            let (n, _) = s.into_schedule().expect("schedule");
            let t2 = Instant::now();
            r += (t1 - t0).as_secs_f64();
            sc += (t2 - t1).as_secs_f64();
            nodes = n.len();
        }
        // Batch 0 warms up.
        if b > 0 && r + sc < record + schedule {
            (record, schedule) = (r, sc);
        }
    }
    let steps = per_batch;
    let us = |t: f64| t * 1e6 / steps as f64;
    println!(
        "decode step, {nodes} nodes after fusion: record {:.0} us, fusion + schedule {:.0} us, total {:.0} us per step ({:.2} us per node)",
        us(record),
        us(schedule),
        us(record + schedule),
        us(record + schedule) / nodes as f64
    );
}
