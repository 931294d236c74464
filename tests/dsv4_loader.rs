//! The loader against real DeepSeek-V4 GGUF layouts: a Flash-sized file
//! (43 layers, real names, shapes, types and metadata, zero weights written
//! sparse, so nothing of its ~100 GB is allocated) loads and records a
//! decode step; a small random model with the real tensor types (Q8_0
//! dense, F16 small matrices, IQ2_XXS / Q2_K / Q4_K / MXFP4 experts) runs
//! and agrees with the f64 reference on the same weights.

mod dsv4_common;

use dsv4_common::argmax;
use weft::models::deepseek4::synthetic::{flash_config, random_gguf, write_sparse, TensorTypes};
use weft::models::deepseek4::{DeepSeek4, Dsv4Config, LoadOptions};
use weft::models::gguf::GgufFile;
use weft::models::weights::WeightMap;
use weft::models::LogitRows;
use weft::ops::DType;
use weft::runtime::{Device, ExecutorConfig, GraphExecutor};
use weft_testkit::deepseek4::RefModel;

fn exec() -> GraphExecutor {
    GraphExecutor::with_config(
        Device::Cpu,
        ExecutorConfig {
            threads: 2,
            ..ExecutorConfig::default()
        },
    )
    .expect("executor")
}

#[test]
fn a_flash_sized_gguf_with_real_names_shapes_and_types_loads() {
    let c = flash_config();
    let path = std::env::temp_dir().join(format!("weft-dsv4-flash-{}.gguf", std::process::id()));
    let bytes = write_sparse(&path, &c, &TensorTypes::flash_gguf()).expect("write");
    let result = std::panic::catch_unwind(|| {
        let file = GgufFile::open(&path).expect("open");
        let read = Dsv4Config::from_gguf(&file).expect("config");
        assert_eq!(read, c, "config read back (MTP ratio entry ignored)");
        let mut exec = exec();
        let weights = WeightMap::new(&file, &mut exec).expect("map");
        // No f32 copies of the F16 matrices at this size.
        let model =
            DeepSeek4::load(&weights, &mut exec, LoadOptions { widen_f16: false }).expect("load");
        let l3 = &model.weights.layers[3];
        assert_eq!(l3.gate_exps.shape.dims(), &[256, 2048, 4096]);
        assert_eq!(l3.down_exps.shape.dims(), &[256, 4096, 2048]);
        assert_eq!(l3.out_a.shape.dims(), &[8, 1024, 4096]);
        let types: Vec<DType> = (3..7)
            .map(|l| model.weights.layers[l].gate_exps.dtype)
            .collect();
        assert_eq!(
            types,
            [DType::Q4_K, DType::IQ2_XXS, DType::Q2_K, DType::MXFP4]
        );
        assert_eq!(model.weights.layers[2].q_b.dtype, DType::Q8_0);
        assert!(model.weights.layers[2].indexer.is_some());
        assert!(matches!(
            model.weights.layers[0].router,
            weft::models::deepseek4::weights::Router::Hash(_)
        ));
        // Record (not run) one decode token at position 1000.
        let cache = model.new_cache(&mut exec, 2048, 1).expect("cache");
        let mut s = exec.begin_recorded();
        model
            .record_step(&mut s, &[&cache], 1000, &[7], LogitRows::Last)
            .expect("record");
        let (nodes, schedule) = s.into_schedule().expect("schedule");
        eprintln!(
            "Flash-shaped GGUF: {:.1} GB (sparse), {} tensors; decode step: {} nodes, {} levels",
            bytes as f64 / 1e9,
            file.tensors().len(),
            nodes.len(),
            schedule.levels()
        );
        assert!(bytes > 50_000_000_000);
    });
    let _ = std::fs::remove_file(&path);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// A small config whose widths fit 256-value blocks (K and IQ quants).
fn small_config() -> Dsv4Config {
    let mut c = flash_config();
    c.layers = 4;
    c.hidden = 256;
    c.vocab = 300;
    c.heads = 2;
    c.head_dim = 64;
    c.rope_dims = 16;
    c.q_lora = 64;
    c.out_groups = 2;
    c.out_rank = 32;
    c.window = 16;
    c.ratios = vec![0, 4, 16, 4];
    c.indexer_heads = 4;
    c.indexer_dim = 32;
    c.indexer_top_k = 3;
    c.experts = 4;
    c.experts_used = 2;
    c.expert_ff = 256;
    c.hash_layers = 1;
    c.clamp_exp = vec![10.0; 4];
    c.clamp_shexp = vec![10.0; 4];
    c.context = 4096;
    c
}

#[test]
fn a_random_model_with_real_tensor_types_runs_like_the_reference() {
    let c = small_config();
    let types = TensorTypes::flash_gguf();
    let file = GgufFile::from_bytes(random_gguf(&c, &types, 7).expect("gguf")).expect("parse");
    let reference = RefModel::load(&file).expect("reference");
    let mut exec = exec();
    let weights = WeightMap::new(&file, &mut exec).expect("map");
    let model = DeepSeek4::load(&weights, &mut exec, LoadOptions::default()).expect("load");
    let prompt: Vec<u32> = (0..61).map(|i| (i * 47 + 3) % 300).collect();
    let want = reference.forward(&prompt).expect("reference forward");
    let mut cache = model.new_cache(&mut exec, 128, 128).expect("cache");
    let got = model
        .step(&mut exec, &mut cache, &prompt, LogitRows::All)
        .expect("prefill");
    let v = c.vocab;
    let scale = want.logits.iter().fold(0f64, |m, x| m.max(x.abs()));
    let mut worst = 0f64;
    let mut agree = 0;
    for (t, (g, w)) in got
        .chunks_exact(v)
        .zip(want.logits.chunks_exact(v))
        .enumerate()
    {
        let wf: Vec<f32> = w.iter().map(|&x| x as f32).collect();
        worst = worst.max(
            g.iter()
                .zip(&wf)
                .map(|(a, b)| (a - b).abs() as f64)
                .fold(0.0, f64::max),
        );
        agree += usize::from(argmax(g) == argmax(&wf));
        let _ = t;
    }
    eprintln!(
        "random model, experts IQ2_XXS/Q2_K/MXFP4/Q4_K, dense Q8_0: max |dlogit| {worst:.3} of max |logit| {scale:.2} (activations quantized to Q8_K/Q8_0); argmax agrees at {agree}/{} positions",
        prompt.len()
    );
    // The kernels quantize activations to 8 bits per block, as llama.cpp
    // does; the reference keeps them in f64.
    assert!(worst < 0.05 * scale, "{worst} vs {scale}");
    assert!(agree * 10 >= prompt.len() * 9, "argmax agrees at {agree}");
}

/// `weft synth-model`'s writer: a file with random tiled weights and the
/// synthetic tokenizer loads as a `Model` (tokenizer included), every
/// tensor's rows repeat with the tile's period, and a prefill and a decode
/// step give finite logits.
#[test]
fn a_tiled_random_file_loads_as_a_model_and_runs() {
    let c = small_config();
    let path = std::env::temp_dir().join(format!("weft-dsv4-tiled-{}.gguf", std::process::id()));
    let tile = 5;
    let bytes = weft::models::deepseek4::synthetic::write_random_tiled(
        &path,
        &c,
        &TensorTypes::flash_gguf(),
        3,
        tile,
    )
    .expect("write");
    let result = std::panic::catch_unwind(|| {
        assert_eq!(std::fs::metadata(&path).expect("size").len(), bytes);
        let file = GgufFile::open(&path).expect("open");
        assert_eq!(Dsv4Config::from_gguf(&file).expect("config"), c);
        // An expert tensor (rows = expert_ff x experts) repeats every `tile` rows.
        let info = file
            .tensor("blk.1.ffn_up_exps.weight")
            .expect("expert tensor");
        let data = file.tensor_data(info);
        let row = info.dtype.row_bytes(c.hidden).expect("row");
        assert_ne!(data[..row], data[row..2 * row], "rows within a tile differ");
        assert_eq!(data[..row], data[tile * row..(tile + 1) * row]);
        let mut exec = exec();
        let model = weft::models::Model::load(&path, &mut exec).expect("model with tokenizer");
        let mut cache = model.new_cache(&mut exec, 64, 64).expect("cache");
        let prompt: Vec<u32> = (0..9).map(|i| (i * 31 + 8) % 300).collect();
        let policy = weft::runtime::cache::ChunkPolicy::single(64);
        let logits = model
            .prefill(&mut exec, &mut cache, &prompt, &policy, LogitRows::Last)
            .expect("prefill");
        assert!(
            logits.iter().all(|x| x.is_finite()),
            "prefill logits finite"
        );
        let next = argmax(&logits);
        let step = model
            .step(&mut exec, &mut cache, &[next], LogitRows::Last)
            .expect("decode");
        assert!(step.iter().all(|x| x.is_finite()), "decode logits finite");
    });
    let _ = std::fs::remove_file(&path);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
