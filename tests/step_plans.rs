//! Step plans on the CPU: decode steps that repeat a recording reuse its
//! fusion and schedule. With schedule checking on (as `common` loads
//! models), every reuse is compared with a fresh fusion and schedule of the
//! step; the logits equal those of a run that plans nothing (a traced run:
//! traces never use plans), bit for bit.

mod common;

use weft::models::sampling::argmax;
use weft::models::LogitRows;

fn decode(traced: bool, steps: usize) -> (Vec<Vec<f32>>, u64) {
    let common::Setup { mut exec, model } = common::load_smollm2(2, None).expect("model");
    if traced {
        exec.enable_trace();
    }
    let ids = model.tokenizer.encode("The quick brown fox");
    let (mut cache, mut logits) = common::prefilled(&mut exec, &model, 96, &ids);
    let before = exec.counters();
    let mut all = Vec::new();
    for _ in 0..steps {
        let t = argmax(&logits) as u32;
        logits = model
            .step(&mut exec, &mut cache, &[t], LogitRows::Last)
            .expect("decode");
        all.push(logits.clone());
    }
    (all, (exec.counters() - before).planned_commits)
}

#[test]
fn planned_decode_equals_unplanned_decode() {
    if common::load_smollm2(1, None).is_none() {
        return;
    }
    let steps = 12;
    let (planned, reused) = decode(false, steps);
    let (fresh, none) = decode(true, steps);
    assert_eq!(none, 0, "a traced run must not use plans");
    // The first decode step makes the plan; every later one reuses it.
    assert!(
        reused >= steps as u64 - 1,
        "only {reused} of {steps} decode steps reused a plan"
    );
    for (k, (a, b)) in planned.iter().zip(&fresh).enumerate() {
        let differ = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(differ, 0, "step {k}: {differ} logits differ");
    }
}
