//! One decode step over several sequences (`Model::step_batch`): every
//! row's logits are bit-identical (CPU, exact numerics) to that sequence's
//! own step, with sequences at different positions joining and leaving
//! between steps; a lane that cannot step refuses the whole batch before
//! anything runs, changing no cache.

mod common;

use common::{load_qwen2, load_smollm2, prefilled, Setup};
use weft::models::sampling::argmax;
use weft::models::{LogitRows, Model};
use weft::runtime::cache::KvCache;
use weft::runtime::{Device, DiagnosticsConfig, ExecutorConfig, Fault, GraphExecutor};

const CONTEXT: u32 = 128;
const PROMPTS: [&str; 5] = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):",
    "Water boils at",
    "The three primary colors are red, yellow and",
];

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Two identical sets of prefilled caches, one per prompt, and the next
/// token of each.
fn twin_caches(
    exec: &mut GraphExecutor,
    model: &Model,
    prompts: &[&str],
) -> (Vec<KvCache>, Vec<KvCache>, Vec<u32>) {
    let (mut alone, mut batched, mut next) = (Vec::new(), Vec::new(), Vec::new());
    for p in prompts {
        let ids = model.tokenizer.encode(p);
        let (a, logits) = prefilled(exec, model, CONTEXT, &ids);
        let (b, _) = prefilled(exec, model, CONTEXT, &ids);
        alone.push(a);
        batched.push(b);
        next.push(argmax(&logits) as u32);
    }
    (alone, batched, next)
}

/// `steps` decode steps; at step `k` the lanes `active(k, b)` step, alone
/// and as one batch; every row must match its lane's own step.
fn check_rows_match(
    exec: &mut GraphExecutor,
    model: &Model,
    prompts: &[&str],
    steps: usize,
    active: impl Fn(usize, usize) -> bool,
) {
    let (mut alone, mut batched, mut next) = twin_caches(exec, model, prompts);
    let vocab = model.vocab();
    for k in 0..steps {
        let lanes: Vec<usize> = (0..prompts.len()).filter(|&b| active(k, b)).collect();
        let tokens: Vec<u32> = lanes.iter().map(|&b| next[b]).collect();
        let mut want = Vec::new();
        for &b in &lanes {
            let logits = model
                .step(exec, &mut alone[b], &[next[b]], LogitRows::Last)
                .expect("step alone");
            want.push(logits);
        }
        let caches: Vec<&mut KvCache> = batched
            .iter_mut()
            .enumerate()
            .filter(|(b, _)| lanes.contains(b))
            .map(|(_, c)| c)
            .collect();
        let got = model.step_batch(exec, caches, &tokens).expect("batch step");
        assert_eq!(got.len(), lanes.len() * vocab);
        for (i, &b) in lanes.iter().enumerate() {
            let row = &got[i * vocab..(i + 1) * vocab];
            assert!(
                same_bits(row, &want[i]),
                "step {k}: lane {b} (position {}) differs from its own step",
                alone[b].position() - 1
            );
            assert_eq!(batched[b].position(), alone[b].position());
            next[b] = argmax(&want[i]) as u32;
        }
    }
}

#[test]
fn smollm2_batch_rows_are_bit_identical_to_single_steps() {
    let Some(Setup { mut exec, model }) = load_smollm2(2, None) else {
        return;
    };
    // Q4_1 and Q8_0 weights keep their float order at any batch size.
    assert_eq!(model.exact_batch_limit(&exec, 16), 16);
    // Lanes at different positions, joining and leaving between steps.
    check_rows_match(&mut exec, &model, &PROMPTS, 12, |k, b| (k + b) % 4 != 0);
}

#[test]
fn qwen2_batches_only_as_many_rows_as_keep_their_order() {
    let Some(Setup { mut exec, model }) = load_qwen2(2, None) else {
        return;
    };
    // Q4_K weights (rows a multiple of 8) switch from llama.cpp's gemv to
    // its gemm kernel at 4 activation rows, summing in another order.
    assert_eq!(model.exact_batch_limit(&exec, 16), 3);
    check_rows_match(&mut exec, &model, &PROMPTS[..3], 6, |k, b| {
        k % 3 != 0 || b != 1
    });
}

#[test]
fn a_lane_that_cannot_step_refuses_the_batch_and_changes_nothing() {
    let Some(Setup { mut exec, model }) = load_smollm2(2, None) else {
        return;
    };
    let ids = model.tokenizer.encode(PROMPTS[0]);
    let (mut a, logits) = prefilled(&mut exec, &model, CONTEXT, &ids);
    let full_ids: Vec<u32> = (0..CONTEXT).map(|i| ids[i as usize % ids.len()]).collect();
    let (mut full, _) = prefilled(&mut exec, &model, CONTEXT, &full_ids);
    let before = a.export(&mut exec).unwrap();
    let t = argmax(&logits) as u32;
    let e = model
        .step_batch(&mut exec, vec![&mut a, &mut full], &[t, t])
        .expect_err("a full cache cannot step");
    assert!(e.to_string().contains("cohort lane 1"), "{e}");
    assert!(!a.is_poisoned() && !full.is_poisoned(), "{e}");
    assert_eq!(a.export(&mut exec).unwrap(), before);
    assert_eq!(full.position(), CONTEXT);
    // The healthy lane still steps, exactly as alone.
    let got = model.step_batch(&mut exec, vec![&mut a], &[t]).unwrap();
    let (mut c, _) = prefilled(&mut exec, &model, CONTEXT, &ids);
    let want = model
        .step(&mut exec, &mut c, &[t], LogitRows::Last)
        .unwrap();
    assert!(same_bits(&got, &want));
    // A token outside the vocabulary is refused before anything runs.
    let vocab = model.vocab() as u32;
    let e = model
        .step_batch(&mut exec, vec![&mut a], &[vocab])
        .expect_err("outside the vocabulary");
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    assert!(!a.is_poisoned());
}

#[test]
fn a_failed_batch_step_poisons_every_lane() {
    let Some(Setup { model, .. }) = load_smollm2(2, None) else {
        return;
    };
    let layers = model.layers();
    drop(model);
    let path = weft_testkit::require::fetch_config()
        .and_then(|c| {
            weft::models::fetch::ensure(&weft::models::fetch::SMOLLM2_135M_Q4_1, &c, &mut |_| {})
        })
        .expect("the model file");
    // The first ffn_gate node after two prefills (one per layer each) fails.
    let config = ExecutorConfig {
        threads: 2,
        diagnostics: DiagnosticsConfig {
            fault: Some(Fault {
                label: "ffn_gate".into(),
                after: 2 * layers,
            }),
            ..DiagnosticsConfig::default()
        },
        ..ExecutorConfig::default()
    };
    let mut exec = GraphExecutor::with_config(Device::Cpu, config).expect("executor");
    let model = Model::load(&path, &mut exec).expect("model");
    let ids: Vec<Vec<u32>> = PROMPTS[..2]
        .iter()
        .map(|p| model.tokenizer.encode(p))
        .collect();
    let (mut a, la) = prefilled(&mut exec, &model, CONTEXT, &ids[0]);
    let (mut b, lb) = prefilled(&mut exec, &model, CONTEXT, &ids[1]);
    let tokens = [argmax(&la) as u32, argmax(&lb) as u32];
    let e = model
        .step_batch(&mut exec, vec![&mut a, &mut b], &tokens)
        .expect_err("the injected fault fails the step");
    for c in [&a, &b] {
        let why = c.poisoned().expect("poisoned");
        assert!(why.contains("the cohort step failed"), "{why} ({e})");
    }
    assert_eq!(
        (a.position() as usize, b.position() as usize),
        (ids[0].len(), ids[1].len()),
        "nothing is published"
    );
}

/// Fast numerics on the CPU: a server batches every decoding sequence.
/// Each row's products then sum in another order than its own step's (the
/// Q4_K and Q6_K products of four or more rows in llama.cpp's gemm order,
/// not its gemv order); the 8-bit activations of the next layers turn
/// those last-bit differences into logit differences of tenths, as exact
/// numerics shows against itself under another chunking
/// (`tests/fast_numerics.rs`). Bound per row: the KL divergence of the
/// next-token distributions at most [`FAST_BATCH_KL`], the same next token.
#[test]
fn qwen2_batches_every_row_in_fast_numerics_within_bound() {
    let Some(path) =
        weft_testkit::require::model_path(&weft::models::fetch::QWEN25_CODER_05B_Q4_K_M)
    else {
        return;
    };
    let config = ExecutorConfig {
        threads: 2,
        numerics: weft::runtime::Numerics::Fast,
        diagnostics: DiagnosticsConfig::checked(),
        ..Default::default()
    };
    let mut exec = GraphExecutor::with_config(Device::Cpu, config).expect("executor");
    let model = Model::load(&path, &mut exec).expect("load");
    assert_eq!(model.exact_batch_limit(&exec, 16), 3);
    assert_eq!(model.batch_limit(&exec, 16), 16);
    let (mut alone, mut batched, mut next) = twin_caches(&mut exec, &model, &PROMPTS);
    let vocab = model.vocab();
    let (mut worst, mut changed) = (0f64, 0);
    for k in 0..4 {
        let want: Vec<Vec<f32>> = (0..PROMPTS.len())
            .map(|b| {
                model
                    .step(&mut exec, &mut alone[b], &[next[b]], LogitRows::Last)
                    .expect("step alone")
            })
            .collect();
        let got = model
            .step_batch(&mut exec, batched.iter_mut().collect(), &next)
            .expect("batch step");
        for (b, want) in want.iter().enumerate() {
            let row = &got[b * vocab..(b + 1) * vocab];
            let kl = kl_divergence(want, row);
            worst = worst.max(kl);
            changed += usize::from(!same_bits(row, want));
            assert!(
                kl <= FAST_BATCH_KL,
                "step {k}: lane {b}'s row is {kl:.2e} nats from its own step"
            );
            assert_eq!(argmax(row), argmax(want), "step {k}: lane {b}'s next token");
            next[b] = argmax(want) as u32;
        }
    }
    // The rows do take the many-row kernels.
    assert!(changed > 0, "every batch row equals its own step");
    eprintln!("NOTE fast batch rows: {changed} of 20 differ, worst KL {worst:.2e} nats");
}

/// Largest KL divergence (nats) of a fast batch row's next-token
/// distribution from its own step's (measured at most 1.4e-3).
const FAST_BATCH_KL: f64 = 1e-2;

/// KL(p || q) of the softmax distributions of logits `p` and `q`.
fn kl_divergence(p: &[f32], q: &[f32]) -> f64 {
    let log_softmax = |x: &[f32]| -> Vec<f64> {
        let m = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let z = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
        x.iter().map(|&v| v as f64 - z).collect()
    };
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}
