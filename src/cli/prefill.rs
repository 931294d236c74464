//! `weft prefill --script FILE`: scripted prefill benchmarks.
//!
//! A TOML script lists scenarios; each names the model, the prompt (inline
//! text, a file, or `synthetic = N` tokens), repetitions and knobs
//! (`reorder`, `layers_per_cb`, `prefill_windows`, `threads`, `backend`).
//! A knob given as an array is swept (the runs are the cartesian product).
//! The whole script is checked before anything runs: an unknown key, a
//! missing file, a bad value or an empty array is an error naming its line,
//! and a script expanding to more than `--max-runs` runs (default 1000) is
//! refused.

use super::output::{OutputDir, OutputFile, Stdout};
use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Instant;
use weft::models::LogitRows;

#[derive(Args)]
pub struct PrefillArgs {
    /// The TOML script.
    #[arg(long)]
    script: PathBuf,
    /// Also write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write one Chrome trace per run into this folder.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// The most runs a script may expand to (its sweeps multiplied out).
    #[arg(allow_negative_numbers = true, long, default_value_t = 1000, value_parser = super::values::int_in::<usize>(1, 1_000_000))]
    max_runs: usize,
}

/// A value or a list of values to sweep.
#[derive(Clone, Debug)]
enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T: Clone> OneOrMany<T> {
    fn values(&self) -> Vec<T> {
        match self {
            OneOrMany::One(v) => vec![v.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }

    fn len(&self) -> usize {
        match self {
            OneOrMany::One(_) => 1,
            OneOrMany::Many(v) => v.len(),
        }
    }
}

/// The knobs of `[defaults]` and of each scenario.
#[derive(Clone, Debug, Default)]
struct Knobs {
    model: Option<String>,
    repetitions: Option<usize>,
    reorder: Option<OneOrMany<bool>>,
    layers_per_cb: Option<OneOrMany<u32>>,
    prefill_windows: Option<OneOrMany<u32>>,
    threads: Option<OneOrMany<usize>>,
    backend: Option<String>,
}

/// A scenario: its name, its prompt, and knobs.
#[derive(Clone, Debug)]
struct Scenario {
    name: String,
    prompt: Option<String>,
    prompt_file: Option<PathBuf>,
    synthetic: Option<i64>,
    knobs: Knobs,
}

/// Where things are in the script, for error messages.
struct Source<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    /// Line of `key = ...` inside table `table` (`None`: `[defaults]`,
    /// `Some(i)`: the i-th `[[scenario]]`), or of the table header.
    fn line(&self, table: Option<usize>, key: &str) -> String {
        let mut current: Option<Option<usize>> = None;
        let mut scenarios = 0usize;
        let mut header = 0usize;
        for (i, line) in self.text.lines().enumerate() {
            let t = line.trim();
            if t.starts_with("[[scenario]]") {
                current = Some(Some(scenarios));
                scenarios += 1;
            } else if t.starts_with("[defaults]") {
                current = Some(None);
            } else if t.starts_with('[') {
                current = None;
            }
            if current == Some(table) {
                if t.starts_with('[') {
                    header = i + 1;
                }
                let k = t.split('=').next().unwrap_or("").trim();
                if !key.is_empty() && k == key {
                    return format!("{}:{}", self.path.display(), i + 1);
                }
            }
        }
        format!("{}:{}", self.path.display(), header.max(1))
    }
}

const KNOBS: [&str; 7] = [
    "model",
    "repetitions",
    "reorder",
    "layers_per_cb",
    "prefill_windows",
    "threads",
    "backend",
];

fn parse_knobs(table: toml::Table, src: &Source<'_>, at: Option<usize>) -> Result<Knobs> {
    let mut k = Knobs::default();
    for (key, value) in table {
        let line = src.line(at, &key);
        let key = key.as_str();
        match key {
            "model" => k.model = Some(string_value(key, value, &line)?),
            "backend" => k.backend = Some(string_value(key, value, &line)?),
            "repetitions" => {
                k.repetitions = Some(integer_value(key, &value, &line, 1, 1000)? as usize)
            }
            "reorder" => {
                k.reorder = Some(swept(
                    key,
                    value,
                    &line,
                    ("boolean", "a boolean"),
                    bool_value,
                )?)
            }
            "layers_per_cb" | "prefill_windows" => {
                let v = swept(
                    key,
                    value,
                    &line,
                    ("integer", "an integer from 1 to 4096"),
                    |k, v, l| Ok(integer_value(k, v, l, 1, 4096)? as u32),
                )?;
                if key == "layers_per_cb" {
                    k.layers_per_cb = Some(v);
                } else {
                    k.prefill_windows = Some(v);
                }
            }
            "threads" => {
                k.threads = Some(swept(
                    key,
                    value,
                    &line,
                    ("integer", "an integer from 1 to 1024"),
                    |k, v, l| Ok(integer_value(k, v, l, 1, 1024)? as usize),
                )?)
            }
            _ => bail!(
                "{line}: unknown key `{key}` (accepted: name, prompt, prompt_file, synthetic, {})",
                KNOBS.join(", ")
            ),
        }
    }
    Ok(k)
}

fn string_value(key: &str, value: toml::Value, line: &str) -> Result<String> {
    match value {
        toml::Value::String(s) => Ok(s),
        other => bail!("{line}: `{key}` must be a string, not {}", other.type_str()),
    }
}

fn bool_value(key: &str, value: &toml::Value, line: &str) -> Result<bool> {
    match value {
        toml::Value::Boolean(b) => Ok(*b),
        other => bail!(
            "{line}: `{key}` must be a boolean, not {}",
            other.type_str()
        ),
    }
}

fn integer_value(key: &str, value: &toml::Value, line: &str, min: i64, max: i64) -> Result<i64> {
    match value {
        toml::Value::Integer(n) if (min..=max).contains(n) => Ok(*n),
        toml::Value::Integer(n) => bail!("{line}: `{key}` must be from {min} to {max}, not {n}"),
        other => bail!(
            "{line}: `{key}` must be an integer from {min} to {max}, not {}",
            other.type_str()
        ),
    }
}

/// A knob given as one value or as a non-empty array of values to sweep.
fn swept<T>(
    key: &str,
    value: toml::Value,
    line: &str,
    (ty, what): (&str, &str),
    one: impl Fn(&str, &toml::Value, &str) -> Result<T>,
) -> Result<OneOrMany<T>> {
    match value {
        toml::Value::Array(items) => {
            if items.is_empty() {
                bail!("{line}: `{key}` is an empty array; give {what} or an array of them");
            }
            let values = items
                .iter()
                .enumerate()
                .map(|(i, v)| one(&format!("{key}[{i}]"), v, line))
                .collect::<Result<Vec<T>>>()?;
            Ok(OneOrMany::Many(values))
        }
        other if other.type_str() != ty => bail!(
            "{line}: `{key}` must be {what} or an array of them, not {}",
            other.type_str()
        ),
        other => one(key, &other, line).map(OneOrMany::One),
    }
}

fn parse_script(src: &Source<'_>) -> Result<(Knobs, Vec<Scenario>)> {
    let mut doc: toml::Table =
        toml::from_str(src.text).map_err(|e| anyhow::anyhow!("{}: {e}", src.path.display()))?;
    for key in doc.keys() {
        if key != "defaults" && key != "scenario" {
            bail!(
                "{}: unknown top-level key `{key}` (accepted: [defaults], [[scenario]])",
                src.path.display()
            );
        }
    }
    let defaults = match doc.remove("defaults") {
        Some(toml::Value::Table(t)) => parse_knobs(t, src, None)?,
        Some(_) => bail!("{}: `defaults` must be a table", src.line(None, "")),
        None => Knobs::default(),
    };
    let list = match doc.remove("scenario") {
        Some(toml::Value::Array(a)) if !a.is_empty() => a,
        _ => bail!("{}: the script has no [[scenario]]", src.path.display()),
    };
    let mut scenarios = Vec::new();
    for (i, v) in list.into_iter().enumerate() {
        let toml::Value::Table(mut t) = v else {
            bail!("{}: a scenario must be a table", src.line(Some(i), ""))
        };
        let take_str = |t: &mut toml::Table, k: &str| -> Result<Option<String>> {
            match t.remove(k) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(s)),
                Some(other) => bail!(
                    "{}: `{k}` must be a string, not {}",
                    src.line(Some(i), k),
                    other.type_str()
                ),
            }
        };
        let name = take_str(&mut t, "name")?.unwrap_or_else(|| format!("scenario {}", i + 1));
        let prompt = take_str(&mut t, "prompt")?;
        let prompt_file = take_str(&mut t, "prompt_file")?.map(PathBuf::from);
        let synthetic = match t.remove("synthetic") {
            None => None,
            Some(toml::Value::Integer(n)) => Some(n),
            Some(other) => bail!(
                "{}: `synthetic` must be a token count, not {}",
                src.line(Some(i), "synthetic"),
                other.type_str()
            ),
        };
        let knobs = parse_knobs(t, src, Some(i))?;
        scenarios.push(Scenario {
            name,
            prompt,
            prompt_file,
            synthetic,
            knobs,
        });
    }
    Ok((defaults, scenarios))
}

/// One run of a scenario with every knob fixed.
#[derive(Clone, Debug, serde::Serialize)]
struct Run {
    scenario: String,
    model: Option<String>,
    reorder: bool,
    layers_per_cb: Option<u32>,
    prefill_windows: Option<u32>,
    threads: Option<usize>,
    backend: Option<String>,
    repetitions: usize,
}

#[derive(Debug, serde::Serialize)]
struct Outcome {
    run: Run,
    tokens: usize,
    chunks: usize,
    ttft_ms: f64,
    tps_median: f64,
    tps_min: f64,
    tps_max: f64,
    barriers_per_chunk: f64,
    command_buffers_per_chunk: f64,
    peak_pool_bytes: u64,
}

pub fn run(a: PrefillArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.script)
        .with_context(|| format!("cannot read the script {}", a.script.display()))?;
    let src = Source {
        path: &a.script,
        text: &text,
    };
    let base = a.script.parent().unwrap_or(Path::new("."));
    let runs = plan(&src, base, a.max_runs)?;
    let json = a
        .json
        .as_deref()
        .map(|p| OutputFile::open(p, "--json"))
        .transpose()?;
    let trace_dir = a
        .trace
        .as_deref()
        .map(|p| OutputDir::create(p, "--trace"))
        .transpose()?;
    let total = runs.len();
    crate::note!(
        "{}: {total} run{}",
        a.script.display(),
        if total == 1 { "" } else { "s" }
    );
    let progress = super::progress::Progress::new(total as u64, "prefill runs");
    let mut outcomes = Vec::new();
    for (i, (run, prompt)) in runs.into_iter().enumerate() {
        progress.message(&format!("{} ({}/{total})", run.scenario, i + 1));
        let trace = trace_dir.as_ref().map(|d| (d, format!("run{i:03}.json")));
        outcomes.push(measure(run, &prompt, trace)?);
        progress.inc();
    }
    progress.finish();
    print_table(&outcomes)?;
    if let Some(file) = json {
        file.write(serde_json::to_string_pretty(&outcomes)?.as_bytes())?;
    }
    Ok(())
}

/// What to feed the model.
#[derive(Clone, Debug)]
enum Prompt {
    Text(String),
    Synthetic(u32),
}

/// Checks the script and expands sweeps, before anything runs: at most
/// `max_runs` runs.
fn plan(src: &Source<'_>, base: &Path, max_runs: usize) -> Result<Vec<(Run, Prompt)>> {
    let (defaults, scenarios) = parse_script(src)?;
    let count = scenarios.iter().try_fold(0usize, |total, s| {
        let k = merge(&defaults, &s.knobs);
        let lens = [
            k.reorder.as_ref().map_or(1, OneOrMany::len),
            k.layers_per_cb.as_ref().map_or(1, OneOrMany::len),
            k.prefill_windows.as_ref().map_or(1, OneOrMany::len),
            k.threads.as_ref().map_or(1, OneOrMany::len),
        ];
        lens.iter()
            .try_fold(1usize, |n, &l| n.checked_mul(l))
            .and_then(|n| total.checked_add(n))
    });
    match count {
        Some(n) if n <= max_runs => {}
        Some(n) => bail!(
            "{}: the script expands to {n} runs, more than --max-runs {max_runs} (raise --max-runs or sweep fewer values)",
            src.path.display()
        ),
        None => bail!(
            "{}: the script expands to more than {} runs, more than --max-runs {max_runs}",
            src.path.display(),
            usize::MAX
        ),
    }
    let mut runs = Vec::with_capacity(count.unwrap_or(0));
    for (i, s) in scenarios.iter().enumerate() {
        let prompt = match (&s.prompt, &s.prompt_file, s.synthetic) {
            (Some(t), None, None) => Prompt::Text(t.clone()),
            (None, Some(f), None) => {
                let p = base.join(f);
                let t = std::fs::read_to_string(&p).with_context(|| {
                    format!(
                        "{}: prompt_file {} cannot be read",
                        src.line(Some(i), "prompt_file"),
                        p.display()
                    )
                })?;
                Prompt::Text(t)
            }
            (None, None, Some(n)) if (1..=1 << 20).contains(&n) => Prompt::Synthetic(n as u32),
            (None, None, Some(_)) => bail!(
                "{}: synthetic must be 1 to 1048576 tokens",
                src.line(Some(i), "synthetic")
            ),
            _ => bail!(
                "{}: scenario `{}` needs exactly one of prompt, prompt_file, synthetic",
                src.line(Some(i), ""),
                s.name
            ),
        };
        let k = merge(&defaults, &s.knobs);
        validate(&k, &|key: &str| {
            if s.knobs_has(key) {
                src.line(Some(i), key)
            } else {
                src.line(None, key)
            }
        })?;
        let reorders = k.reorder.as_ref().map_or(vec![true], OneOrMany::values);
        let some = |v: Vec<u32>| v.into_iter().map(Some).collect::<Vec<_>>();
        let lpcbs = k
            .layers_per_cb
            .as_ref()
            .map_or(vec![None], |v| some(v.values()));
        let windows = k
            .prefill_windows
            .as_ref()
            .map_or(vec![None], |v| some(v.values()));
        let threads: Vec<Option<usize>> = k
            .threads
            .as_ref()
            .map_or(vec![None], |v| v.values().into_iter().map(Some).collect());
        for &reorder in &reorders {
            for &layers_per_cb in &lpcbs {
                for &prefill_windows in &windows {
                    for &t in &threads {
                        let run = Run {
                            scenario: s.name.clone(),
                            model: k.model.clone(),
                            reorder,
                            layers_per_cb,
                            prefill_windows,
                            threads: t,
                            backend: k.backend.clone(),
                            repetitions: k.repetitions.unwrap_or(3),
                        };
                        runs.push((run, prompt.clone()));
                    }
                }
            }
        }
    }
    Ok(runs)
}

impl Scenario {
    fn knobs_has(&self, key: &str) -> bool {
        let k = &self.knobs;
        match key {
            "model" => k.model.is_some(),
            "repetitions" => k.repetitions.is_some(),
            "reorder" => k.reorder.is_some(),
            "layers_per_cb" => k.layers_per_cb.is_some(),
            "prefill_windows" => k.prefill_windows.is_some(),
            "threads" => k.threads.is_some(),
            "backend" => k.backend.is_some(),
            _ => false,
        }
    }
}

fn merge(defaults: &Knobs, own: &Knobs) -> Knobs {
    Knobs {
        model: own.model.clone().or(defaults.model.clone()),
        repetitions: own.repetitions.or(defaults.repetitions),
        reorder: own.reorder.clone().or(defaults.reorder.clone()),
        layers_per_cb: own.layers_per_cb.clone().or(defaults.layers_per_cb.clone()),
        prefill_windows: own
            .prefill_windows
            .clone()
            .or(defaults.prefill_windows.clone()),
        threads: own.threads.clone().or(defaults.threads.clone()),
        backend: own.backend.clone().or(defaults.backend.clone()),
    }
}

/// Checks what parsing could not: the backend and the model (ranges and
/// types were checked as each key was read).
fn validate(k: &Knobs, at: &dyn Fn(&str) -> String) -> Result<()> {
    if let Some(b) = &k.backend {
        if b != "cpu" {
            bail!(
                "{}: backend `{b}` is not available in this build (accepted: cpu)",
                at("backend")
            );
        }
    }
    if let Some(m) = &k.model {
        if weft::models::fetch::find_model(m).is_none() && !Path::new(m).is_file() {
            bail!(
                "{}: model `{m}` is neither a known name nor a file",
                at("model")
            );
        }
    }
    Ok(())
}

fn measure(run: Run, prompt: &Prompt, trace: Option<(&OutputDir, String)>) -> Result<Outcome> {
    let args = ModelArgs {
        model: run.model.clone(),
        threads: run.threads,
        layers_per_cb: run.layers_per_cb,
        no_reorder: !run.reorder,
        no_fuse: false,
        backend: run.backend.clone().unwrap_or_else(|| "cpu".into()),
        numerics: None,
    };
    let (mut exec, model) = args.load()?;
    let tokens: Vec<u32> = match prompt {
        Prompt::Text(t) => model.tokenizer.encode(t),
        Prompt::Synthetic(n) => (0..*n)
            .map(|i| (i * 7919 % model.vocab() as u32).max(1))
            .collect(),
    };
    if tokens.is_empty() {
        bail!("scenario `{}`: the prompt has no tokens", run.scenario);
    }
    let mut policy = args.chunk_policy(&model)?;
    if let Some(m) = run.prefill_windows {
        policy.multiplier = m;
    }
    let mut cache = model.new_cache(&mut exec, tokens.len() as u32, policy.max_chunk())?;
    if trace.is_some() {
        exec.enable_trace();
    }
    let (mut tps, mut ttft, mut chunks, mut per) = (Vec::new(), 0.0, 0usize, (0.0, 0.0));
    for rep in 0..=run.repetitions {
        cache.reset();
        let before = exec.counters();
        let mut count = 0usize;
        let t = Instant::now();
        model.prefill_with(
            &mut exec,
            &mut cache,
            &tokens,
            &policy,
            LogitRows::Last,
            &mut |_, _| {
                count += 1;
                Ok(())
            },
        )?;
        let secs = t.elapsed().as_secs_f64();
        let c = exec.counters() - before;
        if rep > 0 {
            tps.push(tokens.len() as f64 / secs);
            ttft = secs * 1e3;
            chunks = count;
            per = (
                c.barriers as f64 / count as f64,
                c.command_buffers as f64 / count as f64,
            );
        }
    }
    if let Some((dir, name)) = trace {
        dir.write(&name, exec.take_trace().to_chrome_json().as_bytes())?;
    }
    tps.sort_by(f64::total_cmp);
    Ok(Outcome {
        tokens: tokens.len(),
        chunks,
        ttft_ms: ttft,
        tps_median: tps[tps.len() / 2],
        tps_min: tps[0],
        tps_max: tps[tps.len() - 1],
        barriers_per_chunk: per.0,
        command_buffers_per_chunk: per.1,
        peak_pool_bytes: exec.pool_stats().peak_in_use,
        run,
    })
}

fn print_table(outcomes: &[Outcome]) -> Result<()> {
    let mut out = Stdout::lock();
    out.line(
        "| scenario | reorder | layers/cb | windows | threads | tokens | chunks | TTFT ms | prefill t/s (median, min-max) | barriers/chunk | cbs/chunk | peak pool MiB |"
    )?;
    out.line("|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    for o in outcomes {
        let r = &o.run;
        let opt = |v: Option<String>| v.unwrap_or_else(|| "default".into());
        out.line(format_args!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} ({:.1}-{:.1}) | {:.0} | {:.1} | {:.1} |",
            r.scenario,
            if r.reorder { "on" } else { "off" },
            opt(r.layers_per_cb.map(|v| v.to_string())),
            opt(r.prefill_windows.map(|v| v.to_string())),
            opt(r.threads.map(|v| v.to_string())),
            o.tokens,
            o.chunks,
            o.ttft_ms,
            o.tps_median,
            o.tps_min,
            o.tps_max,
            o.barriers_per_chunk,
            o.command_buffers_per_chunk,
            o.peak_pool_bytes as f64 / (1 << 20) as f64
        ))?;
    }
    Ok(())
}
