//! KV cache transactions: memory report and admission, planning that
//! changes nothing and refuses cleanly, publish-or-poison, and fault
//! injection in the middle of a multi-layer chunked prefill and of a decode
//! step, followed by reset and an exact replay.

mod support;

use support::{assert_err_contains, assert_same_bits, executor, tokens, Tiny, TinyConfig};
use weft_ops::DType;
use weft_runtime::cache::{run_step, CacheConfig, ChunkPolicy, KvCache, LayerSpec};
use weft_runtime::{Fault, GraphExecutor};

const CONTEXT: u32 = 64;
const CHUNK: u32 = 8;

fn config() -> CacheConfig {
    CacheConfig {
        layers: vec![
            LayerSpec {
                width: 32,
                window: None,
            },
            LayerSpec {
                width: 32,
                window: Some(6),
            },
            LayerSpec {
                width: 32,
                window: None,
            },
        ],
        context: CONTEXT,
        max_chunk: CHUNK,
        dtype: DType::F16,
    }
}

#[test]
fn memory_report_per_layer_and_per_token() {
    let r = config().memory_report();
    // f16 rows of 32 values: 64 bytes for K, 64 for V.
    let full = 64 * 128;
    let ring = (6 + 8) * 128;
    assert_eq!(
        r.layers
            .iter()
            .map(|l| (l.rows, l.bytes, l.ring))
            .collect::<Vec<_>>(),
        [(64, full, false), (14, ring, true), (64, full, false)]
    );
    assert!(r.layers.iter().all(|l| l.token_bytes == 128));
    assert_eq!(r.total_bytes, 2 * full + ring);
    assert_eq!(r.bytes_per_token, 256);
    assert_eq!(r.ring_bytes, ring);
    assert_eq!(config().total_bytes(), r.total_bytes);
    assert_eq!(config().bytes_per_layer(), vec![full, ring, full]);
}

#[test]
fn admission_is_checked_before_allocating() {
    let c = config();
    let need = c.total_bytes();
    assert_eq!(c.admit(need).unwrap(), need);
    let msg = assert_err_contains(
        c.admit(need - 1),
        &["budget", "per token", "at most 63 tokens"],
    );
    assert!(msg.contains(&need.to_string()), "{msg}");
    assert_eq!(c.max_context(need), CONTEXT);
    assert_eq!(c.max_context(need - 1), CONTEXT - 1);
    assert_eq!(c.max_context(0), 0);

    let mut exec = executor();
    let buffers = exec.buffer_infos().len();
    assert!(KvCache::with_budget(&mut exec, c.clone(), need - 1).is_err());
    assert_eq!(
        exec.buffer_infos().len(),
        buffers,
        "a refused cache allocates nothing"
    );
    let cache = KvCache::with_budget(&mut exec, c, need).unwrap();
    let allocated: u64 = exec.buffer_infos().iter().map(|b| b.bytes).sum();
    assert_eq!(allocated, need);
    assert_eq!(cache.layer(1).ring, Some(14));
    assert_eq!(cache.layer(0).ring, None);
}

#[test]
fn layouts_attention_cannot_read_are_refused() {
    let mut exec = executor();
    let bad_type = CacheConfig {
        dtype: DType::Q8_0,
        ..config()
    };
    assert_err_contains(KvCache::new(&mut exec, bad_type), &["use f16 or f32"]);
    let mut zero = config();
    zero.layers[1].width = 0;
    assert_err_contains(KvCache::new(&mut exec, zero), &["layer 1"]);
    let no_context = CacheConfig {
        context: 0,
        ..config()
    };
    assert_err_contains(no_context.admit(u64::MAX), &["at least one token"]);
}

#[test]
fn planning_changes_nothing_and_refuses_without_poison() {
    let mut exec = executor();
    let mut cache = KvCache::new(&mut exec, config()).unwrap();
    let a = cache.plan_prefill(8).unwrap();
    let b = cache.plan_prefill(8).unwrap();
    assert_eq!(a, b);
    assert_eq!((a.start, a.tokens, a.end()), (0, 8, 8));
    assert_eq!(cache.position(), 0);

    assert_err_contains(cache.plan_prefill(0), &["0 tokens"]);
    assert_err_contains(cache.plan_prefill(CHUNK + 1), &["chunk limit"]);
    cache.commit_prefill(0, 8).unwrap();
    for p in (8..CONTEXT).step_by(8) {
        cache.commit_prefill(p, 8).unwrap();
    }
    assert_eq!(cache.position(), CONTEXT);
    assert_err_contains(cache.plan_next_step(), &["context length of 64"]);
    assert!(!cache.is_poisoned(), "planning refusals never poison");

    // The ring layer's span wraps: positions 10..14 of a 14-row ring, then 0..2.
    cache.reset();
    cache.commit_prefill(0, 8).unwrap();
    cache.commit_prefill(8, 2).unwrap();
    let span = cache.plan_prefill(6).unwrap();
    assert_eq!(span.layers[1].rows, vec![10..14, 0..2]);
    assert_eq!(span.layers[0].rows, vec![10..16]);
}

#[test]
fn a_failed_publish_poisons_and_says_how_to_recover() {
    let mut exec = executor();
    let mut cache = KvCache::new(&mut exec, config()).unwrap();
    cache.commit_prefill(0, 4).unwrap();
    assert_err_contains(
        cache.commit_step(7),
        &["does not match", "reset()", "replay"],
    );
    assert!(cache.is_poisoned());
    assert_eq!(cache.position(), 4);
    for refused in [
        cache.plan_prefill(1).map(|_| ()),
        cache.plan_next_step().map(|_| ()),
        cache.commit_step(4),
        cache.snapshot(&mut exec).map(|_| ()),
        cache.export(&mut exec).map(|_| ()),
    ] {
        assert_err_contains(refused, &["poisoned", "reset()", "replay", "restore()"]);
    }
    cache.reset();
    assert!(!cache.is_poisoned());
    assert_eq!(cache.position(), 0);
    cache.plan_next_step().unwrap();
}

#[test]
fn recording_errors_poison_nothing_and_read_failures_poison() {
    let mut exec = executor();
    let m = Tiny::new(&mut exec, TinyConfig::small()).unwrap();
    let mut cache = m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap();
    let commits = exec.counters().commits;
    let r = run_step(&mut exec, &mut cache, 2, |_, _, _| {
        Err(weft_runtime::RuntimeError::Usage(
            "the model refused the tokens".into(),
        ))
    });
    assert_err_contains(r, &["refused the tokens"]);
    assert_eq!(exec.counters().commits, commits, "nothing was submitted");
    assert!(!cache.is_poisoned());

    // The step runs, but its output cannot be read back: poisoned.
    let r: Result<_, weft_runtime::RuntimeError> =
        run_step(&mut exec, &mut cache, 2, |s, c, span| {
            m.record_step(s, c, span, &[1, 2])?;
            let lost = s.executor().alloc_tensor(DType::F32, &[1], "lost")?;
            s.executor().release_buffer(lost.buffer);
            Ok(lost)
        });
    assert!(r.is_err());
    assert!(cache.poisoned().unwrap().contains("reading the output"));
    assert_eq!(cache.position(), 0);
}

/// Runs `prompt` then decodes `decode`, returning the prefill's last logits
/// and every decode step's logits.
fn run(
    exec: &mut GraphExecutor,
    m: &Tiny,
    cache: &mut KvCache,
    prompt: &[u32],
    decode: &[u32],
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let policy = ChunkPolicy::single(CHUNK);
    let pre = m.prefill(exec, cache, prompt, &policy).unwrap();
    let steps = m.decode_all(exec, cache, decode).unwrap();
    (pre.last, steps)
}

#[test]
fn fault_mid_multi_layer_prefill_poisons_and_replay_is_exact() {
    let mut exec = executor();
    let m = Tiny::new(&mut exec, TinyConfig::small()).unwrap();
    let prompt = tokens(20, 1, m.config.vocab);
    let decode = tokens(5, 2, m.config.vocab);
    let mut clean_cache = m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap();
    let clean = run(&mut exec, &m, &mut clean_cache, &prompt, &decode);

    let mut cache = m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap();
    // Layer 2's SwiGLU fails in the second chunk (tokens 8..16).
    exec.config_mut().diagnostics.fault = Some(Fault {
        label: "blk.2.ffn_silu_mul".into(),
        after: 1,
    });
    let err = m
        .prefill(&mut exec, &mut cache, &prompt, &ChunkPolicy::single(CHUNK))
        .unwrap_err();
    assert!(err.to_string().contains("blk.2.ffn_silu_mul"), "{err}");
    assert!(cache.is_poisoned());
    assert_eq!(
        cache.position(),
        8,
        "the first chunk was its own transaction"
    );
    assert_err_contains(m.decode(&mut exec, &mut cache, 1), &["poisoned", "reset()"]);
    assert_err_contains(
        m.prefill(&mut exec, &mut cache, &prompt, &ChunkPolicy::single(CHUNK)),
        &["poisoned"],
    );

    cache.reset();
    let replay = run(&mut exec, &m, &mut cache, &prompt, &decode);
    assert_same_bits(&replay.0, &clean.0, "prefill logits after replay");
    for (t, (a, b)) in replay.1.iter().zip(&clean.1).enumerate() {
        assert_same_bits(a, b, &format!("decode step {t} after replay"));
    }
}

#[test]
fn fault_mid_decode_poisons_and_replay_is_exact() {
    let mut exec = executor();
    let m = Tiny::new(&mut exec, TinyConfig::small()).unwrap();
    let prompt = tokens(13, 3, m.config.vocab);
    let decode = tokens(12, 4, m.config.vocab);
    let mut clean_cache = m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap();
    let clean = run(&mut exec, &m, &mut clean_cache, &prompt, &decode);

    let mut cache = m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap();
    m.prefill(&mut exec, &mut cache, &prompt, &ChunkPolicy::single(CHUNK))
        .unwrap();
    m.decode_all(&mut exec, &mut cache, &decode[..6]).unwrap();
    // The windowed layer's attention fails in the next decode step.
    exec.config_mut().diagnostics.fault = Some(Fault {
        label: "blk.1.attention".into(),
        after: 0,
    });
    let err = m.decode(&mut exec, &mut cache, decode[6]).unwrap_err();
    assert!(err.to_string().contains("blk.1.attention"), "{err}");
    assert_eq!(cache.position(), 19);
    assert!(cache.poisoned().unwrap().contains("position 19"));
    assert_err_contains(
        m.decode(&mut exec, &mut cache, decode[6]),
        &["poisoned", "reset()", "replay"],
    );

    cache.reset();
    let replay = run(&mut exec, &m, &mut cache, &prompt, &decode);
    assert_same_bits(&replay.0, &clean.0, "prefill logits after replay");
    for (t, (a, b)) in replay.1.iter().zip(&clean.1).enumerate() {
        assert_same_bits(a, b, &format!("decode step {t} after replay"));
    }
}
