//! `weft graph synth`: build a recording without a model, schedule it with
//! weft's pass and the baselines, check it, print the figures.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Instant;
use weft::graph::checker::{check, longest_conflict_chain};
use weft::graph::cut::{cut, CutPolicy};
use weft::graph::dump;
use weft::graph::reorder::{schedule, Strategy};
use weft::graph::synth;

#[derive(Subcommand)]
pub enum GraphCommand {
    /// Schedule a synthetic recording (llama-shaped or random).
    Synth(SynthArgs),
}

#[derive(Args)]
pub struct SynthArgs {
    /// A transformer-shaped step (`llama`).
    #[arg(long)]
    shape: Option<String>,
    /// Random ops over random overlapping ranges.
    #[arg(long)]
    random: bool,
    #[arg(long, default_value_t = 30)]
    layers: u32,
    #[arg(long, default_value_t = 1)]
    tokens: u64,
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    #[arg(long, default_value_t = 16)]
    buffers: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Layers per command buffer (default: one command buffer).
    #[arg(long)]
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
    }
}

fn synth_cmd(a: SynthArgs) -> Result<()> {
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
    if let Some(path) = &a.dump {
        let d = dump::build(nodes, syn.buffers.clone(), &weft);
        std::fs::write(path, serde_json::to_string(&d)?)?;
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
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}
