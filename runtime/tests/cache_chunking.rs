//! Chunked prefill: hf2q's chunk-size rule (its own cases), and the
//! prefill helper running every chunk as its own transaction.

mod support;

use support::{assert_err_contains, executor, tokens, Tiny, TinyConfig};
use weft_runtime::cache::{ChunkPolicy, LARGE_WEIGHTS_BYTES};

#[test]
fn seed_cases() {
    // 6,000 tokens at multiplier 16 (no model window: 128) -> chunks of 2,048.
    let large = ChunkPolicy::for_model(None, LARGE_WEIGHTS_BYTES);
    assert_eq!(large.multiplier, 16);
    assert_eq!(large.plan(6000, 0), vec![2048, 2048, 1904]);
    let default = ChunkPolicy::default();
    assert_eq!(default.max_chunk(), 4096);
    // At position 1,024: 32 remaining tokens go token by token, 33 in one chunk.
    assert_eq!(default.plan(32, 1024), vec![1; 32]);
    assert_eq!(default.plan(33, 1024), vec![33]);
    // On an empty cache a short prompt is one chunk.
    assert_eq!(default.plan(20, 0), vec![20]);
    assert_eq!(default.plan(1, 0), vec![1]);
    assert!(default.plan(0, 7).is_empty());
}

#[test]
fn defaults_follow_the_model() {
    // Resident weights of 100 GB or more halve the multiplier.
    assert_eq!(
        ChunkPolicy::for_model(None, LARGE_WEIGHTS_BYTES - 1).multiplier,
        32
    );
    assert_eq!(
        ChunkPolicy::for_model(None, 98_000_000).max_chunk(),
        128 * 32
    );
    // A model window replaces the default window of 128.
    assert_eq!(
        ChunkPolicy::for_model(Some(512), 200_000_000_000).max_chunk(),
        512 * 16
    );
    assert_eq!(
        ChunkPolicy::for_model(Some(4096), 1).plan(10_000, 0),
        vec![10_000]
    );
    // Everything is configurable.
    let p = ChunkPolicy {
        window: Some(3),
        default_window: 128,
        multiplier: 2,
        token_by_token_below: 4,
    };
    assert_eq!(p.plan(14, 0), vec![6, 6, 1, 1]);
    assert_eq!(p.plan(10, 5), vec![6, 4]);
    // `single(n)`: chunks of n whatever the position.
    assert_eq!(ChunkPolicy::single(8).plan(20, 3), vec![8, 8, 4]);
}

#[test]
fn each_chunk_is_its_own_transaction() {
    let mut exec = executor();
    let m = Tiny::new(&mut exec, TinyConfig::small()).unwrap();
    let mut cache = m.new_cache(&mut exec, 96, 16).unwrap();
    let policy = ChunkPolicy {
        window: None,
        default_window: 4,
        multiplier: 3,
        token_by_token_below: 5,
    };
    let prompt = tokens(28, 1, m.config.vocab);
    let commits = exec.counters().commits;
    let out = m.prefill(&mut exec, &mut cache, &prompt, &policy).unwrap();
    // 4 tokens remain on a non-empty cache (< 5): token by token.
    assert_eq!(out.chunks, vec![12, 12, 1, 1, 1, 1]);
    assert_eq!(exec.counters().commits - commits, out.chunks.len() as u64);
    assert_eq!(cache.position(), 28);
    assert_eq!(
        out.last.len(),
        m.config.vocab,
        "the last chunk had one token"
    );

    // The policy is capped by the cache's own chunk limit.
    let mut small = m.new_cache(&mut exec, 96, 5).unwrap();
    let out = m
        .prefill(&mut exec, &mut small, &prompt[..12], &policy)
        .unwrap();
    assert_eq!(out.chunks, vec![5, 5, 1, 1]);

    // Chunked and one-shot prefills agree bit for bit on caches of one
    // layout. (Across ring sizes they agree only closely: the attention
    // kernel accumulates in f16 in slot order, and the ring size decides the
    // slot order.)
    let mut one = m.new_cache(&mut exec, 96, 32).unwrap();
    let a = m
        .prefill(&mut exec, &mut one, &prompt, &ChunkPolicy::single(32))
        .unwrap();
    assert_eq!(a.chunks, vec![28]);
    let mut chunked = m.new_cache(&mut exec, 96, 32).unwrap();
    let c = m
        .prefill(&mut exec, &mut chunked, &prompt, &policy)
        .unwrap();
    support::assert_same_bits(
        m.last_row(&a.last),
        m.last_row(&c.last),
        "chunked vs one-shot",
    );
    let next = m.decode(&mut exec, &mut one, 5).unwrap();
    support::assert_same_bits(
        &next,
        &m.decode(&mut exec, &mut chunked, 5).unwrap(),
        "next token",
    );
}

#[test]
fn prompts_that_cannot_fit_are_refused_before_running() {
    let mut exec = executor();
    let m = Tiny::new(&mut exec, TinyConfig::small()).unwrap();
    let mut cache = m.new_cache(&mut exec, 16, 8).unwrap();
    let commits = exec.counters().commits;
    let r = m.prefill(
        &mut exec,
        &mut cache,
        &tokens(17, 1, m.config.vocab),
        &ChunkPolicy::default(),
    );
    assert_err_contains(r, &["do not fit the context of 16"]);
    assert_err_contains(
        m.prefill(&mut exec, &mut cache, &[], &ChunkPolicy::default()),
        &["empty"],
    );
    assert_eq!(exec.counters().commits, commits);
    assert!(!cache.is_poisoned());
}
