//! Qwen 2: the same logits, bit for bit, whatever the schedule (reorder on
//! and off, 1 and 2 threads, 1, 5 and all layers per command buffer, the
//! fusion pass on and off). The q/k/v biases are added in place into the
//! projections' outputs; a missing or wrong byte range there would show
//! here as a difference between schedules.

mod common;

use weft::models::sampling::argmax;
use weft::models::LogitRows;

/// The logits of the prompt's last position and of 8 greedy steps.
fn logits(threads: usize, layers_per_cb: Option<u32>, reorder: bool, fuse: bool) -> Vec<Vec<f32>> {
    let common::Setup { mut exec, model } =
        common::load_qwen2(threads, layers_per_cb).expect("model");
    exec.config_mut().reorder = reorder;
    exec.config_mut().fuse = fuse;
    let ids = model.tokenizer.encode("def fibonacci(n):");
    let mut cache = model.new_cache(&mut exec, 64, 64).expect("cache");
    let mut out = vec![model
        .prefill(
            &mut exec,
            &mut cache,
            &ids,
            &model.chunk_policy(),
            LogitRows::Last,
        )
        .expect("prefill")];
    for _ in 0..8 {
        let t = argmax(out.last().expect("logits")) as u32;
        out.push(
            model
                .step(&mut exec, &mut cache, &[t], LogitRows::Last)
                .expect("decode"),
        );
    }
    out
}

#[test]
fn logits_do_not_depend_on_the_schedule() {
    if common::load_qwen2(1, None).is_none() {
        return;
    }
    let baseline = logits(2, None, true, true);
    for (threads, layers, reorder, fuse) in [
        (2, None, false, true),
        (1, Some(1), true, true),
        (2, Some(5), true, false),
        (2, Some(1), false, false),
    ] {
        assert!(
            logits(threads, layers, reorder, fuse) == baseline,
            "threads {threads}, layers per command buffer {layers:?}, reorder {reorder}, fuse {fuse}"
        );
    }
}
