//! The custom-model example (`examples/gpt2/`) against its plain reference:
//! prefill and decode logits, under every schedule setting (reorder on and
//! off, 1 and 2 threads, 1 layer or all layers per command buffer).

#[path = "../examples/gpt2/model.rs"]
#[allow(dead_code)]
mod model;
#[path = "../examples/gpt2/reference.rs"]
mod reference;

use model::{Gpt2, Gpt2Config, Gpt2Values};
use weft::runtime::{Device, DiagnosticsConfig, ExecutorConfig, GraphExecutor};

/// See `examples/gpt2/main.rs`: f32 matmuls against f64 sums (~1e-6
/// relative) and ggml's f16-table GELU (~2^-11 relative on the MLP
/// activations) keep logits of magnitude up to ~30 within ~4e-3 (measured).
const TOLERANCE: f32 = 1e-2;

fn run(threads: usize, layers_per_cb: Option<u32>, reorder: bool) -> Vec<Vec<f32>> {
    let config = Gpt2Config::tiny();
    let values = Gpt2Values::random(config, 11);
    let mut exec_config = ExecutorConfig {
        threads,
        reorder,
        diagnostics: DiagnosticsConfig::checked(),
        ..Default::default()
    };
    exec_config.cut.layers_per_cb = layers_per_cb;
    let mut exec = GraphExecutor::with_config(Device::Cpu, exec_config).expect("executor");
    let model = Gpt2::upload(&values, &mut exec).expect("upload");
    let mut cache = model.new_cache(&mut exec).expect("cache");
    let mut tokens: Vec<u32> = vec![3, 14, 15, 92, 65, 35, 89, 79, 32, 38];
    let mut outputs = Vec::new();
    // Prefill in two chunks (a cached prefix, then more), then decode.
    let first = model
        .step(&mut exec, &mut cache, &tokens[..6])
        .expect("prefill 1");
    let second = model
        .step(&mut exec, &mut cache, &tokens[6..])
        .expect("prefill 2");
    let mut logits = [first, second].concat();
    let want = reference::forward(&values, &tokens);
    assert_close(&logits, &want, "prefill");
    outputs.push(logits.clone());
    for step in 0..6 {
        let next = (step * 31 + 7) % config.vocab as u32;
        tokens.push(next);
        logits = model.step(&mut exec, &mut cache, &[next]).expect("decode");
        let want = reference::forward(&values, &tokens);
        assert_close(
            &logits,
            &want[(tokens.len() - 1) * config.vocab..],
            &format!("decode {step}"),
        );
        outputs.push(logits.clone());
    }
    outputs
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: logit count");
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    eprintln!("{what}: max |logit - reference| = {worst:.2e} (logits up to {scale:.2})");
    assert!(worst <= TOLERANCE, "{what}: logits differ by {worst}");
}

#[test]
fn custom_model_matches_its_plain_reference_under_every_schedule() {
    let baseline = run(1, None, true);
    for (threads, layers, reorder) in [(2, None, true), (1, Some(1), false), (2, Some(1), true)] {
        // The schedule never changes what a node computes: same bits.
        assert_eq!(
            run(threads, layers, reorder),
            baseline,
            "threads {threads}, layers per command buffer {layers:?}, reorder {reorder}"
        );
    }
}
