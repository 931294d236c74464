//! `weft serve`: the OpenAI-compatible HTTP server (see `weft::serve`).

use super::ModelArgs;
use anyhow::{Context, Result};
use clap::Args;
use std::time::Duration;
use weft::runtime::{ExecutorConfig, Fault, GraphExecutor};
use weft::serve::{EngineConfig, ServeOptions};

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to bind (loopback by default; 0.0.0.0 exposes the server).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to bind; 0 picks a free one (the bound address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences generated at once (continuous batching).
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Context length of each sequence (default: the model's, at most 4096).
    #[arg(long)]
    ctx: Option<u32>,
    /// Require `Authorization: Bearer KEY` on every endpoint but `/health`.
    #[arg(long)]
    api_key: Option<String>,
    /// Requests that may wait for a slot; more are refused with 503.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Largest request body in bytes (larger: 413).
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    max_body: usize,
    /// Seconds a request may take from arrival to its last token (504 after).
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
    /// Seconds in-flight requests may finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 10.0)]
    shutdown_grace: f64,
    /// Finished sequences whose caches are kept for prefix reuse.
    #[arg(long, default_value_t = 4)]
    keep: usize,
    /// Most prompt tokens a sequence prefills per round (a long prompt
    /// takes several rounds, the others decoding in between).
    #[arg(long, default_value_t = 512)]
    prefill_chunk: u32,
    /// Most decoding sequences stepped together in one batch step (0: up
    /// to --parallel; 1: one sequence per step). Capped where the model's
    /// weights would sum batch rows in another order than single rows.
    #[arg(long, default_value_t = 0)]
    decode_batch: usize,
    /// Save and restore sessions (a sequence's KV cache and tokens) as
    /// files in DIR: a request's `session` field continues from and saves
    /// into DIR/NAME; `POST /v1/sessions/NAME/save|restore`.
    #[arg(long, value_name = "DIR")]
    slots_dir: Option<std::path::PathBuf>,
    /// The model id served (default: the model file's name without `.gguf`).
    #[arg(long)]
    alias: Option<String>,
    /// Fault injection for tests: the node whose label contains LABEL
    /// fails once, after AFTER earlier matches (`LABEL:AFTER`).
    #[arg(long, hide = true)]
    inject_fault: Option<String>,
}

fn seconds(flag: &str, v: f64) -> Result<Duration> {
    anyhow::ensure!(
        v.is_finite() && v > 0.0,
        "--{flag} {v}: give a positive number of seconds"
    );
    Ok(Duration::from_secs_f64(v))
}

pub fn run(a: ServeArgs) -> Result<()> {
    anyhow::ensure!(a.parallel >= 1, "--parallel must be at least 1");
    anyhow::ensure!(a.queue >= 1, "--queue must be at least 1");
    anyhow::ensure!(a.prefill_chunk >= 1, "--prefill-chunk must be at least 1");
    if let Some(c) = a.ctx {
        anyhow::ensure!(c >= 2, "--ctx {c}: give at least 2 tokens");
    }
    let fault = match &a.inject_fault {
        None => None,
        Some(spec) => {
            let (label, after) = spec
                .rsplit_once(':')
                .with_context(|| format!("--inject-fault {spec:?}: give LABEL:AFTER"))?;
            let after = after
                .parse()
                .with_context(|| format!("--inject-fault {spec:?}: AFTER is not a number"))?;
            Some(Fault {
                label: label.to_string(),
                after,
            })
        }
    };
    let path = a.model.model_path()?;
    let stem = path
        .file_name()
        .map_or_else(|| "model".into(), |f| f.to_string_lossy().into_owned());
    let stem = stem.strip_suffix(".gguf").unwrap_or(&stem).to_string();
    let model_id = a.alias.clone().unwrap_or_else(|| stem.clone());
    let mut aliases = vec![stem];
    aliases.extend(a.model.model.clone());
    let opts = ServeOptions {
        host: a.host,
        port: a.port,
        api_key: a.api_key.filter(|k| !k.is_empty()),
        max_body: a.max_body,
        max_queue: a.queue,
        timeout: seconds("timeout", a.timeout)?,
        shutdown_grace: seconds("shutdown-grace", a.shutdown_grace)?,
        model_id,
        aliases,
        engine: EngineConfig {
            parallel: a.parallel,
            ctx: a.ctx,
            keep: a.keep,
            prefill_chunk: a.prefill_chunk,
            decode_batch: a.decode_batch,
            slots_dir: a
                .slots_dir
                .as_deref()
                .map(weft::serve::slots::SlotsDir::new)
                .transpose()?,
        },
    };
    let model_args = a.model;
    let loader = Box::new(move || {
        let mut exec = match fault {
            None => model_args.executor()?,
            Some(fault) => fault_executor(&model_args, fault)?,
        };
        let model = weft::models::Model::load(&path, &mut exec)
            .with_context(|| format!("cannot load {}", path.display()))?;
        let policy = model_args.chunk_policy(&model)?;
        Ok((exec, model, policy))
    });
    weft::serve::serve(opts, loader)
}

/// An executor whose one node fails once (fault-injection tests; plan
/// reuse is off under fault injection).
fn fault_executor(args: &ModelArgs, fault: Fault) -> Result<GraphExecutor> {
    let s = args.settings()?;
    let mut config = ExecutorConfig::default();
    config.diagnostics.fault = Some(fault);
    if let Some(t) = s.threads {
        config.threads = t.max(1);
    }
    config.cpu = s.executor_config().cpu;
    config.cuda = s.executor_config().cuda;
    Ok(GraphExecutor::with_config(args.device()?, config)?)
}
