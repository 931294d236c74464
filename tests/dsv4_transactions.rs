//! DeepSeek-V4's cache state as transactions: a fault injected mid-prefill
//! on a compressed layer poisons the cache (chunks before it stay
//! published, nothing else is accepted); reset and replay reproduce the
//! clean run bit for bit; a snapshot taken in the middle of compressor
//! windows restores exactly, after decoding across window boundaries.

mod dsv4_common;

use dsv4_common::{argmax, Fixture};
use weft::models::deepseek4::{DeepSeek4, LoadOptions};
use weft::models::gguf::GgufFile;
use weft::models::weights::WeightMap;
use weft::models::LogitRows;
use weft::runtime::cache::KvCache;
use weft::runtime::{Device, DiagnosticsConfig, ExecutorConfig, Fault, GraphExecutor};

fn setup(f: &Fixture) -> (GraphExecutor, DeepSeek4, GgufFile) {
    let config = ExecutorConfig {
        threads: 2,
        diagnostics: DiagnosticsConfig::checked(),
        ..ExecutorConfig::default()
    };
    let mut exec = GraphExecutor::with_config(Device::Cpu, config).expect("executor");
    let file = GgufFile::open(&f.gguf()).expect("gguf");
    let weights = WeightMap::new(&file, &mut exec).expect("weights");
    let model = DeepSeek4::load(&weights, &mut exec, LoadOptions::default()).expect("model");
    (exec, model, file)
}

/// Prefill in chunks of `chunk`, then `decode` greedy steps; all logits.
fn run(
    exec: &mut GraphExecutor,
    model: &DeepSeek4,
    cache: &mut KvCache,
    prompt: &[u32],
    chunk: usize,
    decode: usize,
) -> Result<Vec<Vec<f32>>, weft::models::ModelError> {
    let mut out = Vec::new();
    for part in prompt.chunks(chunk) {
        out.push(model.step(exec, cache, part, LogitRows::All)?);
    }
    let v = model.config.vocab;
    let last = out.last().map_or(0, |l| argmax(&l[l.len() - v..]));
    let (_, steps) = model.greedy(exec, cache, last, decode)?;
    out.extend(steps);
    Ok(out)
}

#[test]
fn fault_mid_prefill_on_a_compressed_layer_poisons_and_replay_is_exact() {
    for f in [
        Fixture::load("flash-tiny-short", "_p43"),
        Fixture::load("flash-tiny", ""),
    ] {
        let (mut exec, model, _file) = setup(&f);
        let chunk = 16;
        let mut clean_cache = model.new_cache(&mut exec, 512, 512).expect("cache");
        let clean =
            run(&mut exec, &model, &mut clean_cache, &f.prompt, chunk, 16).expect("clean run");

        let mut cache = model.new_cache(&mut exec, 512, 512).expect("cache");
        model
            .step(&mut exec, &mut cache, &f.prompt[..chunk], LogitRows::All)
            .expect("first chunk");
        // Layer 2 (CSA) fails in the second chunk at the compressor's
        // pooling, after this chunk's values and gates reached the rings.
        exec.config_mut().diagnostics.fault = Some(Fault {
            label: "blk.2.attn_compressor.pool".into(),
            after: 0,
        });
        let err = model
            .step(
                &mut exec,
                &mut cache,
                &f.prompt[chunk..2 * chunk],
                LogitRows::All,
            )
            .expect_err("the injected fault fails the chunk");
        eprintln!("{}: injected fault -> {err}", f.name());
        assert!(cache.is_poisoned(), "a failed step poisons the cache");
        assert_eq!(
            cache.position() as usize,
            chunk,
            "the first chunk stays published"
        );
        let refused = model.step(
            &mut exec,
            &mut cache,
            &f.prompt[chunk..chunk + 1],
            LogitRows::Last,
        );
        assert!(refused.is_err(), "a poisoned cache refuses further steps");
        assert!(cache.snapshot(&mut exec).is_err(), "and snapshots");

        cache.reset();
        let replay = run(&mut exec, &model, &mut cache, &f.prompt, chunk, 16).expect("replay");
        assert!(
            replay == clean,
            "{}: replay after reset differs from the clean run",
            f.name()
        );
        eprintln!(
            "{}: reset + replay reproduce the clean run bit for bit",
            f.name()
        );
    }
}

#[test]
fn snapshot_restore_across_compressor_boundaries_is_exact() {
    let f = Fixture::load("flash-tiny-short", "");
    let (mut exec, model, _file) = setup(&f);
    let mut cache = model.new_cache(&mut exec, 256, 64).expect("cache");
    // 41 tokens: the snapshot sits inside a CSA window (41 mod 4 = 1), an
    // HCA window (41 mod 16 = 9) and after the window ring wrapped (W 8).
    let prompt = &f.prompt[..40];
    let logits = model
        .step(&mut exec, &mut cache, prompt, LogitRows::Last)
        .expect("prefill");
    model
        .step(&mut exec, &mut cache, &[argmax(&logits)], LogitRows::Last)
        .expect("step");
    assert_eq!(cache.position(), 41);
    let snap = cache.snapshot(&mut exec).expect("snapshot");
    // Decode 12 tokens: CSA rows close at 43, 47, 51; the HCA row at 47.
    let cont: Vec<u32> = (0..12).map(|i| (i * 31 + 5) % 512).collect();
    let decode = |exec: &mut GraphExecutor, cache: &mut KvCache, toks: &[u32]| -> Vec<Vec<f32>> {
        toks.iter()
            .map(|&t| {
                model
                    .step(exec, cache, &[t], LogitRows::Last)
                    .expect("decode")
            })
            .collect()
    };
    let first = decode(&mut exec, &mut cache, &cont);
    // Another continuation overwrites the rings and the row tables.
    cache.restore(&mut exec, &snap).expect("restore");
    let other: Vec<u32> = (0..20).map(|i| (i * 7 + 100) % 512).collect();
    decode(&mut exec, &mut cache, &other);
    // Back again: the first continuation must give the same bits.
    cache.restore(&mut exec, &snap).expect("restore");
    assert_eq!(cache.position(), 41);
    let again = decode(&mut exec, &mut cache, &cont);
    assert!(first == again, "decoding after restore differs");
    // And a fresh cache fed the same tokens agrees too.
    let mut fresh = model.new_cache(&mut exec, 256, 64).expect("cache");
    model
        .step(&mut exec, &mut fresh, prompt, LogitRows::Last)
        .expect("prefill");
    model
        .step(&mut exec, &mut fresh, &[argmax(&logits)], LogitRows::Last)
        .expect("step");
    let fresh_out = decode(&mut exec, &mut fresh, &cont);
    assert!(
        first == fresh_out,
        "a restored cache differs from a fresh one"
    );
    eprintln!(
        "snapshot at 41 ({} bytes), 12 decode steps across CSA rows 10-12 and HCA row 2, restore, 20 other steps, restore: identical bits",
        snap.bytes()
    );
}
