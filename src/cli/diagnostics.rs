//! `--trace FILE`, `--profile` and `--dump-layers DIR`, shared by the
//! commands that run a model (run, bench, prefill).

use anyhow::{Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use weft::runtime::{Counters, GraphExecutor, Profile};

/// Diagnostics flags.
#[derive(Args, Clone, Debug, Default)]
pub struct DiagArgs {
    /// Write a Chrome/Perfetto trace-event JSON of what ran.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Print time per stage and per kernel, and the counters, after the run.
    #[arg(long)]
    pub profile: bool,
    /// Write the residual stream after attention and after the FFN, per
    /// layer and position, as `.npy` files (forces one layer per command buffer).
    #[arg(long)]
    pub dump_layers: Option<PathBuf>,
}

/// Diagnostics of one run.
pub struct Diagnostics {
    args: DiagArgs,
    before: Counters,
}

impl DiagArgs {
    /// Turns on what was asked for; call before running.
    pub fn start(&self, exec: &mut GraphExecutor) -> Result<Diagnostics> {
        if self.trace.is_some() || self.profile {
            exec.enable_trace();
        }
        if let Some(dir) = &self.dump_layers {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            exec.enable_taps();
            if exec.config().cut.layers_per_cb != Some(1) {
                eprintln!(
                    "note: --dump-layers forces one layer per command buffer (was {:?})",
                    exec.config().cut.layers_per_cb
                );
                exec.config_mut().cut.layers_per_cb = Some(1);
            }
        }
        Ok(Diagnostics {
            args: self.clone(),
            before: exec.counters(),
        })
    }
}

impl Diagnostics {
    /// After a step covering `positions`: writes the layer dumps it tapped.
    pub fn after_step(
        &self,
        exec: &mut GraphExecutor,
        positions: std::ops::Range<u32>,
    ) -> Result<()> {
        let Some(dir) = &self.args.dump_layers else {
            return Ok(());
        };
        for (name, dims, values) in exec.take_taps()? {
            write_layer_dump(dir, &name, &dims, &values, positions.end)?;
        }
        Ok(())
    }

    /// After the run: the trace file and the profile table.
    pub fn finish(self, exec: &mut GraphExecutor) -> Result<()> {
        if !(self.args.profile || self.args.trace.is_some()) {
            return Ok(());
        }
        let trace = exec.take_trace();
        if let Some(path) = &self.args.trace {
            std::fs::write(path, trace.to_chrome_json())
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!(
                "trace: {} events written to {}",
                trace.events.len(),
                path.display()
            );
        }
        if self.args.profile {
            let profile = Profile::from_trace(&trace, exec.counters() - self.before);
            eprintln!("{}", profile.table());
        }
        Ok(())
    }
}

/// Taps named `ffn_inp-L` (residual after attention) and `l_out-L` (after
/// the FFN) become `layer{L:02}_{attn|ffn}_pos{P}.npy`, one row per
/// position; a tap's rows are the last positions before `end`.
fn write_layer_dump(
    dir: &Path,
    name: &str,
    dims: &[usize],
    values: &[f32],
    end: u32,
) -> Result<()> {
    let (kind, layer) = match name.split_once('-') {
        Some(("ffn_inp", l)) => ("attn", l),
        Some(("l_out", l)) => ("ffn", l),
        _ => return Ok(()),
    };
    let Ok(layer) = layer.parse::<u32>() else {
        return Ok(());
    };
    let cols = *dims.last().unwrap_or(&1);
    let rows = values.len() / cols.max(1);
    for (i, row) in values.chunks(cols).enumerate() {
        let pos = end as usize - rows + i;
        let path = dir.join(format!("layer{layer:02}_{kind}_pos{pos}.npy"));
        weft::npy::write_f32(&path, &[cols], row)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
