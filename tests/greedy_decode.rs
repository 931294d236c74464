//! Greedy decoding one step ahead (`Model::decode_greedy`: each step's
//! argmax feeds the next on the device) against the step-by-step loop and
//! llama.cpp's greedy continuations; its cache transactions (early stop,
//! the context's end).

mod common;

use common::{load_smollm2, prefilled, reference_greedy_cases, Setup};
use weft::models::sampling::argmax;
use weft::models::LogitRows;

/// The reference prompts' 32-token greedy continuations, through the
/// pipelined decode: the same ids as llama.cpp, the cache at the right
/// position afterwards.
#[test]
fn pipelined_greedy_matches_llama_cpp_continuations() {
    let Some(Setup { mut exec, model }) = load_smollm2(2, None) else {
        return;
    };
    for (i, (ids, want)) in reference_greedy_cases("smollm2.json")
        .into_iter()
        .enumerate()
    {
        let (mut cache, logits) = prefilled(&mut exec, &model, 512, &ids);
        let first = argmax(&logits) as u32;
        let mut got = vec![first];
        let produced = model
            .decode_greedy(&mut exec, &mut cache, first, want.len() - 1, &mut |t| {
                got.push(t);
                true
            })
            .expect("decode");
        assert_eq!(produced, want.len() - 1);
        assert_eq!(got, want, "prompt {i}: pipelined greedy");
        assert_eq!(cache.position() as usize, ids.len() + want.len() - 1);
    }
}

/// Stopping early leaves the cache at the last published step, though the
/// next step was already submitted: decoding on from there gives the same
/// logits, bit for bit, as a run that never looked ahead.
#[test]
fn early_stop_publishes_only_what_was_handed_over() {
    let Some(Setup { mut exec, model }) = load_smollm2(2, None) else {
        return;
    };
    let ids = model.tokenizer.encode("The quick brown fox");
    let (mut cache, logits) = prefilled(&mut exec, &model, 128, &ids);
    let first = argmax(&logits) as u32;
    let mut got = Vec::new();
    let produced = model
        .decode_greedy(&mut exec, &mut cache, first, 20, &mut |t| {
            got.push(t);
            got.len() < 5
        })
        .expect("decode");
    assert_eq!(produced, 5);
    assert_eq!(cache.position() as usize, ids.len() + 5);
    let after = model
        .step(&mut exec, &mut cache, &[got[4]], LogitRows::Last)
        .expect("step");

    // The same tokens, one step at a time.
    let (mut cache2, mut l) = prefilled(&mut exec, &model, 128, &ids);
    let mut t = argmax(&l) as u32;
    for want in &got {
        l = model
            .step(&mut exec, &mut cache2, &[t], LogitRows::Last)
            .expect("step");
        t = argmax(&l) as u32;
        assert_eq!(t, *want);
    }
    let again = model
        .step(&mut exec, &mut cache2, &[t], LogitRows::Last)
        .expect("step");
    assert!(
        after
            .iter()
            .zip(&again)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "decoding on after an early stop differs from the step-by-step run"
    );
}

/// At the context's end the decode stops without an error; a first id
/// outside the vocabulary is refused before anything runs.
#[test]
fn greedy_stops_at_the_context_and_refuses_bad_ids() {
    let Some(Setup { mut exec, model }) = load_smollm2(2, None) else {
        return;
    };
    let ids = model.tokenizer.encode("Hello");
    let context = ids.len() as u32 + 3;
    let (mut cache, logits) = prefilled(&mut exec, &model, context, &ids);
    let first = argmax(&logits) as u32;
    let produced = model
        .decode_greedy(&mut exec, &mut cache, first, 10, &mut |_| true)
        .expect("decode");
    assert_eq!(produced, 3);
    assert_eq!(cache.position(), context);
    assert!(!cache.is_poisoned());

    let (mut cache, _) = prefilled(&mut exec, &model, 64, &ids);
    let err = model
        .decode_greedy(&mut exec, &mut cache, 1 << 30, 4, &mut |_| true)
        .expect_err("an id outside the vocabulary");
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    assert_eq!(cache.position() as usize, ids.len());
}
