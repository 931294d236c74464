//! `--trace FILE`, `--profile` and `--dump-layers DIR`, shared by the
//! commands that run a model (run, bench, prefill).

use super::output::{OutputDir, OutputFile};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
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
    trace: Option<OutputFile>,
    profile: bool,
    dump_layers: Option<OutputDir>,
    before: Counters,
}

/// The diagnostics' output files, opened before any work.
pub struct DiagOutputs {
    trace: Option<OutputFile>,
    profile: bool,
    dump_layers: Option<OutputDir>,
}

impl DiagArgs {
    /// Opens the trace file and the dump folder: call before loading the
    /// model, so a path that cannot be written fails first.
    pub fn open(&self) -> Result<DiagOutputs> {
        Ok(DiagOutputs {
            trace: self
                .trace
                .as_deref()
                .map(|p| OutputFile::open(p, "--trace"))
                .transpose()?,
            profile: self.profile,
            dump_layers: self
                .dump_layers
                .as_deref()
                .map(|p| OutputDir::create(p, "--dump-layers"))
                .transpose()?,
        })
    }
}

impl DiagOutputs {
    /// Turns on what was asked for; call before running.
    pub fn start(self, exec: &mut GraphExecutor) -> Result<Diagnostics> {
        if self.trace.is_some() || self.profile {
            exec.enable_trace();
        }
        if self.dump_layers.is_some() {
            exec.enable_taps();
            if exec.config().cut.layers_per_cb != Some(1) {
                crate::note!(
                    "note: --dump-layers forces one layer per command buffer (was {:?})",
                    exec.config().cut.layers_per_cb
                );
                exec.config_mut().cut.layers_per_cb = Some(1);
            }
        }
        Ok(Diagnostics {
            trace: self.trace,
            profile: self.profile,
            dump_layers: self.dump_layers,
            before: exec.counters(),
        })
    }
}

impl Diagnostics {
    /// Whether layer dumps were asked for.
    pub fn dumps_layers(&self) -> bool {
        self.dump_layers.is_some()
    }

    /// After a step covering `positions`: writes the layer dumps it tapped.
    pub fn after_step(
        &self,
        exec: &mut GraphExecutor,
        positions: std::ops::Range<u32>,
    ) -> Result<()> {
        let Some(dir) = &self.dump_layers else {
            return Ok(());
        };
        for (name, dims, values) in exec.take_taps()? {
            write_layer_dump(dir, &name, &dims, &values, positions.end)?;
        }
        Ok(())
    }

    /// After the run: the trace file and the profile table.
    pub fn finish(self, exec: &mut GraphExecutor) -> Result<()> {
        if !(self.profile || self.trace.is_some()) {
            return Ok(());
        }
        let trace = exec.take_trace();
        if let Some(file) = self.trace {
            let path = file.path().display().to_string();
            file.write(trace.to_chrome_json().as_bytes())?;
            crate::note!("trace: {} events written to {path}", trace.events.len());
        }
        if self.profile {
            let profile = Profile::from_trace(&trace, exec.counters() - self.before);
            crate::note!("{}", profile.table());
        }
        Ok(())
    }
}

/// Taps named `ffn_inp-L` (residual after attention) and `l_out-L` (after
/// the FFN) become `layer{L:02}_{attn|ffn}_pos{P}.npy`, one row per
/// position; a tap's rows are the last positions before `end`.
fn write_layer_dump(
    dir: &OutputDir,
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
        let pos = (end as usize + i).saturating_sub(rows);
        let path = dir
            .path()
            .join(format!("layer{layer:02}_{kind}_pos{pos}.npy"));
        weft::npy::write_f32(&path, &[cols], row)
            .with_context(|| format!("--dump-layers: cannot write `{}`", path.display()))?;
    }
    Ok(())
}
