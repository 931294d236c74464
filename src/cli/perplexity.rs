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
    /// Window (context) length in tokens, 3 to 1048576: each window scores
    /// its second half, less its last token, so 3 is the least that scores
    /// one.
    #[arg(allow_negative_numbers = true, long, default_value_t = 512, value_parser = window)]
    ctx: u32,
    /// Print one JSON object: {"ppl", "chunks", "tokens"}.
    #[arg(long)]
    json: bool,
}

/// A `--ctx` value: 3 to 1048576.
fn window(text: &str) -> Result<u32, String> {
    let n = super::values::int_in::<u32>(0, super::values::MAX_TOKENS)(text)?;
    if n < 3 {
        return Err(format!(
            "a window of {n} tokens scores none; the smallest that scores one is 3"
        ));
    }
    Ok(n)
}

pub fn run(a: PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("cannot read {}", a.file.display()))?;
    let (mut exec, model) = a.model.load()?;
    let tokens = model.tokenizer.encode(&text);
    let quiet = a.json;
    let mut progress = |chunk: usize, ppl: f64| {
        if !quiet {
            crate::note!("[{chunk}] {ppl:.4}");
        }
    };
    let p =
        weft::models::eval::perplexity(&model, &mut exec, &tokens, a.ctx as usize, &mut progress)?;
    anyhow::ensure!(p.tokens > 0, "--ctx {}: no tokens were scored", a.ctx);
    anyhow::ensure!(
        p.ppl.is_finite(),
        "the perplexity over {} tokens is {} (the model's logits are not finite)",
        p.tokens,
        p.ppl
    );
    if a.json {
        super::output::print_line(serde_json::to_string(&p)?)?;
    } else {
        super::output::print_line(format_args!(
            "perplexity: {:.4} over {} chunks of {} tokens",
            p.ppl, p.chunks, a.ctx
        ))?;
    }
    Ok(())
}
