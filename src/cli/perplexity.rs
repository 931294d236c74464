//! `weft perplexity`: llama-perplexity's method. The text is tokenized once
//! (BOS first if the model adds one), split into non-overlapping windows of
//! `ctx` tokens (the first token of each window replaced by BOS when the
//! model adds BOS), and each window scores the log-likelihood of its second
//! half.

use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use weft::models::LogitRows;

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text file.
    #[arg(long, short = 'f')]
    file: PathBuf,
    /// Window (context) length in tokens.
    #[arg(long, default_value_t = 512)]
    ctx: u32,
    /// Print one JSON object: {"ppl", "chunks", "tokens"}.
    #[arg(long)]
    json: bool,
}

pub fn run(a: PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("cannot read {}", a.file.display()))?;
    let (mut exec, model) = a.model.load()?;
    let tokens = model.tokenizer.encode(&text);
    let ctx = a.ctx as usize;
    if ctx < 2 {
        bail!("--ctx must be at least 2");
    }
    let chunks = tokens.len() / ctx;
    if chunks == 0 {
        bail!("the text has {} tokens, fewer than one window of {ctx}", tokens.len());
    }
    let vocab = model.vocab();
    let bos = model.tokenizer.add_bos().then(|| model.tokenizer.bos()).flatten();
    let mut cache = model.new_cache(&mut exec, a.ctx, a.ctx)?;
    let policy = weft::runtime::cache::ChunkPolicy {
        multiplier: u32::MAX / 256,
        ..Default::default()
    };
    let (mut nll, mut count) = (0f64, 0usize);
    for c in 0..chunks {
        let mut window = tokens[c * ctx..(c + 1) * ctx].to_vec();
        if let Some(b) = bos {
            window[0] = b;
        }
        cache.reset();
        let logits = model.prefill(&mut exec, &mut cache, &window, &policy, LogitRows::All)?;
        for i in ctx / 2..ctx - 1 {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
            let sum: f64 = row.iter().map(|v| ((v - max) as f64).exp()).sum();
            let target = window[i + 1] as usize;
            nll -= (row[target] - max) as f64 - sum.ln();
            count += 1;
        }
        if !a.json {
            eprintln!("[{}] {:.4}", c + 1, (nll / count as f64).exp());
        }
    }
    let ppl = (nll / count as f64).exp();
    if a.json {
        println!("{}", serde_json::json!({"ppl": ppl, "chunks": chunks, "tokens": tokens.len()}));
    } else {
        println!("perplexity: {ppl:.4} over {chunks} chunks of {ctx} tokens");
    }
    Ok(())
}
