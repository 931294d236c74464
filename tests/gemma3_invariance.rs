//! Gemma 3: the same greedy output whatever the schedule (reorder on and
//! off, 1 and 2 threads, 1, 3 and all layers per command buffer), and the
//! sliding-window layers running on the cache's window ring.

mod common;

use weft::models::sampling::argmax;
use weft::models::LogitRows;
use weft::runtime::cache::ChunkPolicy;

fn greedy(threads: usize, layers_per_cb: Option<u32>, reorder: bool) -> Vec<u32> {
    let common::Setup { mut exec, model } =
        common::load_gemma3(threads, layers_per_cb).expect("model");
    exec.config_mut().reorder = reorder;
    let ids = model
        .tokenizer
        .encode("Once upon a time, in a small village,");
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
    for _ in 0..16 {
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
    if common::load_gemma3(1, None).is_none() {
        return;
    }
    let baseline = greedy(2, None, true);
    for (threads, layers, reorder) in [
        (2, None, false),
        (1, Some(1), true),
        (2, Some(1), false),
        (2, Some(3), true),
    ] {
        assert_eq!(
            greedy(threads, layers, reorder),
            baseline,
            "threads {threads}, layers per command buffer {layers:?}, reorder {reorder}"
        );
    }
}

/// Largest KL divergence (nats) accepted between the next-token
/// distributions of the ring and the flat cache (measured: ~4e-6).
const KL_TOLERANCE: f64 = 1e-3;

/// `KL(softmax(p) || softmax(q))` of two logit vectors.
fn kl_divergence(p: &[f32], q: &[f32]) -> f64 {
    let log_softmax = |x: &[f32]| -> Vec<f64> {
        let max = x.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) as f64;
        let sum: f64 = x.iter().map(|v| (*v as f64 - max).exp()).sum();
        x.iter().map(|v| *v as f64 - max - sum.ln()).collect()
    };
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

/// Local layers get a ring of `window + max_chunk` rows once the context is
/// longer than that; global layers keep every position. A 700-token prompt
/// in chunks of 64 wraps the 576-row rings; the logits must agree with a
/// cache that holds every position.
///
/// Not bit for bit: attention visits a wrapped ring's slots in slot order,
/// not in position order, and its online softmax rounds differently. The
/// 8-bit activation quantization in front of every matmul turns such
/// last-bit differences into steps of one quantum (llama.cpp's numerics
/// notes measure 0.3-1.5 on logits for any systematic deviation), so the
/// check is on the distributions: the same top token and a small
/// Kullback-Leibler divergence (a model that attended to the wrong
/// positions predicts a different distribution altogether).
#[test]
fn sliding_window_layers_run_on_the_cache_ring() {
    let Some(common::Setup { mut exec, model }) = common::load_gemma3(2, None) else {
        return;
    };
    let text = (0..40)
        .map(|i| {
            format!(
                "Chapter {i}. The {} of the {} walked to the {} and counted {} stones. ",
                ["keeper", "baker", "captain", "painter"][i % 4],
                ["lighthouse", "village", "ship", "museum"][i % 3],
                ["river", "market", "harbour", "station", "forest"][i % 5],
                i * 7 + 3
            )
        })
        .collect::<String>();
    let ids = model.tokenizer.encode(&text);
    assert!(ids.len() >= 700, "the text has only {} tokens", ids.len());
    let ids = ids[..700].to_vec();
    let chunks = ChunkPolicy::single(64);
    let mut ring = model.new_cache(&mut exec, 1024, 64).expect("ring cache");
    let mut flat = model.new_cache(&mut exec, 1024, 1024).expect("flat cache");
    let mut rings = 0;
    for (l, layer) in ring.layers().iter().enumerate() {
        match layer.window {
            Some(w) => {
                assert_eq!(layer.ring, Some(w + 64), "layer {l}");
                rings += 1;
            }
            None => assert_eq!(layer.ring, None, "layer {l}"),
        }
    }
    assert_eq!(rings, 15, "Gemma 3 270M has 15 local layers");
    assert!(flat.layers().iter().all(|l| l.ring.is_none()));
    let a = model
        .prefill(&mut exec, &mut ring, &ids, &chunks, LogitRows::Last)
        .expect("ring prefill");
    let b = model
        .prefill(&mut exec, &mut flat, &ids, &chunks, LogitRows::Last)
        .expect("flat prefill");
    let kl = kl_divergence(&b, &a);
    eprintln!(
        "ring vs flat cache after {} tokens: KL(flat || ring) = {kl:.2e} nats, top tokens {} / {}",
        ids.len(),
        argmax(&a),
        argmax(&b)
    );
    assert_eq!(argmax(&a), argmax(&b));
    assert!(kl < KL_TOLERANCE, "KL divergence {kl}");
    // Decoding on past the ring's size keeps agreeing.
    let (mut la, mut lb) = (a, b);
    for _ in 0..4 {
        let t = argmax(&lb) as u32;
        assert_eq!(argmax(&la) as u32, t);
        la = model
            .step(&mut exec, &mut ring, &[t], LogitRows::Last)
            .expect("ring decode");
        lb = model
            .step(&mut exec, &mut flat, &[t], LogitRows::Last)
            .expect("flat decode");
    }
}
