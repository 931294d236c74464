//! Prefill scripts that expand to too much or to nothing.

use super::*;

/// Prefill scripts: sweeps too large, empty arrays, wrong types.
pub(super) fn prefill_cases(dir: &Path) -> Vec<Case> {
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
