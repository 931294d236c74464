//! The `weft` binary against hostile command lines: closed or full standard
//! streams, sizes that overflow, floats outside their range, malformed
//! `WEFT_*` variables, output paths that cannot be written, and prefill
//! scripts that expand to too much or to nothing.
//!
//! Every case must end in a clean refusal (exit status 1 to 127, stderr
//! naming the cause) or in a correct result; a panic (status 101,
//! "panicked"), a signal or a run past the time limit fails the test. Most
//! cases fail before any model is loaded; the few that need one use the
//! default SmolLM2 model (skipped when it cannot be fetched, unless
//! `WEFT_TEST_REQUIRE_MODEL=1`).

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WEFT: &str = env!("CARGO_BIN_EXE_weft");
const TIME_LIMIT: Duration = Duration::from_secs(60);

/// Where the standard streams of a case go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Streams {
    /// Both captured.
    Captured,
    /// stdout a pipe whose reader is closed before the command writes.
    StdoutClosed,
    /// stdout is /dev/full: every write fails with ENOSPC.
    StdoutFull,
    /// stderr a pipe whose reader is closed (so nothing to check in it).
    StderrClosed,
    /// Both pipes closed.
    BothClosed,
}

/// What a case must end in.
#[derive(Clone, Debug)]
enum Expect {
    /// Exit 1 to 127, stderr containing every one of these strings.
    Refused(Vec<String>),
    /// Exit 1 to 127 (stderr is closed: only the status is seen).
    RefusedSilently,
    /// Exit 0, stdout containing the first string and stderr every other.
    Success(String, Vec<String>),
    /// Exit 0 and no error on stderr (a broken pipe on stdout).
    Quiet,
}

fn refused(needles: &[&str]) -> Expect {
    Expect::Refused(needles.iter().map(|n| n.to_string()).collect())
}

fn success(out: &str, errs: &[&str]) -> Expect {
    Expect::Success(out.into(), errs.iter().map(|n| n.to_string()).collect())
}

struct Case {
    name: String,
    args: Vec<OsString>,
    env: Vec<(&'static str, OsString)>,
    streams: Streams,
    expect: Expect,
    needs_model: bool,
}

fn case(name: &str, args: &[&str], expect: Expect) -> Case {
    Case {
        name: name.to_string(),
        args: args.iter().map(OsString::from).collect(),
        env: Vec::new(),
        streams: Streams::Captured,
        expect,
        needs_model: false,
    }
}

impl Case {
    fn env(mut self, var: &'static str, value: impl Into<OsString>) -> Case {
        self.env.push((var, value.into()));
        self
    }

    fn streams(mut self, s: Streams) -> Case {
        self.streams = s;
        self
    }

    fn model(mut self) -> Case {
        self.needs_model = true;
        self
    }

    fn arg(mut self, a: impl Into<OsString>) -> Case {
        self.args.push(a.into());
        self
    }
}

/// How a case ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    CleanError,
    Correct,
    Panic,
    Crash,
    Hang,
    Wrong,
}

struct Ran {
    status: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
}

fn reader(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut text);
        }
        String::from_utf8_lossy(&text).into_owned()
    })
}

fn run(c: &Case) -> Ran {
    let mut cmd = Command::new(WEFT);
    cmd.args(&c.args).stdin(Stdio::null());
    for (k, v) in &c.env {
        cmd.env(k, v);
    }
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full")
    };
    match c.streams {
        Streams::StdoutFull => cmd.stdout(Stdio::from(full())),
        _ => cmd.stdout(Stdio::piped()),
    };
    cmd.stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn weft");
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let closes_stdout = matches!(c.streams, Streams::StdoutClosed | Streams::BothClosed);
    let closes_stderr = matches!(c.streams, Streams::StderrClosed | Streams::BothClosed);
    let out = if closes_stdout {
        drop(out);
        None
    } else {
        Some(reader(out))
    };
    let err = if closes_stderr {
        drop(err);
        None
    } else {
        Some(reader(err))
    };
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > TIME_LIMIT {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait after kill");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = |h: Option<std::thread::JoinHandle<String>>| {
        h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
    };
    use std::os::unix::process::ExitStatusExt;
    Ran {
        status: status.code(),
        signal: status.signal(),
        stdout: text(out),
        stderr: text(err),
        timed_out,
    }
}

fn judge(c: &Case, r: &Ran) -> (Outcome, String) {
    if r.timed_out {
        return (Outcome::Hang, format!("killed after {TIME_LIMIT:?}"));
    }
    if r.status == Some(101) || r.stderr.contains("panicked") {
        return (Outcome::Panic, r.stderr.clone());
    }
    let Some(code) = r.status else {
        return (Outcome::Crash, format!("signal {:?}", r.signal));
    };
    let failed = (1..128).contains(&code);
    match &c.expect {
        Expect::Refused(needles) => {
            let missing: Vec<_> = needles
                .iter()
                .filter(|n| !r.stderr.contains(n.as_str()))
                .collect();
            if failed && missing.is_empty() {
                (Outcome::CleanError, String::new())
            } else {
                (
                    Outcome::Wrong,
                    format!("exit {code}, stderr lacks {missing:?}: {}", r.stderr),
                )
            }
        }
        Expect::RefusedSilently if failed => (Outcome::CleanError, String::new()),
        Expect::Success(out, errs)
            if code == 0
                && r.stdout.contains(out.as_str())
                && errs.iter().all(|e| r.stderr.contains(e.as_str())) =>
        {
            (Outcome::Correct, String::new())
        }
        Expect::Quiet if code == 0 && !r.stderr.contains("error") => {
            (Outcome::Correct, String::new())
        }
        _ => (
            Outcome::Wrong,
            format!(
                "exit {code}; stdout {:?}; stderr {:?}",
                r.stdout.chars().take(300).collect::<String>(),
                r.stderr
            ),
        ),
    }
}

/// A scratch folder for scripts and outputs.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-hostile-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write scratch file");
    p.display().to_string()
}

fn model_available() -> bool {
    weft_testkit::require::model_path(&weft::models::fetch::SMOLLM2_135M_Q4_1).is_some()
}

fn non_utf8() -> OsString {
    use std::os::unix::ffi::OsStringExt;
    OsString::from_vec(vec![0xff, 0xfe, b'1'])
}

/// The closed- and full-stream cases.
fn stream_cases(dir: &Path) -> Vec<Case> {
    use Expect::*;
    use Streams::*;
    let long_text = "word ".repeat(20_000);
    let text_file = write(
        dir,
        "ppl.txt",
        &"The quick brown fox jumps over the lazy dog. ".repeat(8),
    );
    let script = write(
        dir,
        "small.toml",
        "[[scenario]]\nname = \"tiny\"\nsynthetic = 8\nrepetitions = 1\nthreads = 1\n",
    );
    let synth = ["graph", "synth", "--shape", "llama", "--layers", "2"];
    let bench = [
        "bench",
        "--pp",
        "8",
        "--tg",
        "2",
        "--reps",
        "1",
        "--threads",
        "1",
    ];
    let run = [
        "run",
        "-p",
        "Hello",
        "-n",
        "2",
        "--temp",
        "0",
        "--threads",
        "1",
    ];
    let ppl = ["perplexity", "--ctx", "16", "--threads", "1", "-f"];
    vec![
        case("tokenize | closed pipe", &["tokenize", "--text"], Quiet)
            .arg(&long_text)
            .streams(StdoutClosed)
            .model(),
        case(
            "tokenize > /dev/full",
            &["tokenize", "--text", "hello"],
            refused(&["stdout", "No space left"]),
        )
        .streams(StdoutFull)
        .model(),
        case("graph synth | closed pipe", &synth, Quiet).streams(StdoutClosed),
        case(
            "graph synth > /dev/full",
            &synth,
            refused(&["stdout", "No space left"]),
        )
        .streams(StdoutFull),
        case(
            "graph synth --random --json > /dev/full",
            &["graph", "synth", "--random", "--nodes", "50", "--json"],
            refused(&["stdout"]),
        )
        .streams(StdoutFull),
        case("graph synth, both streams closed", &synth, RefusedSilently)
            .arg("--dump")
            .arg("/nonexistent-dir/x.json")
            .streams(BothClosed),
        case(
            "graph synth error, stderr closed",
            &["graph", "synth", "--shape", "lama"],
            RefusedSilently,
        )
        .streams(StderrClosed),
        case(
            "clap error, stderr closed",
            &["run", "--temp", "nan", "-p", "x"],
            RefusedSilently,
        )
        .streams(StderrClosed),
        case("--help | closed pipe", &["--help"], Quiet).streams(StdoutClosed),
        case("bad WEFT_THREADS, stderr closed", &synth, RefusedSilently)
            .env("WEFT_THREADS", "0")
            .streams(StderrClosed),
        case("run | closed pipe", &run, Quiet)
            .streams(StdoutClosed)
            .model(),
        case(
            "run > /dev/full",
            &run,
            refused(&["stdout", "No space left"]),
        )
        .streams(StdoutFull)
        .model(),
        case("run --format json > /dev/full", &run, refused(&["stdout"]))
            .arg("--format")
            .arg("json")
            .streams(StdoutFull)
            .model(),
        case("run --profile, stderr closed", &run, success("", &[]))
            .arg("--profile")
            .streams(StderrClosed)
            .model(),
        case("perplexity | closed pipe", &ppl, Quiet)
            .arg(&text_file)
            .streams(StdoutClosed)
            .model(),
        case("perplexity > /dev/full", &ppl, refused(&["stdout"]))
            .arg(&text_file)
            .streams(StdoutFull)
            .model(),
        case(
            "perplexity, stderr closed",
            &ppl,
            success("perplexity", &[]),
        )
        .arg(&text_file)
        .streams(StderrClosed)
        .model(),
        case(
            "perplexity --ctx 3 scores one token a window",
            &["perplexity", "--ctx", "3", "--threads", "1", "--json", "-f"],
            success("\"ppl\"", &[]),
        )
        .arg(&text_file)
        .model(),
        case("bench | closed pipe", &bench, Quiet)
            .streams(StdoutClosed)
            .model(),
        case("bench > /dev/full", &bench, refused(&["stdout"]))
            .streams(StdoutFull)
            .model(),
        case(
            "bench --profile, stderr closed",
            &bench,
            success("tokens/s", &[]),
        )
        .arg("--profile")
        .streams(StderrClosed)
        .model(),
        case("prefill | closed pipe", &["prefill", "--script"], Quiet)
            .arg(&script)
            .streams(StdoutClosed)
            .model(),
        case(
            "prefill > /dev/full",
            &["prefill", "--script"],
            refused(&["stdout"]),
        )
        .arg(&script)
        .streams(StdoutFull)
        .model(),
        case(
            "tokenize error, stderr closed",
            &["tokenize", "--text", "x", "--model", "/nonexistent.gguf"],
            RefusedSilently,
        )
        .streams(StderrClosed),
    ]
}

/// Sizes that overflow or cannot be allocated.
fn size_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for n in ["18446744073709551615", "1048577", "-1", "4294967296"] {
        v.push(case(
            &format!("run -n {n}"),
            &["run", "-p", "hi", "-n", n],
            refused(&["--n-predict", n]),
        ));
    }
    v.push(case(
        "run -n=-1",
        &["run", "-p", "hi", "-n=-1"],
        refused(&["--n-predict", "-1"]),
    ));
    v.push(case(
        "run -n=18446744073709551615",
        &["run", "-p", "hi", "-n=18446744073709551615"],
        refused(&["--n-predict"]),
    ));
    for ctx in ["0", "4294967295", "1048577"] {
        v.push(case(
            &format!("run --ctx {ctx}"),
            &["run", "-p", "hi", "--ctx", ctx],
            refused(&["--ctx"]),
        ));
    }
    for t in ["0", "1025", "100000", "-1", "18446744073709551616"] {
        v.push(case(
            &format!("run --threads {t}"),
            &["run", "-p", "hi", "--threads", t],
            refused(&["--threads", "1 to 1024"]),
        ));
        v.push(case(
            &format!("bench --threads {t}"),
            &["bench", "--threads", t],
            refused(&["--threads"]),
        ));
    }
    for k in ["0", "4097"] {
        v.push(case(
            &format!("run --layers-per-cb {k}"),
            &["run", "-p", "hi", "--layers-per-cb", k],
            refused(&["--layers-per-cb"]),
        ));
    }
    v.push(case(
        "run --top-k -1",
        &["run", "-p", "hi", "--top-k", "-1"],
        refused(&["--top-k"]),
    ));
    v.push(case(
        "run --seed -5",
        &["run", "-p", "hi", "--seed", "-5"],
        refused(&["--seed"]),
    ));
    v.push(case(
        "run --prompt-ids -1",
        &["run", "--prompt-ids", "1,-1"],
        refused(&["--prompt-ids"]),
    ));
    for (flag, n) in [
        ("--pp", "4294967295"),
        ("--pp", "4294967280"),
        ("--tg", "4294967295"),
        ("--pp", "1048577"),
    ] {
        v.push(case(
            &format!("bench {flag} {n}"),
            &["bench", flag, n],
            refused(&[flag]),
        ));
    }
    for r in ["0", "18446744073709551615", "10001"] {
        v.push(case(
            &format!("bench --reps {r}"),
            &["bench", "--reps", r],
            refused(&["--reps"]),
        ));
    }
    for (flag, n) in [
        ("--position", "4294967295"),
        ("--position", "-1"),
        ("--tokens", "0"),
        ("--tokens", "4294967295"),
    ] {
        v.push(case(
            &format!("graph dump {flag} {n}"),
            &["graph", "dump", "--out", "/tmp/x.json", flag, n],
            refused(&[flag]),
        ));
    }
    for (flag, n) in [
        ("--layers", "4294967295"),
        ("--layers", "0"),
        ("--layers", "4097"),
        ("--tokens", "18446744073709551615"),
        ("--tokens", "0"),
        ("--layers-per-cb", "0"),
    ] {
        v.push(case(
            &format!("graph synth --shape llama {flag} {n}"),
            &["graph", "synth", "--shape", "llama", flag, n],
            refused(&[flag]),
        ));
    }
    for (flag, n) in [
        ("--nodes", "1000000000"),
        ("--nodes", "0"),
        ("--buffers", "0"),
        ("--buffers", "4294967295"),
    ] {
        v.push(case(
            &format!("graph synth --random {flag} {n}"),
            &["graph", "synth", "--random", flag, n],
            refused(&[flag]),
        ));
    }
    for ctx in ["2", "0", "1", "4294967295", "-3"] {
        v.push(case(
            &format!("perplexity --ctx {ctx}"),
            &["perplexity", "-f", "README.md", "--ctx", ctx],
            refused(&["--ctx"]),
        ));
    }
    for (flag, n) in [
        ("--layers", "0"),
        ("--layers", "44"),
        ("--layers", "18446744073709551615"),
        ("--experts", "5"),
        ("--experts", "4097"),
        ("--context", "1"),
        ("--context", "4294967296"),
        ("--tile-rows", "0"),
        ("--tile-rows", "18446744073709551615"),
    ] {
        v.push(case(
            &format!("synth-model {flag} {n}"),
            &["synth-model", "--out", "/tmp/never-written.gguf", flag, n],
            refused(&[flag]),
        ));
    }
    for layers in ["0..4294967295", "3..1", "a..b", "-1..2"] {
        v.push(case(
            &format!("graph dump --layers {layers}"),
            &["graph", "dump", "--out", "/tmp/x.json", "--layers", layers],
            refused(&["--layers", layers]),
        ));
    }
    v.push(case(
        "prefill --max-runs 0",
        &["prefill", "--script", "x.toml", "--max-runs", "0"],
        refused(&["--max-runs"]),
    ));
    // Within the flags' ranges, but past the model's context: refused after
    // loading, before any work.
    v.push(
        case(
            "run -n past the context",
            &["run", "-p", "hi", "-n", "5000", "--threads", "1"],
            refused(&["context"]),
        )
        .model(),
    );
    v.push(
        case(
            "run --ctx 4 -n 8",
            &["run", "-p", "hi", "--ctx", "4", "-n", "8", "--threads", "1"],
            refused(&["context of 4"]),
        )
        .model(),
    );
    v.push(
        case(
            "run --prompt-ids past the vocabulary",
            &["run", "--prompt-ids", "4294967295", "-n", "1"],
            refused(&["--prompt-ids", "4294967295"]),
        )
        .model(),
    );
    v.push(
        case(
            "bench --pp past the context",
            &["bench", "--pp", "1048576", "--reps", "1"],
            refused(&["--pp", "context"]),
        )
        .model(),
    );
    v.push(
        case(
            "graph dump --position past the context",
            &[
                "graph",
                "dump",
                "--position",
                "1048576",
                "--out",
                "/tmp/weft-hostile-never.json",
            ],
            refused(&["--position", "context"]),
        )
        .model(),
    );
    v
}

/// Floats outside their meaningful range, and tiny temperatures.
fn float_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for t in ["nan", "NaN", "inf", "-inf", "-0.5", "1e39", "x"] {
        v.push(case(
            &format!("run --temp {t}"),
            &["run", "-p", "hi", "--temp", t],
            refused(&["--temp"]),
        ));
    }
    for p in ["0", "nan", "-1", "inf", "-0"] {
        v.push(case(
            &format!("run --repeat-penalty {p}"),
            &["run", "-p", "hi", "--repeat-penalty", p],
            refused(&["--repeat-penalty"]),
        ));
    }
    for p in ["1.5", "-0.1", "nan", "inf", "2"] {
        v.push(case(
            &format!("run --top-p {p}"),
            &["run", "-p", "hi", "--top-p", p],
            refused(&["--top-p", "0 to 1"]),
        ));
        v.push(case(
            &format!("run --min-p {p}"),
            &["run", "-p", "hi", "--min-p", p],
            refused(&["--min-p"]),
        ));
    }
    v.push(
        case(
            "run --temp 1e-38 is greedy",
            &[
                "run",
                "-p",
                "The capital of France is",
                "-n",
                "2",
                "--temp",
                "1e-38",
                "--seed",
                "9",
                "--format",
                "ids",
                "--threads",
                "1",
            ],
            success("[", &[]),
        )
        .model(),
    );
    v
}

/// `WEFT_*` variables, checked at start-up (on commands that load nothing).
fn env_cases() -> Vec<Case> {
    let synth = ["graph", "synth", "--shape", "llama", "--layers", "1"];
    let mut v = Vec::new();
    let bad: &[(&'static str, &str)] = &[
        ("WEFT_CPU_ISA", "avx9"),
        ("WEFT_CPU_ISA", ""),
        ("WEFT_CPU_ISA", "avx512 avx2"),
        ("WEFT_PYTHON", ""),
        ("WEFT_PYTHON", "   "),
        ("WEFT_CACHE", ""),
        ("WEFT_THREADS", "1025"),
        ("WEFT_THREADS", "0"),
        ("WEFT_REORDER", "yes"),
        ("WEFT_LAYERS_PER_CB", "0"),
        ("WEFT_PREFILL_WINDOWS", "99999"),
        ("WEFT_GRAPH_DIAG", "2"),
        ("WEFT_FUSE", "off"),
        ("WEFT_CUDA_GRAPHS", "2"),
        ("WEFT_CUDA_GROUP", "on"),
        ("WEFT_CUDA_STREAMS", "5"),
        ("WEFT_CUDA_STREAMS", "0"),
        ("WEFT_CUDA_PTX_CACHE", ""),
        ("WEFT_CUDA_F64_SUM", "fast"),
        ("WEFT_CUDA_MATVEC_ROWS", "indirect"),
        ("WEFT_CUDA_MATVEC_BLOCK_ROWS", "12"),
        ("WEFT_CUDA_PROJ_ATTENTION", "yes"),
        ("WEFT_CUDA_ATTN_STAGING", "staged"),
        ("WEFT_CUDA_PDL", "2"),
        ("WEFT_CUDA_ROPE_POSITIONS", "0"),
    ];
    for (var, value) in bad {
        v.push(case(&format!("{var}={value:?}"), &synth, refused(&[var])).env(var, *value));
    }
    for var in [
        "WEFT_CPU_ISA",
        "WEFT_PYTHON",
        "WEFT_THREADS",
        "WEFT_CUDA_STREAMS",
    ] {
        v.push(
            case(
                &format!("{var} not UTF-8"),
                &synth,
                refused(&[var, "UTF-8"]),
            )
            .env(var, non_utf8()),
        );
    }
    // An empty WEFT_PYTHON must not fall back to python3 and fetch.
    v.push(
        case(
            "WEFT_PYTHON empty with a fetch",
            &["tokenize", "--text", "x"],
            refused(&["WEFT_PYTHON"]),
        )
        .env("WEFT_PYTHON", "")
        .env(
            "WEFT_CACHE",
            std::env::temp_dir().join("weft-hostile-empty-cache"),
        ),
    );
    v.push(
        case(
            "WEFT_CPU_ISA=scalar works",
            &["tokenize", "--text", "hello world"],
            success("[", &[]),
        )
        .env("WEFT_CPU_ISA", "scalar")
        .model(),
    );
    v.push(
        case(
            "WEFT_CUDA_STREAMS=2 on the CPU",
            &synth,
            success("nodes", &[]),
        )
        .env("WEFT_CUDA_STREAMS", " 2 "),
    );
    v
}

/// Output paths that cannot be written, and malformed arguments.
fn path_cases(dir: &Path) -> Vec<Case> {
    let good = write(
        dir,
        "good.toml",
        "[[scenario]]\nsynthetic = 8\nrepetitions = 1\n",
    );
    let missing = "/nonexistent-dir/out.json";
    vec![
        case(
            "graph dump --out missing folder",
            &["graph", "dump", "--out", missing],
            refused(&["--out", missing]),
        ),
        case(
            "graph synth --dump missing folder",
            &["graph", "synth", "--shape", "llama", "--dump", missing],
            refused(&["--dump", missing]),
        ),
        case(
            "graph synth --dump a folder",
            &["graph", "synth", "--shape", "llama", "--dump", "/tmp"],
            refused(&["--dump", "/tmp"]),
        ),
        case(
            "run --trace missing folder",
            &["run", "-p", "hi", "--trace", missing],
            refused(&["--trace", missing]),
        ),
        case(
            "bench --trace missing folder",
            &["bench", "--trace", missing],
            refused(&["--trace", missing]),
        ),
        case(
            "run --dump-layers in /proc",
            &["run", "-p", "hi", "--dump-layers", "/proc/weft-dump"],
            refused(&["--dump-layers", "/proc/weft-dump"]),
        ),
        case(
            "run --dump-layers a file",
            &["run", "-p", "hi", "--dump-layers", "README.md"],
            refused(&["--dump-layers", "README.md"]),
        ),
        case(
            "prefill --json missing folder",
            &["prefill", "--script", &good, "--json", missing],
            refused(&["--json", missing]),
        ),
        case(
            "prefill --trace in /proc",
            &["prefill", "--script", &good, "--trace", "/proc/weft-traces"],
            refused(&["--trace", "/proc/weft-traces"]),
        ),
        case(
            "prefill --script missing",
            &["prefill", "--script", "/nonexistent.toml"],
            refused(&["/nonexistent.toml"]),
        ),
        case(
            "perplexity -f missing",
            &["perplexity", "-f", "/nonexistent.txt"],
            refused(&["/nonexistent.txt"]),
        ),
        case(
            "synth-model --out missing folder",
            &["synth-model", "--out", "/nonexistent-dir/m.gguf"],
            refused(&["--out", "/nonexistent-dir/m.gguf"]),
        ),
        case(
            "synth-model --out /dev/full",
            &[
                "synth-model",
                "--layers",
                "1",
                "--experts",
                "6",
                "--tile-rows",
                "1",
                "--out",
                "/dev/full",
            ],
            refused(&["/dev/full", "writ", "No space left"]),
        ),
        case(
            "run --model missing",
            &["run", "-p", "hi", "--model", "/nonexistent.gguf"],
            refused(&["/nonexistent.gguf"]),
        ),
        case(
            "run --backend bogus",
            &["run", "-p", "hi", "--backend", "tpu"],
            refused(&["--backend", "tpu"]),
        ),
    ]
}

/// Prefill scripts: sweeps too large, empty arrays, wrong types.
fn prefill_cases(dir: &Path) -> Vec<Case> {
    let list = |n: usize, v: &str| format!("[{}]", vec![v; n].join(", "));
    let huge = write(
        dir,
        "huge.toml",
        &format!(
            "[[scenario]]\nsynthetic = 8\nthreads = {}\nlayers_per_cb = {}\nprefill_windows = {}\n",
            list(1024, "1"),
            list(4096, "2"),
            list(2, "3")
        ),
    );
    let overflow = write(
        dir,
        "overflow.toml",
        &format!(
            "[[scenario]]\nsynthetic = 8\nthreads = {t}\nlayers_per_cb = {t}\nprefill_windows = {t}\nreorder = {r}\n",
            t = list(65_536, "1"),
            r = list(65_536, "true"),
        ),
    );
    let three = write(
        dir,
        "three.toml",
        "[[scenario]]\nsynthetic = 8\nrepetitions = 1\nthreads = [1, 1, 1]\n",
    );
    let two = write(
        dir,
        "two.toml",
        "[defaults]\nrepetitions = 1\nthreads = 1\n\n[[scenario]]\nname = \"sweep\"\nsynthetic = 8\nreorder = [true, false]\n",
    );
    let script = |name: &str, body: &str| write(dir, name, body);
    let mut v = vec![
        case(
            "8.4 million runs",
            &["prefill", "--script", &huge],
            refused(&["8388608 runs", "--max-runs 1000"]),
        ),
        case(
            "runs overflow",
            &["prefill", "--script", &overflow],
            refused(&["runs", "--max-runs"]),
        ),
        case(
            "3 runs, --max-runs 2",
            &["prefill", "--max-runs", "2", "--script", &three],
            refused(&["3 runs", "--max-runs 2"]),
        ),
        case(
            "2 runs: counted and progress right",
            &["prefill", "--script", &two],
            success("| sweep |", &["2 runs", "(1/2)", "(2/2)", "2/2 done"]),
        )
        .model(),
    ];
    for (key, body) in [
        ("threads", "threads = []"),
        ("layers_per_cb", "layers_per_cb = []"),
        ("prefill_windows", "prefill_windows = []"),
        ("reorder", "reorder = []"),
    ] {
        let p = script(
            &format!("empty-{key}.toml"),
            &format!("[[scenario]]\nsynthetic = 8\n{body}\n"),
        );
        v.push(case(
            &format!("{key} = []"),
            &["prefill", "--script", &p],
            refused(&[key, "empty"]),
        ));
    }
    let p = script(
        "empty-default.toml",
        "[defaults]\nthreads = []\n\n[[scenario]]\nsynthetic = 8\n",
    );
    v.push(case(
        "[defaults] threads = []",
        &["prefill", "--script", &p],
        refused(&["threads", "empty", ":2"]),
    ));
    for (name, body, needles) in [
        (
            "threads string",
            "threads = \"four\"",
            &["threads", "integer", "array", "string"][..],
        ),
        (
            "threads element",
            "threads = [1, \"x\"]",
            &["threads[1]", "integer"][..],
        ),
        (
            "threads out of range",
            "threads = 2000",
            &["threads", "1 to 1024"][..],
        ),
        (
            "threads table",
            "threads = { a = 1 }",
            &["threads", "table"][..],
        ),
        (
            "reorder integer",
            "reorder = 1",
            &["reorder", "boolean"][..],
        ),
        (
            "layers_per_cb float",
            "layers_per_cb = 1.5",
            &["layers_per_cb", "integer", "float"][..],
        ),
        (
            "repetitions 0",
            "repetitions = 0",
            &["repetitions", "1 to 1000"][..],
        ),
        (
            "repetitions negative",
            "repetitions = -3",
            &["repetitions"][..],
        ),
        (
            "repetitions array",
            "repetitions = [1, 2]",
            &["repetitions", "integer", "array"][..],
        ),
        ("model integer", "model = 3", &["model", "string"][..]),
        ("unknown key", "thread = 2", &["thread", "unknown"][..]),
    ] {
        let p = script(
            &format!("{}.toml", name.replace(' ', "-")),
            &format!("[[scenario]]\nsynthetic = 8\n{body}\n"),
        );
        v.push(case(
            &format!("prefill {name}"),
            &["prefill", "--script", &p],
            refused(needles),
        ));
    }
    let p = script("synthetic0.toml", "[[scenario]]\nsynthetic = 0\n");
    v.push(case(
        "synthetic = 0",
        &["prefill", "--script", &p],
        refused(&["synthetic"]),
    ));
    v
}

#[test]
fn hostile_command_lines_end_cleanly() {
    let dir = scratch();
    let mut cases = stream_cases(&dir);
    cases.extend(size_cases());
    cases.extend(float_cases());
    cases.extend(env_cases());
    cases.extend(path_cases(&dir));
    cases.extend(prefill_cases(&dir));
    let with_model = cases.iter().any(|c| c.needs_model) && model_available();
    let (mut tried, mut clean, mut correct, mut panics, mut crashes, mut hangs) =
        (0, 0, 0, 0, 0, 0);
    let mut failures = Vec::new();
    for c in &cases {
        if c.needs_model && !with_model {
            continue;
        }
        tried += 1;
        let r = run(c);
        let (outcome, detail) = judge(c, &r);
        match outcome {
            Outcome::CleanError => clean += 1,
            Outcome::Correct => correct += 1,
            Outcome::Panic => panics += 1,
            Outcome::Crash => crashes += 1,
            Outcome::Hang => hangs += 1,
            Outcome::Wrong => {}
        }
        if !matches!(outcome, Outcome::CleanError | Outcome::Correct) {
            failures.push(format!("{} ({:?}): {outcome:?}: {detail}", c.name, c.args));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "hostile CLI cases: {tried} tried, {clean} clean errors, {correct} correct results, \
         {panics} panics, {crashes} crashes, {hangs} hangs, {} wrong",
        failures.len() - panics - crashes - hangs
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A positive temperature too small for the scaled logits samples exactly
/// as greedy decoding does.
#[test]
fn a_vanishing_temperature_decodes_greedily() {
    if !model_available() {
        return;
    }
    let ids = |temp: &str| {
        let out = Command::new(WEFT)
            .args([
                "run",
                "-p",
                "The capital of France is",
                "-n",
                "4",
                "--format",
                "ids",
            ])
            .args(["--threads", "1", "--seed", "3", "--temp", temp])
            .output()
            .expect("run weft");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let greedy = ids("0");
    assert!(greedy.starts_with('['), "{greedy}");
    for t in ["1e-38", "1e-45"] {
        assert_eq!(ids(t), greedy, "--temp {t}");
    }
}
