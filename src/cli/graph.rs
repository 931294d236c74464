//! `weft graph synth`: build a recording without a model, schedule it with
//! weft's pass and the baselines, check it, print the figures.

use super::output::{print_line, OutputFile};
use super::{values, ModelArgs};
use anyhow::{bail, Result};
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Instant;
use weft::graph::checker::{check, longest_conflict_chain};
use weft::graph::cut::{cut, CutPolicy};
use weft::graph::dump;
use weft::graph::reorder::{schedule, Strategy};
use weft::graph::synth;
use weft::models::LogitRows;

#[derive(Subcommand)]
pub enum GraphCommand {
    /// Schedule a synthetic recording (llama-shaped or random).
    Synth(SynthArgs),
    /// Record one step of a real model, schedule it, and write it out.
    Dump(DumpArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DumpFormat {
    Json,
    Dot,
    Html,
}

#[derive(Args)]
pub struct DumpArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Tokens in the step: 1 records a decode step, more a prefill step.
    /// Position plus tokens must fit the model's context.
    #[arg(allow_negative_numbers = true, long, default_value_t = 1, value_parser = values::tokens_at_least_1)]
    tokens: u32,
    /// Cache position of the step (the cache is filled up to it first).
    #[arg(allow_negative_numbers = true, long, default_value_t = 0, value_parser = values::tokens)]
    position: u32,
    #[arg(long, value_enum, default_value_t = DumpFormat::Json)]
    format: DumpFormat,
    /// DOT only: show layers `a..b` and collapse the others.
    #[arg(long, allow_hyphen_values = true)]
    layers: Option<String>,
    /// Output file.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct SynthArgs {
    /// A transformer-shaped step (`llama`).
    #[arg(long)]
    shape: Option<String>,
    /// Random ops over random overlapping ranges.
    #[arg(long)]
    random: bool,
    /// `--shape llama`: layers, 1 to 4096.
    #[arg(allow_negative_numbers = true, long, default_value_t = 30, value_parser = values::int_in::<u32>(1, 4096))]
    layers: u32,
    /// `--shape llama`: tokens in the step, 1 to 1048576.
    #[arg(allow_negative_numbers = true, long, default_value_t = 1, value_parser = values::int_in::<u64>(1, values::MAX_TOKENS))]
    tokens: u64,
    /// `--random`: nodes, 1 to 1000000.
    #[arg(allow_negative_numbers = true, long, default_value_t = 1000, value_parser = values::int_in::<usize>(1, 1_000_000))]
    nodes: usize,
    /// `--random`: buffers, 1 to 65536.
    #[arg(allow_negative_numbers = true, long, default_value_t = 16, value_parser = values::int_in::<u32>(1, 65_536))]
    buffers: u32,
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    seed: u64,
    /// Layers per command buffer, 1 to 4096 (default: one command buffer).
    #[arg(allow_negative_numbers = true, long, value_parser = values::layers_per_cb)]
    layers_per_cb: Option<u32>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Write the recording and its schedule as JSON.
    #[arg(long)]
    dump: Option<PathBuf>,
}

pub fn run(cmd: GraphCommand) -> Result<()> {
    match cmd {
        GraphCommand::Synth(a) => synth_cmd(a),
        GraphCommand::Dump(a) => dump_cmd(a),
    }
}

fn synth_cmd(a: SynthArgs) -> Result<()> {
    let dump_file = a
        .dump
        .as_deref()
        .map(|p| OutputFile::open(p, "--dump"))
        .transpose()?;
    let syn = match (a.shape.as_deref(), a.random) {
        (Some("llama"), false) => synth::llama_shape(&synth::LlamaShape {
            layers: a.layers,
            tokens: a.tokens,
            ..Default::default()
        }),
        (None, true) => synth::random(a.nodes, a.buffers, 4096, a.seed),
        (Some(other), false) => bail!("unknown --shape `{other}` (accepted: llama)"),
        _ => bail!("give exactly one of --shape llama or --random"),
    };
    let nodes = &syn.nodes;
    let policy = CutPolicy {
        layers_per_cb: a.layers_per_cb,
        ..Default::default()
    };
    let cuts = cut(nodes, &policy);
    let t = Instant::now();
    let weft = schedule(nodes, &cuts, Strategy::Reorder);
    let schedule_us = t.elapsed().as_secs_f64() * 1e6;
    let recorded = schedule(nodes, &cuts, Strategy::RecordedOrder);
    let greedy = schedule(nodes, &cuts, Strategy::GreedyWindow(64));
    let checker = if nodes.len() <= 20_000 {
        check(nodes, &weft)?;
        "ok"
    } else {
        "skipped (over 20000 nodes; the checker is quadratic)"
    };
    let chain: usize = if nodes.len() <= 20_000 {
        cuts.iter()
            .map(|r| longest_conflict_chain(&nodes[r.clone()]))
            .sum()
    } else {
        weft.levels()
    };
    if let Some(file) = dump_file {
        let d = dump::build(nodes, syn.buffers.clone(), &weft);
        file.write(serde_json::to_string(&d)?.as_bytes())?;
    }
    let v = serde_json::json!({
        "nodes": nodes.len(),
        "levels": weft.levels(),
        "barriers": weft.barriers(),
        "barriers_recorded_order": recorded.barriers(),
        "barriers_greedy_window64": greedy.barriers(),
        "longest_chain": chain,
        "reordered": weft.reordered(),
        "command_buffers": weft.command_buffers.len(),
        "schedule_us": schedule_us,
        "checker": checker,
    });
    if a.json {
        print_line(v)?;
    } else {
        print_line(serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}

fn parse_layers(text: &str) -> Result<std::ops::Range<u32>> {
    let parsed = text
        .split_once("..")
        .and_then(|(a, b)| Some((a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?)));
    match parsed {
        Some((a, b)) if a <= b && b < u32::MAX => Ok(a..b + 1),
        _ => bail!("--layers takes `a..b` (inclusive layer numbers, e.g. 0..2), not `{text}`"),
    }
}

fn dump_cmd(a: DumpArgs) -> Result<()> {
    anyhow::ensure!(a.tokens >= 1, "--tokens must be at least 1");
    let layers = a.layers.as_deref().map(parse_layers).transpose()?;
    let out = OutputFile::open(&a.out, "--out")?;
    let (mut exec, model) = a.model.load()?;
    let context = a
        .position
        .checked_add(a.tokens)
        .filter(|&c| c <= model.trained_context())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--position {} plus --tokens {} exceeds the model's context of {} tokens",
                a.position,
                a.tokens,
                model.trained_context()
            )
        })?;
    let mut cache = model.new_cache(&mut exec, context, context.max(a.tokens))?;
    if a.position > 0 {
        // Fill the cache up to the position with some text's tokens.
        let filler: Vec<u32> = (0..a.position).map(|i| 100 + i % 1000).collect();
        let policy = a.model.chunk_policy(&model)?;
        model.prefill(&mut exec, &mut cache, &filler, &policy, LogitRows::Last)?;
    }
    let span = cache.plan_prefill(a.tokens)?;
    let tokens: Vec<u32> = (0..a.tokens).map(|i| 200 + i % 1000).collect();
    let mut session = exec.begin_recorded();
    model.record(&mut session, &cache, &span, &tokens, LogitRows::Last)?;
    let (nodes, schedule) = session.into_schedule()?;
    check(&nodes, &schedule)?;
    let dump = dump::build(&nodes, exec.buffer_infos(), &schedule);
    let title = format!(
        "{}: {} token(s) at position {}",
        model.name, a.tokens, a.position
    );
    let text = match a.format {
        DumpFormat::Json => serde_json::to_string(&dump)?,
        DumpFormat::Dot => weft::graph::dot::render(&dump, layers),
        DumpFormat::Html => weft::graph::html::render(&dump, &title),
    };
    out.write(text.as_bytes())?;
    let cuts: Vec<_> = schedule
        .command_buffers
        .iter()
        .map(|c| c.nodes.clone())
        .collect();
    let recorded =
        weft::graph::reorder::schedule(&nodes, &cuts, Strategy::RecordedOrder).barriers();
    let greedy =
        weft::graph::reorder::schedule(&nodes, &cuts, Strategy::GreedyWindow(64)).barriers();
    crate::note!(
        "{}: {} nodes, {} command buffer(s), {} barriers (recorded order {recorded}, greedy-64 {greedy}), {} reordered -> {}",
        title,
        nodes.len(),
        schedule.command_buffers.len(),
        schedule.barriers(),
        schedule.reordered(),
        a.out.display()
    );
    Ok(())
}
