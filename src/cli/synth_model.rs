//! `weft synth-model`: write a full-size model file with random weights,
//! for benchmarks of architectures whose real files cannot be fetched here
//! (DeepSeek-V4-Flash is 80+ GB). The shapes, types and metadata are the
//! public files'; the weights are random and tiled (see
//! `deepseek4::synthetic::write_random_tiled`).

use super::output::OutputFile;
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;
use weft::models::deepseek4::synthetic::{
    flash_config, tensor_specs, write_random_tiled, TensorTypes,
};
use weft::models::deepseek4::Dsv4Config;

#[derive(Args)]
pub struct SynthModelArgs {
    /// The architecture and shape: `deepseek4-flash`.
    #[arg(long, default_value = "deepseek4-flash")]
    arch: String,
    /// Transformer layers (Flash: 43).
    #[arg(long, allow_negative_numbers = true)]
    layers: Option<usize>,
    /// Routed experts per layer (Flash: 256). Fewer experts keep the file
    /// small; a decode step reads the same bytes (6 experts per layer).
    #[arg(long, allow_negative_numbers = true)]
    experts: Option<usize>,
    /// Context length written to the metadata (Flash: 1M).
    #[arg(long, allow_negative_numbers = true)]
    context: Option<u32>,
    /// Random rows per tensor before they repeat, 1 to 1048576.
    #[arg(allow_negative_numbers = true, long, default_value_t = 256, value_parser = super::values::int_in::<usize>(1, 1 << 20))]
    tile_rows: usize,
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    seed: u64,
    /// Output GGUF file.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(a: SynthModelArgs) -> Result<()> {
    if a.arch != "deepseek4-flash" {
        bail!("--arch {:?} is not known (known: deepseek4-flash)", a.arch);
    }
    let mut c = flash_config();
    if let Some(layers) = a.layers {
        if !(1..=c.layers).contains(&layers) {
            bail!("--layers must be 1 to {}, not {layers}", c.layers);
        }
        c.layers = layers;
        c.ratios.truncate(layers);
        c.clamp_exp.truncate(layers);
        c.clamp_shexp.truncate(layers);
        c.hash_layers = c.hash_layers.min(layers);
    }
    if let Some(experts) = a.experts {
        if experts < c.experts_used || experts > 4096 {
            bail!(
                "--experts must be {} (experts used per token) to 4096, not {experts}",
                c.experts_used
            );
        }
        c.experts = experts;
    }
    if let Some(context) = a.context {
        if context < c.window {
            bail!(
                "--context must be at least the window ({}), not {context}",
                c.window
            );
        }
        c.context = context;
    }
    let types = TensorTypes::flash_gguf();
    let out = OutputFile::open(&a.out, "--out")?;
    let start = Instant::now();
    let bytes = write_random_tiled(&a.out, &c, &types, a.seed, a.tile_rows)?;
    out.keep();
    crate::note!(
        "wrote {} ({:.2} GB, {} layers, {} experts of which {} used, {:.1} s)",
        a.out.display(),
        bytes as f64 / 1e9,
        c.layers,
        c.experts,
        c.experts_used,
        start.elapsed().as_secs_f64()
    );
    crate::note!(
        "a decode token reads {:.2} GB of weights (every tensor once, {} of {} experts per layer, one embedding row)",
        decode_weight_bytes(&c, &types) as f64 / 1e9,
        c.experts_used,
        c.experts
    );
    Ok(())
}

/// Weight bytes one decode token reads: every tensor, the used fraction of
/// the routed experts, one row of the embedding.
fn decode_weight_bytes(c: &Dsv4Config, types: &TensorTypes) -> u64 {
    tensor_specs(c, types)
        .iter()
        .map(|(name, dims, dtype)| {
            let row = dtype.row_bytes(dims[0] as usize).unwrap_or(0) as u64;
            let rows: u64 = dims[1..].iter().product();
            if name == "token_embd.weight" {
                row
            } else if name.contains("_exps.") {
                row * rows / c.experts as u64 * c.experts_used as u64
            } else {
                row * rows
            }
        })
        .sum()
}
