//! A custom model on weft: a tiny GPT-2-style network with random weights,
//! written against the public builder API (see `model.rs`), run through a
//! prefill and a few greedy decode steps, and checked against a plain Rust
//! implementation of the same maths (`reference.rs`).
//!
//! ```sh
//! cargo run --release --example gpt2
//! ```

mod model;
mod reference;

use model::{Gpt2, Gpt2Config, Gpt2Values};
use weft::runtime::{Device, GraphExecutor};

/// Largest |logit - reference| accepted. The reference sums in f64; weft
/// runs f32 matmuls (error ~1e-6 relative) and evaluates GELU like ggml,
/// through a table of f16 values (2^-11 relative on the MLP activations),
/// which moves logits of magnitude up to ~30 by ~4e-3 (measured).
pub const TOLERANCE: f32 = 1e-2;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Gpt2Config::tiny();
    let values = Gpt2Values::random(config, 7);
    let mut exec = GraphExecutor::new(Device::Cpu)?;
    let model = Gpt2::upload(&values, &mut exec)?;
    let mut cache = model.new_cache(&mut exec)?;

    let mut tokens: Vec<u32> = vec![5, 17, 42, 3, 88, 60, 1];
    let logits = model.step(&mut exec, &mut cache, &tokens)?;
    let want = reference::forward(&values, &tokens);
    let mut worst = max_diff(&logits, &want);
    println!(
        "prefill of {} tokens: max |logit - reference| = {worst:.2e}",
        tokens.len()
    );
    let mut last = logits[(tokens.len() - 1) * config.vocab..].to_vec();
    for step in 0..8 {
        let next = argmax(&last) as u32;
        tokens.push(next);
        last = model.step(&mut exec, &mut cache, &[next])?;
        let want = reference::forward(&values, &tokens);
        let diff = max_diff(&last, &want[(tokens.len() - 1) * config.vocab..]);
        worst = worst.max(diff);
        println!("decode step {step}: token {next}, max |logit - reference| = {diff:.2e}");
    }
    println!("tokens: {tokens:?}");
    if worst > TOLERANCE {
        return Err(format!("logits differ from the reference by {worst}").into());
    }
    println!("weft matches the plain reference within {TOLERANCE}");
    Ok(())
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}
