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

#[path = "hostile_cli/prefill.rs"]
mod prefill;
#[path = "hostile_cli/streams.rs"]
mod streams;
#[path = "hostile_cli/values.rs"]
mod values;
use prefill::prefill_cases;
use streams::{size_cases, stream_cases};
use values::{env_cases, float_cases, path_cases};

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
