//! Closed and full standard streams, and sizes that overflow or exceed what
//! weft allows.

use super::*;

/// The closed- and full-stream cases.
pub(super) fn stream_cases(dir: &Path) -> Vec<Case> {
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
pub(super) fn size_cases() -> Vec<Case> {
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
