//! DeepSeek-V4 on weft: the same outputs whatever the schedule (reorder on
//! or off, 1 or 4 layers per command buffer), however the prompt is cut
//! (one chunk, several, token by token), and for a B=4 cohort as for four
//! single runs; the per-layer streams against the fixtures (taps).

mod dsv4_common;

use dsv4_common::{argmax, max_abs_diff, Fixture};
use weft::models::deepseek4::{DeepSeek4, LoadOptions};
use weft::models::gguf::GgufFile;
use weft::models::weights::WeightMap;
use weft::models::LogitRows;
use weft::runtime::cache::KvCache;
use weft::runtime::{Device, DiagnosticsConfig, ExecutorConfig, GraphExecutor};

pub fn setup(f: &Fixture, config: ExecutorConfig) -> (GraphExecutor, DeepSeek4, GgufFile) {
    let mut exec = GraphExecutor::with_config(Device::Cpu, config).expect("executor");
    let file = GgufFile::open(&f.gguf()).expect("gguf");
    let weights = WeightMap::new(&file, &mut exec).expect("weights");
    let model = DeepSeek4::load(&weights, &mut exec, LoadOptions::default()).expect("model");
    (exec, model, file)
}

fn config(reorder: bool, layers_per_cb: Option<u32>) -> ExecutorConfig {
    let mut c = ExecutorConfig {
        threads: 2,
        reorder,
        diagnostics: DiagnosticsConfig::checked(),
        ..ExecutorConfig::default()
    };
    c.cut.layers_per_cb = layers_per_cb;
    c
}

/// Prefill in steps of the given sizes (all logits), then `decode` greedy steps.
fn run(
    exec: &mut GraphExecutor,
    model: &DeepSeek4,
    cache: &mut KvCache,
    prompt: &[u32],
    chunks: &[usize],
    decode: usize,
) -> (Vec<f32>, Vec<u32>, Vec<Vec<f32>>) {
    let mut logits = Vec::new();
    let mut done = 0;
    for &n in chunks.iter().cycle() {
        if done == prompt.len() {
            break;
        }
        let n = n.min(prompt.len() - done);
        logits.extend(
            model
                .step(exec, cache, &prompt[done..done + n], LogitRows::All)
                .expect("step"),
        );
        done += n;
    }
    let v = model.config.vocab;
    let first = argmax(&logits[logits.len() - v..]);
    let (mut tokens, steps) = model.greedy(exec, cache, first, decode).expect("greedy");
    tokens.insert(0, first);
    (logits, tokens, steps)
}

#[test]
fn schedules_give_identical_bits() {
    for f in [
        Fixture::load("flash-tiny-short", "_p43"),
        Fixture::load("flash-tiny", ""),
    ] {
        let mut base = None;
        for (reorder, cb) in [
            (true, None),
            (false, None),
            (true, Some(1)),
            (true, Some(4)),
            (false, Some(4)),
        ] {
            let (mut exec, model, _file) = setup(&f, config(reorder, cb));
            let mut cache = model.new_cache(&mut exec, 512, 512).expect("cache");
            let out = run(&mut exec, &model, &mut cache, &f.prompt, &[512], 8);
            match &base {
                None => base = Some(out),
                Some(b) => assert!(
                    *b == out,
                    "{}: reorder {reorder}, layers per command buffer {cb:?} changed the outputs",
                    f.name()
                ),
            }
        }
        eprintln!(
            "{}: reorder on/off x 1 / 4 / all layers per command buffer: identical bits",
            f.name()
        );
    }
}

#[test]
fn chunking_gives_the_same_outputs() {
    for f in [
        Fixture::load("flash-tiny-short", "_p43"),
        Fixture::load("flash-tiny", "_p375"),
    ] {
        let (mut exec, model, _file) = setup(&f, config(true, None));
        let mut results = Vec::new();
        // One chunk; uneven chunks that split windows of 4, 8 and 16 (and
        // 128) at every phase; token by token.
        for chunks in [vec![512], vec![7, 13, 5, 64, 31], vec![1]] {
            let mut cache = model.new_cache(&mut exec, 512, 512).expect("cache");
            results.push((
                chunks.clone(),
                run(&mut exec, &model, &mut cache, &f.prompt, &chunks, 15),
            ));
        }
        let want = f.logits_all();
        let (_, (b_logits, b_tokens, b_steps)) = &results[0];
        for (chunks, (logits, tokens, steps)) in &results {
            let vs_one = max_abs_diff(logits, b_logits);
            let vs_ref = max_abs_diff(logits, &want);
            let dec = steps
                .iter()
                .zip(b_steps)
                .map(|(a, b)| max_abs_diff(a, b))
                .fold(0.0, f64::max);
            eprintln!(
                "{} chunks {chunks:?}: max |dlogit| vs one chunk {vs_one:.1e}, vs reference {vs_ref:.1e}, decode vs one chunk {dec:.1e}",
                f.name()
            );
            assert!(
                vs_one < 1e-4 && vs_ref < 1e-3 && dec < 1e-4,
                "{}: chunks {chunks:?}",
                f.name()
            );
            assert_eq!(
                tokens,
                b_tokens,
                "{}: greedy after chunks {chunks:?}",
                f.name()
            );
            assert_eq!(
                tokens,
                &f.greedy_tokens(),
                "{}: greedy vs reference",
                f.name()
            );
        }
    }
}

#[test]
fn cohort_of_four_matches_four_single_runs() {
    let f = Fixture::load("flash-tiny-short", "");
    let (mut exec, model, _file) = setup(&f, config(true, None));
    let v = f.vocab;
    // Four prompts of one length (different tokens, so lanes diverge).
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|b| {
            f.prompt
                .iter()
                .map(|&t| (t + 37 * b as u32) % v as u32)
                .collect()
        })
        .collect();
    let steps = 16;
    // Single runs.
    let mut single = Vec::new();
    for p in &prompts {
        let mut cache = model.new_cache(&mut exec, 128, 64).expect("cache");
        single.push(run(&mut exec, &model, &mut cache, p, &[64], steps));
    }
    // The cohort: each lane prefilled alone, then decoded together.
    let mut caches: Vec<KvCache> = (0..4)
        .map(|_| model.new_cache(&mut exec, 128, 64).expect("cache"))
        .collect();
    let mut next = Vec::new();
    for (cache, p) in caches.iter_mut().zip(&prompts) {
        let logits = model
            .step(&mut exec, cache, p, LogitRows::Last)
            .expect("prefill");
        next.push(argmax(&logits));
    }
    let mut worst = 0f64;
    let mut gated = 0;
    for j in 0..steps {
        let lanes: Vec<&mut KvCache> = caches.iter_mut().collect();
        let logits = model
            .cohort_step(&mut exec, lanes, &next, |plan, values| {
                gated += 1;
                if plan.lanes != 4 || values.len() != 4 * v {
                    return Err("unexpected cohort output".into());
                }
                Ok(())
            })
            .expect("cohort step");
        for b in 0..4 {
            let row = &logits[b * v..(b + 1) * v];
            worst = worst.max(max_abs_diff(row, &single[b].2[j]));
            next[b] = argmax(row);
            assert_eq!(next[b], single[b].1[j + 1], "lane {b} step {j}: token");
        }
    }
    assert_eq!(gated, steps);
    assert!(caches
        .iter()
        .all(|c| c.position() as usize == prompts[0].len() + steps));
    eprintln!(
        "B=4 cohort vs 4 single runs: {steps} tokens identical per lane, max |dlogit| {worst:.1e}"
    );
    assert!(worst < 1e-4);
}

#[test]
fn a_refusing_gate_poisons_every_lane() {
    let f = Fixture::load("flash-tiny-short", "");
    let (mut exec, model, _file) = setup(&f, config(true, None));
    let mut caches: Vec<KvCache> = (0..4)
        .map(|_| model.new_cache(&mut exec, 128, 64).expect("cache"))
        .collect();
    for cache in &mut caches {
        model
            .step(&mut exec, cache, &f.prompt, LogitRows::Last)
            .expect("prefill");
    }
    let lanes: Vec<&mut KvCache> = caches.iter_mut().collect();
    let err = model
        .cohort_step(&mut exec, lanes, &[1, 2, 3, 4], |_, _| {
            Err("refused by the test".into())
        })
        .expect_err("the gate refuses");
    assert!(err.to_string().contains("refused by the test"), "{err}");
    for c in &caches {
        assert!(c.is_poisoned());
        assert_eq!(c.position() as usize, f.prompt.len(), "nothing published");
    }
}

#[test]
fn layer_streams_match_the_fixtures() {
    for f in Fixture::all() {
        let (mut exec, model, _file) = setup(&f, config(true, None));
        exec.enable_taps();
        let mut cache = model.new_cache(&mut exec, 512, 512).expect("cache");
        model
            .step(&mut exec, &mut cache, &f.prompt, LogitRows::Last)
            .expect("prefill");
        let taps = exec.take_taps().expect("taps");
        let width = model.config.hc * model.config.hidden;
        let mut diffs = Vec::new();
        for l in 0..model.config.layers {
            let (_, _, values) = taps
                .iter()
                .find(|(name, _, _)| name == &format!("streams-{l}"))
                .expect("streams tap");
            let last = &values[values.len() - width..];
            diffs.push(max_abs_diff(last, &f.layer_streams(l)));
            let rms: Vec<f64> = values
                .chunks_exact(width)
                .map(|r| (r.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / width as f64).sqrt())
                .collect();
            let want = f.floats(&f.json["layers"][l]["rms_per_position"]);
            assert!(
                max_abs_diff(&rms, &want) < 1e-3,
                "{} layer {l}: rms per position",
                f.name()
            );
        }
        eprintln!(
            "{}: streams leaving each layer at the last position, max |diff|: {:?}",
            f.name(),
            diffs.iter().map(|d| format!("{d:.1e}")).collect::<Vec<_>>()
        );
        assert!(diffs.iter().all(|&d| d < 1e-3), "{}", f.name());
    }
}
