//! Command-line front end: argument parsing and shared set-up (model
//! resolution, executor settings). One file per subcommand.

mod bandwidth;
mod bench;
mod chat;
mod diagnostics;
mod graph;
pub mod output;
mod perplexity;
mod prefill;
mod progress;
mod run;
mod serve;
mod session;
mod synth_model;
mod tokenize;
mod values;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use weft::models::Model;
use weft::runtime::cache::ChunkPolicy;
use weft::runtime::{Device, GraphExecutor};
use weft::settings::Settings;

/// weft: an inference runtime built on recorded op graphs.
#[derive(Parser)]
#[command(name = "weft", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (streams to stdout).
    Run(run::RunArgs),
    /// Chat on the terminal through the model's chat template.
    Chat(chat::ChatCmdArgs),
    /// Print the token ids of a text as a JSON array.
    Tokenize(tokenize::TokenizeArgs),
    /// Perplexity of a text file, as llama-perplexity computes it.
    Perplexity(perplexity::PerplexityArgs),
    /// Prompt-processing and generation speed, like llama-bench.
    Bench(bench::BenchArgs),
    /// Scripted prefill benchmarks from a TOML file.
    Prefill(prefill::PrefillArgs),
    /// Look at the reorder pass: synthetic graphs.
    #[command(subcommand)]
    Graph(graph::GraphCommand),
    /// An OpenAI-compatible HTTP server (chat, completions, streaming).
    Serve(serve::ServeArgs),
    /// Write a full-size model file with random weights (benchmarks).
    SynthModel(synth_model::SynthModelArgs),
}

pub fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Prefill(a) => prefill::run(a),
        Command::Graph(g) => graph::run(g),
        Command::SynthModel(a) => synth_model::run(a),
        Command::Serve(a) => serve::run(a),
    }
}

/// Options shared by every command that runs a model. Flags override the
/// `WEFT_*` environment variables, which override the defaults.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// A GGUF file, or a known model name (smollm2-135m, gemma3-270m,
    /// qwen2.5-coder-0.5b).
    /// Default: SmolLM2-135M-Instruct Q4_1, fetched on first use.
    #[arg(long)]
    pub model: Option<String>,
    /// Worker threads, 1 to 1024 (default: `WEFT_THREADS`, else all cores).
    #[arg(allow_negative_numbers = true, long, value_parser = values::threads)]
    pub threads: Option<usize>,
    /// Layers per command buffer, 1 to 4096 (default: `WEFT_LAYERS_PER_CB`,
    /// else all layers in one).
    #[arg(allow_negative_numbers = true, long, value_parser = values::layers_per_cb)]
    pub layers_per_cb: Option<u32>,
    /// Run in recorded order instead of the reorder pass (diagnosis; also
    /// `WEFT_REORDER=0`).
    #[arg(long)]
    pub no_reorder: bool,
    /// Turn the fusion pass off (diagnosis; also `WEFT_FUSE=0`).
    #[arg(long)]
    pub no_fuse: bool,
    /// Where to run: `auto` (a GPU when this build and machine have one,
    /// else the CPU, saying why), `cpu`, `cuda`, `cuda:N` or `metal`.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// `exact` (every kernel in its fixed float order: the CPU's matches
    /// llama.cpp's, CUDA's the CPU's) or `fast` (kernels may reorder float
    /// work, e.g. decode attention split over the cache). Default:
    /// `WEFT_NUMERICS`, else fast on CUDA and exact on the CPU and Metal.
    #[arg(long)]
    pub numerics: Option<weft::runtime::Numerics>,
}

impl ModelArgs {
    /// The model file, fetching the default model if needed.
    pub fn model_path(&self) -> Result<PathBuf> {
        let interactive = std::io::stderr().is_terminal();
        let mut progress = |msg: &str| {
            if interactive {
                output::stderr_text(format_args!("\r\x1b[2K{msg}"));
            } else {
                crate::note!("{msg}");
            }
        };
        let config = weft::settings::fetch_config().context("cannot obtain the model")?;
        let path =
            weft::models::fetch::resolve_model(self.model.as_deref(), &config, &mut progress)
                .context("cannot obtain the model")?;
        if interactive {
            output::stderr_text(format_args!("\r\x1b[2K"));
        }
        Ok(path)
    }

    /// Environment settings with these flags on top.
    pub fn settings(&self) -> Result<Settings> {
        let flags = Settings {
            threads: self.threads,
            reorder: self.no_reorder.then_some(false),
            fuse: self.no_fuse.then_some(false),
            layers_per_cb: self.layers_per_cb,
            numerics: self.numerics,
            ..Default::default()
        };
        Ok(Settings::from_env()?.overlay(&flags))
    }

    /// An executor configured by these options.
    pub fn executor(&self) -> Result<GraphExecutor> {
        let s = self.settings()?;
        let device = self.device()?;
        let mut config = s.executor_config();
        if s.numerics.is_none() {
            config.numerics = match device {
                Device::Cuda(_) => weft::runtime::Numerics::Fast,
                Device::Cpu | Device::Metal => weft::runtime::Numerics::Exact,
            };
        }
        Ok(GraphExecutor::with_config(device, config)?)
    }

    /// The device `--backend` names.
    pub fn device(&self) -> Result<Device> {
        let b = self.backend.trim();
        let device = match b {
            "cpu" => Device::Cpu,
            "cuda" => Device::Cuda(0),
            "metal" => Device::Metal,
            "auto" => {
                if cfg!(feature = "cuda") {
                    match Device::Cuda(0).unavailable_reason() {
                        None => return Ok(Device::Cuda(0)),
                        Some(why) => {
                            crate::note!("note: running on the CPU: CUDA is unavailable ({why})")
                        }
                    }
                }
                Device::Cpu
            }
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(i)) => Device::Cuda(i),
                _ => anyhow::bail!(
                    "--backend `{other}` is not one of: auto, cpu, cuda, cuda:N, metal"
                ),
            },
        };
        if let Some(why) = device.unavailable_reason() {
            anyhow::bail!("--backend {b}: {why}");
        }
        Ok(device)
    }

    /// Executor plus loaded model.
    pub fn load(&self) -> Result<(GraphExecutor, Model)> {
        let mut exec = self.executor()?;
        let path = self.model_path()?;
        let model = Model::load(&path, &mut exec)
            .with_context(|| format!("cannot load {}", path.display()))?;
        Ok((exec, model))
    }

    /// The model's chunk policy, with `WEFT_PREFILL_WINDOWS` applied.
    pub fn chunk_policy(&self, model: &Model) -> Result<ChunkPolicy> {
        let mut p = model.chunk_policy();
        if let Some(m) = self.settings()?.prefill_windows {
            p.multiplier = m;
        }
        Ok(p)
    }
}
