//! Cohorts: B lanes decode one token each in one recorded step and publish
//! all together or not at all. Checked against single-sequence runs of the
//! tiny transformer, for B = 4 (hf2q's case) and B = 3.

mod support;

use support::{assert_err_contains, assert_same_bits, executor, tokens, Tiny, TinyConfig};
use weft_runtime::cache::{ChunkPolicy, Cohort, KvCache};
use weft_runtime::{Fault, GraphExecutor};

const CONTEXT: u32 = 48;
const CHUNK: u32 = 8;

fn model(exec: &mut GraphExecutor) -> Tiny {
    Tiny::new(exec, TinyConfig::small()).unwrap()
}

/// `b` caches, lane `i` prefilled with its own prompt of `prompt` tokens.
fn lanes(exec: &mut GraphExecutor, m: &Tiny, b: usize, prompt: usize) -> Vec<KvCache> {
    (0..b)
        .map(|i| {
            let mut c = m.new_cache(exec, CONTEXT, CHUNK).unwrap();
            let p = tokens(prompt, 10 + i as u32, m.config.vocab);
            m.prefill(exec, &mut c, &p, &ChunkPolicy::single(CHUNK))
                .unwrap();
            c
        })
        .collect()
}

/// Tokens of decode step `t` for lane `b`.
fn step_tokens(b: usize, t: usize, m: &Tiny) -> Vec<u32> {
    (0..b)
        .map(|i| ((7 * t + 13 * i + 1) % m.config.vocab) as u32)
        .collect()
}

fn cohort_equals_single_runs(b: usize) {
    let mut exec = executor();
    let m = model(&mut exec);
    let (prompt, steps) = (11, 9);
    // Reference: each lane alone.
    let mut single = Vec::new();
    for i in 0..b {
        let mut c = lanes(&mut exec, &m, b, prompt).swap_remove(i);
        let mut out = Vec::new();
        for t in 0..steps {
            out.push(
                m.decode(&mut exec, &mut c, step_tokens(b, t, &m)[i])
                    .unwrap(),
            );
        }
        single.push(out);
    }
    // The cohort.
    let mut caches = lanes(&mut exec, &m, b, prompt);
    let mut cohort = Cohort::new(caches.iter_mut().collect()).unwrap();
    let vocab = m.config.vocab;
    for t in 0..steps {
        let logits = m
            .cohort_step(
                &mut exec,
                &mut cohort,
                &step_tokens(b, t, &m),
                |_, _| Ok(()),
            )
            .unwrap();
        for (i, lane) in single.iter().enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            assert_same_bits(row, &lane[t], &format!("B={b} lane {i} step {t}"));
        }
    }
    for c in &caches {
        assert_eq!(c.position(), (prompt + steps) as u32);
    }
}

#[test]
fn cohort_of_four_matches_four_single_runs() {
    cohort_equals_single_runs(4);
}

#[test]
fn cohort_of_three_matches_three_single_runs() {
    cohort_equals_single_runs(3);
}

/// Runs `steps` cohort steps on fresh lanes; returns each step's logits.
fn cohort_run(exec: &mut GraphExecutor, m: &Tiny, b: usize, steps: usize) -> Vec<Vec<f32>> {
    let mut caches = lanes(exec, m, b, 11);
    let mut cohort = Cohort::new(caches.iter_mut().collect()).unwrap();
    (0..steps)
        .map(|t| {
            m.cohort_step(exec, &mut cohort, &step_tokens(b, t, m), |_, _| Ok(()))
                .unwrap()
        })
        .collect()
}

#[test]
fn lanes_differ_and_logits_are_finite() {
    let mut exec = executor();
    let m = model(&mut exec);
    let out = cohort_run(&mut exec, &m, 4, 1).remove(0);
    let vocab = m.config.vocab;
    assert!(out.iter().all(|v| v.is_finite()));
    assert_ne!(
        out[..vocab],
        out[vocab..2 * vocab],
        "lanes must see different histories"
    );
}

/// One cohort step with an open gate.
fn step(
    exec: &mut GraphExecutor,
    m: &Tiny,
    cohort: &mut Cohort<'_>,
    t: usize,
) -> Result<Vec<f32>, weft_runtime::RuntimeError> {
    let toks = step_tokens(cohort.len(), t, m);
    m.cohort_step(exec, cohort, &toks, |_, _| Ok(()))
}

#[test]
fn fault_in_one_lane_poisons_every_lane_and_replay_is_exact() {
    let mut exec = executor();
    let m = model(&mut exec);
    let b = 4;
    let clean = cohort_run(&mut exec, &m, b, 4);

    let mut caches = lanes(&mut exec, &m, b, 11);
    {
        let mut cohort = Cohort::new(caches.iter_mut().collect()).unwrap();
        for t in 0..2 {
            step(&mut exec, &m, &mut cohort, t).unwrap();
        }
        // The attention of lane 2 in layer 1 fails during step 2.
        exec.config_mut().diagnostics.fault = Some(Fault {
            label: "blk.1.lane2.attention".into(),
            after: 0,
        });
        let err = step(&mut exec, &m, &mut cohort, 2).unwrap_err();
        assert!(err.to_string().contains("blk.1.lane2.attention"), "{err}");
        // Later calls are refused, and say how to recover.
        assert_err_contains(cohort.plan_next_step(), &["poisoned", "reset()"]);
        assert_err_contains(step(&mut exec, &m, &mut cohort, 2), &["poisoned"]);
    }
    for (i, c) in caches.iter_mut().enumerate() {
        assert!(c.is_poisoned(), "lane {i} must be poisoned");
        assert_eq!(c.position(), 13, "lane {i} must not have advanced");
        assert_err_contains(c.plan_next_step(), &["poisoned", "reset()", "replay"]);
        assert_err_contains(c.snapshot(&mut exec), &["poisoned"]);
        assert_err_contains(c.commit_step(13), &["poisoned"]);
        c.reset();
        let p = tokens(11, 10 + i as u32, m.config.vocab);
        m.prefill(&mut exec, c, &p, &ChunkPolicy::single(CHUNK))
            .unwrap();
    }
    let mut cohort = Cohort::new(caches.iter_mut().collect()).unwrap();
    for (t, want) in clean.iter().enumerate() {
        let got = step(&mut exec, &m, &mut cohort, t).unwrap();
        assert_same_bits(&got, want, &format!("replayed cohort step {t}"));
    }
}

#[test]
fn gate_rejection_poisons_every_lane() {
    let mut exec = executor();
    let m = model(&mut exec);
    let b = 4;
    let mut caches = lanes(&mut exec, &m, b, 5);
    {
        let mut cohort = Cohort::new(caches.iter_mut().collect()).unwrap();
        let mut seen = None;
        let err = m
            .cohort_step(
                &mut exec,
                &mut cohort,
                &step_tokens(b, 0, &m),
                |plan, logits| {
                    seen = Some((plan.lanes, plan.position(), logits.len()));
                    Err("the scheduler cancelled the batch".into())
                },
            )
            .unwrap_err();
        assert_eq!(seen, Some((b, 5, b * m.config.vocab)));
        let msg = err.to_string();
        assert!(
            msg.contains("scheduler cancelled") && msg.contains("poisoned"),
            "{msg}"
        );
    }
    for c in &caches {
        assert_eq!(c.position(), 5, "a refused gate publishes nothing");
        assert!(c.poisoned().unwrap().contains("scheduler cancelled"));
    }
}

#[test]
fn mismatched_positions_are_refused_without_poisoning() {
    let mut exec = executor();
    let m = model(&mut exec);
    let mut caches = lanes(&mut exec, &m, 4, 5);
    m.decode(&mut exec, &mut caches[2], 3).unwrap();
    let before = exec.counters();
    {
        let mut cohort = Cohort::new(caches.iter_mut().collect()).unwrap();
        assert_err_contains(
            cohort.plan_next_step(),
            &["lane 2", "position 6", "lane 0 at 5"],
        );
        let r = m.cohort_step(
            &mut exec,
            &mut cohort,
            &step_tokens(4, 0, &m),
            |_, _| Ok(()),
        );
        assert_err_contains(r, &["nothing was run or poisoned"]);
    }
    assert_eq!(exec.counters().commits, before.commits, "nothing may run");
    for c in &caches {
        assert!(!c.is_poisoned());
    }
    assert_eq!(
        caches.iter().map(KvCache::position).collect::<Vec<_>>(),
        [5, 5, 6, 5]
    );
}

#[test]
fn mismatched_plans_are_refused_without_poisoning() {
    let mut exec = executor();
    let m = model(&mut exec);
    let mut a = m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap();
    // Same position, another ring size (max_chunk differs): another plan.
    let mut b = m.new_cache(&mut exec, CONTEXT, CHUNK / 2).unwrap();
    let cohort = Cohort::new(vec![&mut a, &mut b]).unwrap();
    assert_err_contains(
        cohort.plan_next_step(),
        &["lane 1", "another cache layout or plan"],
    );
    drop(cohort);
    assert!(!a.is_poisoned() && !b.is_poisoned());
    assert!(Cohort::new(Vec::new()).is_err(), "a cohort needs a lane");
}

#[test]
fn failed_validation_poisons_every_lane() {
    let mut exec = executor();
    let m = model(&mut exec);
    let mut caches = lanes(&mut exec, &m, 3, 4);
    {
        let mut cohort = Cohort::new(caches.iter_mut().collect()).unwrap();
        // Validating a position the lanes are not at (as if a step were
        // published twice) fails and poisons every lane.
        assert_err_contains(
            cohort.validate_step_commit(7).map(|_| ()),
            &["lane 0", "at position 4"],
        );
    }
    for c in &caches {
        assert!(c.is_poisoned());
        assert_eq!(c.position(), 4);
    }
    // Single caches: hf2q's validate -> publish pair.
    let mut c = m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap();
    let ticket = c.validate_step_commit(0).unwrap();
    assert_eq!(ticket.position(), 0);
    KvCache::publish_step_end(ticket);
    assert_eq!(c.position(), 1);
    // A ticket dropped unpublished poisons: the step ran but was not kept.
    drop(c.validate_step_commit(1).unwrap());
    assert_err_contains(c.plan_next_step(), &["dropped without being published"]);
}
