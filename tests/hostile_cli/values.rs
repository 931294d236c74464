//! Floats outside their range, malformed `WEFT_*` variables and output paths
//! that cannot be written.

use super::*;

/// Floats outside their meaningful range, and tiny temperatures.
pub(super) fn float_cases() -> Vec<Case> {
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
pub(super) fn env_cases() -> Vec<Case> {
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
pub(super) fn path_cases(dir: &Path) -> Vec<Case> {
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
