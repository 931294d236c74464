//! Snapshots and rollback, and several sequences sharing one cache through
//! a `SequenceStore`, on the tiny transformer (whose middle layer is a
//! 14-row ring for a window of 6, so rollbacks past the ring's headroom
//! need the rows the snapshot saved).

mod support;

use support::{assert_err_contains, assert_same_bits, executor, tokens, Tiny, TinyConfig};
use weft_runtime::cache::{ChunkPolicy, KvCache, SequenceId, SequenceStore};
use weft_runtime::{Fault, GraphExecutor};

const CONTEXT: u32 = 64;
const CHUNK: u32 = 8;

fn setup() -> (GraphExecutor, Tiny) {
    let mut exec = executor();
    let m = Tiny::new(&mut exec, TinyConfig::small()).unwrap();
    (exec, m)
}

fn prefilled(exec: &mut GraphExecutor, m: &Tiny, prompt: &[u32]) -> KvCache {
    let mut c = m.new_cache(exec, CONTEXT, CHUNK).unwrap();
    m.prefill(exec, &mut c, prompt, &ChunkPolicy::single(CHUNK))
        .unwrap();
    c
}

fn assert_steps_equal(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert_eq!(a.len(), b.len());
    for (t, (x, y)) in a.iter().zip(b).enumerate() {
        assert_same_bits(x, y, &format!("{what}, step {t}"));
    }
}

#[test]
fn snapshot_decode_restore_decode_gives_identical_logits() {
    let (mut exec, m) = setup();
    let prompt = tokens(17, 1, m.config.vocab);
    let mut cache = prefilled(&mut exec, &m, &prompt);
    let snap = cache.snapshot(&mut exec).unwrap();
    assert_eq!(snap.position(), 17);
    // Only the windowed layer's last 5 positions are copied (f16, 32 wide, K and V).
    assert_eq!(snap.bytes(), 5 * 2 * 64);
    // 12 tokens: more than the ring's 8 rows of headroom, so slots the
    // window still needs at position 17 are overwritten.
    let k = tokens(12, 2, m.config.vocab);
    let first = m.decode_all(&mut exec, &mut cache, &k).unwrap();
    cache.restore(&mut exec, &snap).unwrap();
    assert_eq!(cache.position(), 17);
    let second = m.decode_all(&mut exec, &mut cache, &k).unwrap();
    assert_steps_equal(&first, &second, "after restore");
    // And the same snapshot again (a speculative loop restores repeatedly).
    cache.restore(&mut exec, &snap).unwrap();
    let third = m.decode_all(&mut exec, &mut cache, &k).unwrap();
    assert_steps_equal(&first, &third, "after a second restore");
}

#[test]
fn rejected_drafts_leave_no_trace() {
    let (mut exec, m) = setup();
    let prompt = tokens(9, 3, m.config.vocab);
    let (draft, accepted) = (tokens(11, 4, m.config.vocab), tokens(6, 5, m.config.vocab));
    let mut never = prefilled(&mut exec, &m, &prompt);
    let want = m.decode_all(&mut exec, &mut never, &accepted).unwrap();

    let mut cache = prefilled(&mut exec, &m, &prompt);
    let snap = cache.snapshot(&mut exec).unwrap();
    m.decode_all(&mut exec, &mut cache, &draft).unwrap();
    cache.restore(&mut exec, &snap).unwrap();
    let got = m.decode_all(&mut exec, &mut cache, &accepted).unwrap();
    assert_steps_equal(&got, &want, "after rejecting a draft");
}

#[test]
fn restore_clears_poison_and_a_cancelled_prompt_rolls_back() {
    let (mut exec, m) = setup();
    let prompt = tokens(10, 6, m.config.vocab);
    let next = tokens(4, 7, m.config.vocab);
    let mut clean = prefilled(&mut exec, &m, &prompt);
    let want = m.decode_all(&mut exec, &mut clean, &next).unwrap();

    let mut cache = prefilled(&mut exec, &m, &prompt);
    let snap = cache.snapshot(&mut exec).unwrap();
    // A long follow-up prompt fails in its second chunk.
    exec.config_mut().diagnostics.fault = Some(Fault {
        label: "blk.1.attention".into(),
        after: 1,
    });
    let long = tokens(20, 8, m.config.vocab);
    assert!(m
        .prefill(&mut exec, &mut cache, &long, &ChunkPolicy::single(CHUNK))
        .is_err());
    assert!(cache.is_poisoned());
    assert_eq!(cache.position(), 18);
    assert_err_contains(cache.snapshot(&mut exec), &["poisoned", "restore()"]);
    cache.restore(&mut exec, &snap).unwrap();
    assert!(!cache.is_poisoned());
    let got = m.decode_all(&mut exec, &mut cache, &next).unwrap();
    assert_steps_equal(&got, &want, "after rolling back a failed prompt");
}

#[test]
fn stale_or_foreign_snapshots_are_refused_without_changes() {
    let (mut exec, m) = setup();
    let mut a = prefilled(&mut exec, &m, &tokens(5, 9, m.config.vocab));
    let mut b = prefilled(&mut exec, &m, &tokens(5, 10, m.config.vocab));
    let at5 = a.snapshot(&mut exec).unwrap();
    assert_err_contains(b.restore(&mut exec, &at5), &["another sequence"]);
    assert_eq!(b.position(), 5);

    m.decode_all(&mut exec, &mut a, &[1, 2, 3]).unwrap();
    let at8 = a.snapshot(&mut exec).unwrap();
    m.decode(&mut exec, &mut a, 4).unwrap();
    // Back to 5, then forward with other tokens: rows 5..8 changed, so the
    // snapshot at 8 is stale; the one at 5 still holds.
    a.restore(&mut exec, &at5).unwrap();
    m.decode_all(&mut exec, &mut a, &[7, 7, 7, 7]).unwrap();
    assert_err_contains(
        a.restore(&mut exec, &at8),
        &["went back to position 5", "reset() and replay"],
    );
    assert_eq!(a.position(), 9);
    a.restore(&mut exec, &at5).unwrap();
    assert_eq!(a.position(), 5);
    // A reset starts a new sequence.
    a.reset();
    assert_err_contains(a.restore(&mut exec, &at5), &["another sequence"]);
    assert_eq!(a.position(), 0);
}

/// Interleaves three conversations on one store and checks each against a
/// cache of its own.
#[test]
fn sequences_share_one_cache_and_keep_their_frontiers() {
    let (mut exec, m) = setup();
    let vocab = m.config.vocab;
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| tokens(7 + 5 * i, 20 + i as u32, vocab))
        .collect();
    let turns: Vec<Vec<u32>> = (0..3).map(|i| tokens(9, 30 + i as u32, vocab)).collect();
    // Reference: every conversation alone.
    let mut want = Vec::new();
    for (p, t) in prompts.iter().zip(&turns) {
        let mut c = prefilled(&mut exec, &m, p);
        want.push(m.decode_all(&mut exec, &mut c, t).unwrap());
    }

    let mut store = SequenceStore::new(m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap());
    let ids: Vec<SequenceId> = (0..3).map(SequenceId).collect();
    for (&id, p) in ids.iter().zip(&prompts) {
        store.open(id).unwrap();
        let cache = store.swap_in(&mut exec, id).unwrap();
        m.prefill(&mut exec, cache, p, &ChunkPolicy::single(CHUNK))
            .unwrap();
    }
    let mut got = vec![Vec::new(); 3];
    // Round robin, three tokens per turn.
    for round in 0..3 {
        for (i, &id) in ids.iter().enumerate() {
            let cache = store.swap_in(&mut exec, id).unwrap();
            for &t in &turns[i][round * 3..round * 3 + 3] {
                got[i].push(m.decode(&mut exec, cache, t).unwrap());
            }
        }
    }
    for i in 0..3 {
        assert_steps_equal(&got[i], &want[i], &format!("conversation {i}"));
        assert_eq!(store.position(ids[i]), Some(prompts[i].len() as u32 + 9));
    }
    assert_eq!(store.resident(), Some(ids[2]));
    assert_eq!(store.ids(), ids);
    assert!(store.parked_bytes() > 0);
}

#[test]
fn snapshots_survive_a_swap_out_and_in() {
    let (mut exec, m) = setup();
    let vocab = m.config.vocab;
    let (prompt, draft, next) = (
        tokens(12, 40, vocab),
        tokens(10, 41, vocab),
        tokens(5, 42, vocab),
    );
    let mut never = prefilled(&mut exec, &m, &prompt);
    let want = m.decode_all(&mut exec, &mut never, &next).unwrap();

    let mut store = SequenceStore::new(m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap());
    let (a, b) = (SequenceId(1), SequenceId(2));
    store.open(a).unwrap();
    store.open(b).unwrap();
    let cache = store.swap_in(&mut exec, a).unwrap();
    m.prefill(&mut exec, cache, &prompt, &ChunkPolicy::single(CHUNK))
        .unwrap();
    let snap = cache.snapshot(&mut exec).unwrap();
    m.decode_all(&mut exec, cache, &draft).unwrap();
    // Another conversation overwrites every row of the resident cache.
    let cache = store.swap_in(&mut exec, b).unwrap();
    m.prefill(
        &mut exec,
        cache,
        &tokens(30, 43, vocab),
        &ChunkPolicy::single(CHUNK),
    )
    .unwrap();
    let cache = store.swap_in(&mut exec, a).unwrap();
    assert_eq!(cache.position(), 22);
    cache.restore(&mut exec, &snap).unwrap();
    let got = m.decode_all(&mut exec, cache, &next).unwrap();
    assert_steps_equal(&got, &want, "restored after a swap");
}

#[test]
fn store_refusals_change_nothing() {
    let (mut exec, m) = setup();
    let mut store = SequenceStore::new(m.new_cache(&mut exec, CONTEXT, CHUNK).unwrap());
    let (a, b) = (SequenceId(1), SequenceId(2));
    assert_err_contains(
        store.swap_in(&mut exec, a).map(|_| ()),
        &["not open", "open()"],
    );
    store.open(a).unwrap();
    assert_err_contains(store.open(a), &["already open"]);
    store.open(b).unwrap();
    let cache = store.swap_in(&mut exec, a).unwrap();
    m.decode_all(&mut exec, cache, &[1, 2]).unwrap();
    cache.poison("test");
    // A poisoned sequence cannot be parked: swapping to b is refused.
    assert_err_contains(
        store.swap_in(&mut exec, b).map(|_| ()),
        &["poisoned", "close()"],
    );
    assert_eq!(store.resident(), Some(a));
    assert_eq!(store.position(b), Some(0));
    store.close(a).unwrap();
    assert_eq!(store.resident(), None);
    assert_err_contains(store.close(a), &["not open"]);
    store.swap_in(&mut exec, b).unwrap();
    assert_eq!(store.swap_out(&mut exec).unwrap(), Some(b));
    assert_eq!(store.swap_out(&mut exec).unwrap(), None);
    assert!(store.cache_mut().is_none());
}
