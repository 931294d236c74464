//! The same greedy output whatever the schedule: reorder on and off, 1 and 2
//! threads, 1, 2 and all layers per command buffer, fusion on and off. The schedule changes
//! which nodes run together, never what any node computes.

mod common;

use weft::models::sampling::argmax;
use weft::models::LogitRows;

fn greedy(threads: usize, layers_per_cb: Option<u32>, reorder: bool) -> Vec<u32> {
    let common::Setup { mut exec, model } =
        common::load_smollm2(threads, layers_per_cb).expect("model");
    exec.config_mut().reorder = reorder;
    // Fusion follows reorder in these runs, so both settings of each are covered.
    exec.config_mut().fuse = reorder;
    let ids = model.tokenizer.encode("def fibonacci(n):");
    let mut cache = model.new_cache(&mut exec, 128, 128).expect("cache");
    let mut logits = model
        .prefill(
            &mut exec,
            &mut cache,
            &ids,
            &model.chunk_policy(),
            LogitRows::Last,
        )
        .expect("prefill");
    let mut out = Vec::new();
    for _ in 0..24 {
        let t = argmax(&logits) as u32;
        out.push(t);
        logits = model
            .step(&mut exec, &mut cache, &[t], LogitRows::Last)
            .expect("decode");
    }
    out
}

#[test]
fn greedy_output_does_not_depend_on_the_schedule() {
    if common::load_smollm2(1, None).is_none() {
        return;
    }
    let baseline = greedy(1, None, true);
    for (threads, layers, reorder) in [
        (2, None, true),
        (1, None, false),
        (2, Some(1), true),
        (2, Some(2), false),
        (1, Some(2), true),
    ] {
        assert_eq!(
            greedy(threads, layers, reorder),
            baseline,
            "threads {threads}, layers per command buffer {layers:?}, reorder {reorder}"
        );
    }
}
