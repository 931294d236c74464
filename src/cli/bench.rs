//! `weft bench`: prompt processing and generation speed, measured like
//! llama-bench: pp = one batch of `pp` random tokens into a cache that
//! already holds `depth` tokens (llama-bench's `-d`; 0 by default);
//! tg = `tg` single-token decodes after `depth` tokens: greedy from a
//! random first token, each step's argmax fed to the next on the device
//! with the host one step ahead (`Model::decode_greedy`, as `weft run`
//! decodes at temperature 0), or random tokens step by step for models
//! that take their ids from the host only; medians over `reps`. The depth
//! is prefilled again, untimed, before each run. The first prefill of the
//! process (planning, and on a GPU capture, included) is reported as the
//! cold time beside the warm rate.

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
    /// Tokens already in the cache when each run starts, as a comma list
    /// (`--depth 0,1024,4096`); each depth is measured in turn.
    #[arg(long, value_delimiter = ',', default_value = "0", value_parser = values::tokens)]
    depth: Vec<u32>,
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
    let max_depth = a.depth.iter().copied().max().unwrap_or(0);
    let ctx = max_depth
        .checked_add(a.pp.max(a.tg))
        .and_then(|c| c.checked_add(16))
        .filter(|&c| c <= model.trained_context().max(32))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--depth {max_depth} plus the larger of --pp {} / --tg {} plus 16 exceeds the model's context of {} tokens",
                a.pp,
                a.tg,
                model.trained_context()
            )
        })?
        .max(32);
    let policy = a.model.chunk_policy(&model)?;
    let mut cache = model.new_cache(&mut exec, ctx, a.pp.max(policy.max_chunk()).max(1))?;
    let diag = diag.start(&mut exec)?;
    let mut bench = Bench {
        a: &a,
        model: &model,
        policy,
        rng: SplitMix64::new(0),
        cold_ms: None,
    };
    let mut results = Vec::with_capacity(a.depth.len());
    for &depth in &a.depth {
        results.push(bench.at_depth(&mut exec, &mut cache, depth)?);
    }
    diag.finish(&mut exec)?;
    let cold_ms = bench.cold_ms;
    // The decode floor of a memory-bound step: what it reads over what
    // this machine reads per second (the CPU's memory, measured here).
    let floor = match (exec.device(), model.decode_weight_bytes()) {
        (weft::runtime::Device::Cpu, Some(weights)) if a.tg > 0 => {
            let rate = super::bandwidth::read_bytes_per_second(exec.threads());
            let floors: Vec<Floor> = results
                .iter()
                .map(|r| Floor::at(weights, &cache, r.depth + a.tg / 2, rate, r.tg))
                .collect();
            Some((rate, floors))
        }
        _ => None,
    };
    let mut out = Stdout::lock();
    if a.json {
        let depths: Vec<serde_json::Value> = results
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut v = r.json(&a);
                if let (Some(o), Some((_, floors))) = (v.as_object_mut(), &floor) {
                    let f = &floors[i];
                    o.insert("bytes_per_token".into(), serde_json::json!(f.bytes));
                    o.insert("floor_tps".into(), serde_json::json!(f.tps));
                    o.insert("floor_share".into(), serde_json::json!(f.share));
                }
                v
            })
            .collect();
        // The first depth's figures also at the top level, as before depths existed.
        let mut v = depths[0].clone();
        let top = v.as_object_mut().expect("an object");
        for (k, x) in [
            ("model", serde_json::json!(model.name)),
            ("backend", serde_json::json!(exec.device().to_string())),
            ("device", serde_json::json!(exec.device_name())),
            ("numerics", serde_json::json!(exec.config().numerics.name())),
            ("threads", serde_json::json!(exec.threads())),
            ("reorder", serde_json::json!(exec.config().reorder)),
            ("pp_cold_ms", serde_json::json!(cold_ms)),
            (
                "read_bytes_per_second",
                serde_json::json!(floor.as_ref().map(|f| f.0)),
            ),
            ("depths", serde_json::Value::Array(depths)),
        ] {
            top.insert(k.into(), x);
        }
        out.line(v)?;
        return Ok(());
    }
    out.line(format_args!(
        "model: {} | backend: {} | numerics: {} | threads: {}",
        model.name,
        exec.device(),
        exec.config().numerics,
        exec.threads()
    ))?;
    if let Some(ms) = cold_ms {
        out.line(format_args!(
            "first prefill of the process (cold): {ms:.1} ms for {} tokens",
            a.pp
        ))?;
    }
    let mode = if bench.greedy() {
        "greedy, one step ahead"
    } else {
        "random tokens, step by step"
    };
    out.line(format_args!(
        "{:>8}  {:>14}  {:>14}   (tokens/s, median of {}; tg: {mode})",
        "depth",
        format!("pp{}", a.pp),
        format!("tg{}", a.tg),
        a.reps
    ))?;
    let cell = |on: bool, v: f64| if on { format!("{v:.1}") } else { "-".into() };
    for r in &results {
        out.line(format_args!(
            "{:>8}  {:>14}  {:>14}",
            r.depth,
            cell(a.pp > 0, r.pp),
            cell(a.tg > 0, r.tg)
        ))?;
    }
    if let Some((rate, floors)) = &floor {
        for (r, f) in results.iter().zip(floors) {
            out.line(format_args!(
                "decode floor at depth {}: {:.1} MB read per token at {:.1} GB/s (measured, {} threads) = {:.1} tokens/s; decode at {:.0} % of it",
                r.depth,
                f.bytes as f64 / 1e6,
                rate / 1e9,
                exec.threads(),
                f.tps,
                100.0 * f.share
            ))?;
        }
    }
    let r = &results[0];
    if a.pp > 0 {
        out.line(format_args!(
            "prefill at depth {}: {} barriers per step",
            r.depth,
            r.pp_counters.map_or(0, |c| c.barriers)
        ))?;
    }
    if a.tg > 0 {
        if let Some((b, cb, n)) = r.tg_per(a.tg) {
            out.line(format_args!(
                "decode at depth {}, per token: {b:.0} barriers, {cb:.1} command buffers, {n:.0} nodes",
                r.depth
            ))?;
        }
        if let Some((busy, wall)) = r.split(a.tg) {
            out.line(format_args!(
                "per decode token: device busy {busy:.3} ms of {wall:.3} ms ({:.0} %); the rest is host work",
                100.0 * busy / wall
            ))?;
        }
        if let Some(h) = r.host(a.tg) {
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
    Ok(())
}

/// The memory-bandwidth floor of decode at one depth.
struct Floor {
    /// Weights and cached keys and values one step reads.
    bytes: u64,
    /// Tokens per second if a step cost only its reads.
    tps: f64,
    /// The measured decode rate over `tps`.
    share: f64,
}

impl Floor {
    /// A step at `position` (the middle of the measured decode), reading
    /// `weights` and its cache rows at `rate` bytes per second.
    fn at(
        weights: u64,
        cache: &weft::runtime::cache::KvCache,
        position: u32,
        rate: f64,
        tg: f64,
    ) -> Floor {
        let bytes = weights + cache.bytes_read_at(position);
        let tps = rate / bytes.max(1) as f64;
        Floor {
            bytes,
            tps,
            share: tg / tps,
        }
    }
}

/// The measurement loop's state across depths.
struct Bench<'a> {
    a: &'a BenchArgs,
    model: &'a weft::models::Model,
    /// How the untimed depth is prefilled.
    policy: ChunkPolicy,
    rng: SplitMix64,
    /// The first prefill's time (the process's cold one).
    cold_ms: Option<f64>,
}

/// What one depth measured.
struct DepthResult {
    depth: u32,
    pp: f64,
    tg: f64,
    pp_all: Vec<f64>,
    tg_all: Vec<f64>,
    pp_counters: Option<weft::runtime::Counters>,
    tg_counters: Option<weft::runtime::Counters>,
    /// (captures, replays, eager command buffers) over the measured decodes.
    tg_graphs: Option<(u64, u64, u64)>,
    /// (device busy, wall) seconds of each measured decode run (GPU only).
    tg_busy: Vec<(f64, f64)>,
    greedy: bool,
}

impl Bench<'_> {
    /// Decode as `weft run` does at temperature 0: greedy, each step's
    /// argmax fed to the next on the device, the host one step ahead.
    /// Models that take ids from the host only (and `--step-by-step`)
    /// decode random tokens step by step.
    fn greedy(&self) -> bool {
        self.model.feeds_ids_on_device() && !self.a.step_by_step
    }

    fn tokens(&mut self, n: u32) -> Vec<u32> {
        let vocab = self.model.vocab() as u64;
        (0..n).map(|_| self.rng.below(vocab) as u32).collect()
    }

    /// An empty cache, then `depth` random tokens prefilled (untimed).
    fn fill(
        &mut self,
        exec: &mut weft::runtime::GraphExecutor,
        cache: &mut weft::runtime::cache::KvCache,
        depth: u32,
    ) -> Result<()> {
        cache.reset();
        if depth > 0 {
            let tokens = self.tokens(depth);
            self.model
                .prefill(exec, cache, &tokens, &self.policy, LogitRows::Last)?;
        }
        Ok(())
    }

    fn at_depth(
        &mut self,
        exec: &mut weft::runtime::GraphExecutor,
        cache: &mut weft::runtime::cache::KvCache,
        depth: u32,
    ) -> Result<DepthResult> {
        let a = self.a;
        let whole = ChunkPolicy::single(a.pp.max(1));
        let greedy = self.greedy();
        let mut r = DepthResult {
            depth,
            pp: 0.0,
            tg: 0.0,
            pp_all: Vec::new(),
            tg_all: Vec::new(),
            pp_counters: None,
            tg_counters: None,
            tg_graphs: None,
            tg_busy: Vec::new(),
            greedy,
        };
        // One warm-up of each, then the measured repetitions.
        for rep in 0..=a.reps.max(1) {
            if a.pp > 0 {
                self.fill(exec, cache, depth)?;
                let tokens = self.tokens(a.pp);
                let before = exec.counters();
                let t = Instant::now();
                self.model
                    .prefill(exec, cache, &tokens, &whole, LogitRows::Last)?;
                let secs = t.elapsed().as_secs_f64();
                if self.cold_ms.is_none() {
                    self.cold_ms = Some(secs * 1e3);
                }
                if rep > 0 {
                    r.pp_all.push(a.pp as f64 / secs);
                    r.pp_counters = Some(exec.counters() - before);
                }
            }
            if a.tg > 0 {
                self.fill(exec, cache, depth)?;
                let before = exec.counters();
                let graphs_before = exec.graph_stats();
                let busy_before = exec.device_busy();
                let t = Instant::now();
                if greedy {
                    let first = self.tokens(1)[0];
                    let n = a.tg as usize;
                    let done = self
                        .model
                        .decode_greedy(exec, cache, first, n, &mut |_| true)?;
                    anyhow::ensure!(done == n, "greedy decode produced {done} of {n} tokens");
                } else {
                    for _ in 0..a.tg {
                        let tok = self.tokens(1)[0];
                        self.model.step(exec, cache, &[tok], LogitRows::Last)?;
                    }
                }
                let secs = t.elapsed().as_secs_f64();
                if rep > 0 {
                    r.tg_all.push(a.tg as f64 / secs);
                    r.tg_counters = Some(exec.counters() - before);
                    if let (Some(b), Some(now)) = (graphs_before, exec.graph_stats()) {
                        r.tg_graphs = Some((now.0 - b.0, now.1 - b.1, now.2 - b.2));
                    }
                    if let (Some(b), Some(now)) = (busy_before, exec.device_busy()) {
                        r.tg_busy.push(((now - b).as_secs_f64(), secs));
                    }
                }
            }
        }
        r.pp = median(&mut r.pp_all.clone());
        r.tg = median(&mut r.tg_all.clone());
        Ok(r)
    }
}

impl DepthResult {
    /// (barriers, command buffers, nodes) per decode token.
    fn tg_per(&self, tg: u32) -> Option<(f64, f64, f64)> {
        let n = tg.max(1) as f64;
        self.tg_counters.map(|c| {
            (
                c.barriers as f64 / n,
                c.command_buffers as f64 / n,
                c.dispatches as f64 / n,
            )
        })
    }

    /// Device and wall milliseconds per decode token over the measured runs.
    fn split(&self, tg: u32) -> Option<(f64, f64)> {
        (!self.tg_busy.is_empty()).then(|| {
            let n = (self.tg_busy.len() * tg.max(1) as usize) as f64;
            let (busy, wall) = self
                .tg_busy
                .iter()
                .fold((0.0, 0.0), |(b, w), (x, y)| (b + x, w + y));
            (busy * 1e3 / n, wall * 1e3 / n)
        })
    }

    /// Host microseconds per decode token in each part of a step (last run).
    fn host(&self, tg: u32) -> Option<serde_json::Value> {
        self.tg_counters.map(|c| {
            let us = |ns: u64| ns as f64 / 1e3 / tg.max(1) as f64;
            serde_json::json!({
                "record": us(c.record_ns),
                "submit": us(c.submit_ns),
                "wait": us(c.wait_ns),
                "read": us(c.read_ns),
            })
        })
    }

    fn json(&self, a: &BenchArgs) -> serde_json::Value {
        let per_token = |x: u64| x as f64 / a.tg.max(1) as f64;
        let tg_per = self.tg_per(a.tg);
        let split = self.split(a.tg);
        serde_json::json!({
            "depth": self.depth,
            "graph_captures_per_token": self.tg_graphs.map(|g| per_token(g.0)),
            "graph_replays_per_token": self.tg_graphs.map(|g| per_token(g.1)),
            "eager_command_buffers_per_token": self.tg_graphs.map(|g| per_token(g.2)),
            "planned_steps_per_token": self.tg_counters.map(|c| per_token(c.planned_commits)),
            "tg_device_ms_per_token": split.map(|s| s.0),
            "tg_wall_ms_per_token": split.map(|s| s.1),
            "tg_host_us_per_token": self.host(a.tg),
            "pp_tokens": a.pp,
            "pp_tps": self.pp,
            "pp_all": self.pp_all,
            "tg_tokens": a.tg,
            "tg_mode": if self.greedy { "greedy, one step ahead" } else { "random tokens, step by step" },
            "tg_tps": self.tg,
            "tg_all": self.tg_all,
            "barriers_per_token": tg_per.map(|p| p.0),
            "command_buffers_per_token": tg_per.map(|p| p.1),
            "nodes_per_token": tg_per.map(|p| p.2),
            "pp_barriers_per_step": self.pp_counters.map(|c| c.barriers),
            "pp_command_buffers_per_step": self.pp_counters.map(|c| c.command_buffers),
        })
    }
}
