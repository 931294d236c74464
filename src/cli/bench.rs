//! `weft bench`: prompt processing and generation speed, measured like
//! llama-bench: pp = one batch of `pp` random tokens into an empty cache;
//! tg = `tg` single-token decodes from an empty cache: greedy from a random
//! first token, each step's argmax fed to the next on the device with the
//! host one step ahead (`Model::decode_greedy`, as `weft run` decodes at
//! temperature 0), or random tokens step by step for models that take their
//! ids from the host only; medians over `reps`.

use super::diagnostics::DiagArgs;
use super::output::Stdout;
use super::{values, ModelArgs};
use anyhow::Result;
use clap::Args;
use std::time::Instant;
use weft::graph::synth::SplitMix64;
use weft::models::LogitRows;
use weft::runtime::cache::ChunkPolicy;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    diag: DiagArgs,
    /// Prompt tokens per prompt-processing run (0: skip). The bench's
    /// context, the larger of `pp` and `tg` plus 16, must fit the model's.
    #[arg(allow_negative_numbers = true, long, default_value_t = 512, value_parser = values::tokens)]
    pp: u32,
    /// Generated tokens per generation run (0: skip).
    #[arg(allow_negative_numbers = true, long, default_value_t = 128, value_parser = values::tokens)]
    tg: u32,
    /// Repetitions, 1 to 10000 (the median is reported).
    #[arg(allow_negative_numbers = true, long, default_value_t = 5, value_parser = values::int_in::<usize>(1, 10_000))]
    reps: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Generation as llama-bench measures it: random tokens, one step at a
    /// time, each waited for and its logits read back (the default is a
    /// greedy decode one step ahead, as `weft run --temp 0` decodes).
    #[arg(long)]
    step_by_step: bool,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[v.len() / 2]
}

pub fn run(a: BenchArgs) -> Result<()> {
    let diag = a.diag.open()?;
    let (mut exec, model) = a.model.load()?;
    let ctx =
        a.pp.max(a.tg)
            .checked_add(16)
            .filter(|&c| c <= model.trained_context().max(32))
            .ok_or_else(|| {
                anyhow::anyhow!(
                "--pp {} / --tg {}: the larger plus 16 exceeds the model's context of {} tokens",
                a.pp,
                a.tg,
                model.trained_context()
            )
            })?
            .max(32);
    let mut cache = model.new_cache(&mut exec, ctx, a.pp.max(1))?;
    let vocab = model.vocab() as u64;
    let mut rng = SplitMix64::new(0);
    let whole = ChunkPolicy::single(a.pp.max(1));
    let reps = a.reps.max(1);
    // Decode as `weft run` does at temperature 0: greedy, each step's argmax
    // fed to the next on the device, the host one step ahead. Models that
    // take ids from the host only (and `--step-by-step`) decode random
    // tokens step by step.
    let greedy = model.feeds_ids_on_device() && !a.step_by_step;
    let diag = diag.start(&mut exec)?;
    let mut tg_graphs = None;
    // (device busy, wall) seconds of each measured decode run (GPU only).
    let mut tg_busy: Vec<(f64, f64)> = Vec::new();
    let (mut pp_tps, mut tg_tps) = (Vec::new(), Vec::new());
    let (mut pp_counters, mut tg_counters) = (None, None);
    // One warm-up of each, then the measured repetitions.
    for rep in 0..=reps {
        if a.pp > 0 {
            let tokens: Vec<u32> = (0..a.pp).map(|_| rng.below(vocab) as u32).collect();
            cache.reset();
            let before = exec.counters();
            let t = Instant::now();
            model.prefill(&mut exec, &mut cache, &tokens, &whole, LogitRows::Last)?;
            let secs = t.elapsed().as_secs_f64();
            if rep > 0 {
                pp_tps.push(a.pp as f64 / secs);
                pp_counters = Some(exec.counters() - before);
            }
        }
        if a.tg > 0 {
            cache.reset();
            let before = exec.counters();
            let graphs_before = exec.graph_stats();
            let busy_before = exec.device_busy();
            let t = Instant::now();
            if greedy {
                let first = rng.below(vocab) as u32;
                let n = a.tg as usize;
                let done = model.decode_greedy(&mut exec, &mut cache, first, n, &mut |_| true)?;
                anyhow::ensure!(done == n, "greedy decode produced {done} of {n} tokens");
            } else {
                for _ in 0..a.tg {
                    let tok = rng.below(vocab) as u32;
                    model.step(&mut exec, &mut cache, &[tok], LogitRows::Last)?;
                }
            }
            let secs = t.elapsed().as_secs_f64();
            if rep > 0 {
                tg_tps.push(a.tg as f64 / secs);
                tg_counters = Some(exec.counters() - before);
                if let (Some(b), Some(now)) = (graphs_before, exec.graph_stats()) {
                    tg_graphs = Some((now.0 - b.0, now.1 - b.1, now.2 - b.2));
                }
                if let (Some(b), Some(now)) = (busy_before, exec.device_busy()) {
                    tg_busy.push(((now - b).as_secs_f64(), secs));
                }
            }
        }
    }
    let per = |c: Option<weft::runtime::Counters>, n: u32| {
        c.map(|c| {
            (
                c.barriers as f64 / n.max(1) as f64,
                c.command_buffers as f64 / n.max(1) as f64,
                c.dispatches as f64 / n.max(1) as f64,
            )
        })
    };
    diag.finish(&mut exec)?;
    let tg_per = per(tg_counters, a.tg);
    let pp_per = per(pp_counters, a.pp);
    let (pp, tg) = (median(&mut pp_tps), median(&mut tg_tps));
    // Device and wall time per decode token, over all measured runs.
    let split = (!tg_busy.is_empty()).then(|| {
        let n = (tg_busy.len() * a.tg.max(1) as usize) as f64;
        let (busy, wall) = tg_busy
            .iter()
            .fold((0.0, 0.0), |(b, w), (x, y)| (b + x, w + y));
        (busy * 1e3 / n, wall * 1e3 / n)
    });
    // Host microseconds per decode token in each part of a step (last run).
    let host = tg_counters.map(|c| {
        let us = |ns: u64| ns as f64 / 1e3 / a.tg.max(1) as f64;
        serde_json::json!({
            "record": us(c.record_ns),
            "submit": us(c.submit_ns),
            "wait": us(c.wait_ns),
            "read": us(c.read_ns),
        })
    });
    let mut out = Stdout::lock();
    if a.json {
        let v = serde_json::json!({
            "model": model.name,
            "backend": exec.device().to_string(),
            "device": exec.device_name(),
            "graph_captures_per_token": tg_graphs.map(|g| g.0 as f64 / a.tg.max(1) as f64),
            "graph_replays_per_token": tg_graphs.map(|g| g.1 as f64 / a.tg.max(1) as f64),
            "eager_command_buffers_per_token": tg_graphs.map(|g| g.2 as f64 / a.tg.max(1) as f64),
            "planned_steps_per_token": tg_counters.map(|c| c.planned_commits as f64 / a.tg.max(1) as f64),
            "tg_device_ms_per_token": split.map(|s| s.0),
            "tg_wall_ms_per_token": split.map(|s| s.1),
            "tg_host_us_per_token": host,
            "threads": exec.threads(),
            "reorder": exec.config().reorder,
            "pp_tokens": a.pp,
            "pp_tps": pp,
            "pp_all": pp_tps,
            "tg_tokens": a.tg,
            "tg_mode": if greedy { "greedy, one step ahead" } else { "random tokens, step by step" },
            "tg_tps": tg,
            "tg_all": tg_tps,
            "barriers_per_token": tg_per.map(|p| p.0),
            "command_buffers_per_token": tg_per.map(|p| p.1),
            "nodes_per_token": tg_per.map(|p| p.2),
            "pp_barriers_per_step": pp_counters.map(|c| c.barriers),
            "pp_command_buffers_per_step": pp_counters.map(|c| c.command_buffers),
        });
        out.line(v)?;
    } else {
        out.line(format_args!(
            "model: {} | backend: {} | threads: {}",
            model.name,
            exec.device(),
            exec.threads()
        ))?;
        if a.pp > 0 {
            out.line(format_args!(
                "pp{}: {pp:.1} tokens/s (median of {reps}); barriers per step {}",
                a.pp,
                pp_counters.map_or(0, |c| c.barriers)
            ))?;
            let _ = pp_per;
        }
        if a.tg > 0 {
            if let Some((b, cb, n)) = tg_per {
                let mode = if greedy {
                    "greedy, one step ahead"
                } else {
                    "random tokens, step by step"
                };
                out.line(format_args!("tg{} ({mode}): {tg:.1} tokens/s (median of {reps}); per token: {b:.0} barriers, {cb:.1} command buffers, {n:.0} nodes", a.tg))?;
            }
            if let Some((busy, wall)) = split {
                out.line(format_args!(
                    "per decode token: device busy {busy:.3} ms of {wall:.3} ms ({:.0} %); the rest is host work",
                    100.0 * busy / wall
                ))?;
            }
            if let Some(h) = &host {
                let f = |k: &str| h[k].as_f64().unwrap_or(0.0);
                out.line(format_args!(
                    "host per decode token: record {:.0} us, submit {:.0} us, wait {:.0} us, read back {:.0} us",
                    f("record"),
                    f("submit"),
                    f("wait"),
                    f("read")
                ))?;
            }
        }
    }
    Ok(())
}
