//! `weft tokenize`: token ids of a text, as one JSON array.

use super::ModelArgs;
use anyhow::Result;
use clap::Args;
use weft::models::gguf::GgufFile;
use weft::models::tokenizer::Tokenizer;

#[derive(Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text to tokenize (raw: special tokens are not parsed).
    #[arg(long)]
    text: String,
}

pub fn run(a: TokenizeArgs) -> Result<()> {
    let path = a.model.model_path()?;
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&a.text);
    super::output::print_line(serde_json::to_string(&ids)?)?;
    Ok(())
}
