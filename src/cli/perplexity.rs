//! `weft perplexity`: llama-perplexity's method (see `weft_models::eval`).

use super::ModelArgs;
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

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
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("cannot read {}", a.file.display()))?;
    let (mut exec, model) = a.model.load()?;
    let tokens = model.tokenizer.encode(&text);
    let quiet = a.json;
    let mut progress = |chunk: usize, ppl: f64| {
        if !quiet {
            eprintln!("[{chunk}] {ppl:.4}");
        }
    };
    let p =
        weft::models::eval::perplexity(&model, &mut exec, &tokens, a.ctx as usize, &mut progress)?;
    if a.json {
        println!("{}", serde_json::to_string(&p)?);
    } else {
        println!(
            "perplexity: {:.4} over {} chunks of {} tokens",
            p.ppl, p.chunks, a.ctx
        );
    }
    Ok(())
}
