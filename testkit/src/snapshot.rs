//! Checked-in schedule snapshots: the node, level, barrier and command
//! buffer counts of a recording's schedule and the level of every node, as
//! a text file a refactor must leave unchanged. A test renders the schedule
//! it builds ([`render`]) and compares it with the file ([`check`]);
//! `WEFT_TEST_BLESS=1` rewrites the file instead, for a change that is
//! meant to alter the schedule (the diff then shows what moved).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use weft_graph::reorder::Schedule;
use weft_graph::Node;

/// The variable that rewrites snapshots instead of comparing them.
pub const BLESS_ENV: &str = "WEFT_TEST_BLESS";

/// `tests/snapshots/NAME` of this repository.
pub fn snapshot_path(name: &str) -> PathBuf {
    crate::reference::repo_root()
        .join("tests/snapshots")
        .join(name)
}

/// The snapshot text of `schedule` over `nodes` (recorded order): a title
/// line, the totals, one line per command buffer, one line per node
/// (`id level layer op label`, level within its command buffer).
pub fn render(title: &str, nodes: &[Node], schedule: &Schedule) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# {title}");
    let _ = writeln!(
        out,
        "# Checked by tests/schedule_snapshots.rs; {BLESS_ENV}=1 rewrites it."
    );
    let _ = writeln!(out, "nodes {}", nodes.len());
    let _ = writeln!(out, "levels {}", schedule.levels());
    let _ = writeln!(out, "barriers {}", schedule.barriers());
    let _ = writeln!(out, "command_buffers {}", schedule.command_buffers.len());
    for (i, cb) in schedule.command_buffers.iter().enumerate() {
        let _ = writeln!(
            out,
            "cb {i} nodes {}..{} levels {} barriers {}",
            cb.nodes.start, cb.nodes.end, cb.stats.levels, cb.stats.barriers
        );
    }
    let _ = writeln!(out, "# id level layer op label");
    for cb in &schedule.command_buffers {
        for (k, &level) in cb.levels.iter().enumerate() {
            let id = cb.nodes.start + k;
            let n = &nodes[id];
            let layer = n.layer.map_or("-".to_string(), |l| l.to_string());
            let _ = writeln!(out, "{id} {level} {layer} {} {}", n.op, n.label);
        }
    }
    out
}

/// Compares `text` with the snapshot file `path` and panics with the lines
/// that differ; under `WEFT_TEST_BLESS=1` writes `text` to `path` instead.
pub fn check(path: &Path, text: &str) {
    if std::env::var(BLESS_ENV).is_ok_and(|v| v == "1") {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        }
        std::fs::write(path, text)
            .unwrap_or_else(|e| panic!("cannot write snapshot {}: {e}", path.display()));
        eprintln!("{BLESS_ENV}=1: wrote {}", path.display());
        return;
    }
    let want = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "cannot read snapshot {}: {e}; {BLESS_ENV}=1 writes it",
            path.display()
        )
    });
    if want == text {
        return;
    }
    let (old, new): (Vec<&str>, Vec<&str>) = (want.lines().collect(), text.lines().collect());
    let mut report = String::new();
    let mut shown = 0;
    for i in 0..old.len().max(new.len()) {
        let (a, b) = (old.get(i).copied(), new.get(i).copied());
        if a == b {
            continue;
        }
        if shown < 20 {
            let _ = writeln!(
                report,
                "  line {}: snapshot `{}`, now `{}`",
                i + 1,
                a.unwrap_or("(none)"),
                b.unwrap_or("(none)")
            );
        }
        shown += 1;
    }
    panic!(
        "the schedule differs from snapshot {} in {shown} line(s):\n{report}\
         If the change is meant, rerun with {BLESS_ENV}=1 and commit the new file.",
        path.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_graph::cut::{cut, CutPolicy};
    use weft_graph::reorder::{schedule, Strategy};
    use weft_graph::{BufferId, ByteRange};

    fn chain() -> Vec<Node> {
        let r = |b: u32| ByteRange::new(BufferId(b), 0, 16);
        [(0, 1), (1, 2), (0, 3)]
            .iter()
            .enumerate()
            .map(|(i, &(src, dst))| {
                Node::checked(
                    "copy",
                    format!("n{i}").into(),
                    None,
                    Some(vec![r(src)]),
                    Some(vec![r(dst)]),
                )
                .expect("node")
            })
            .collect()
    }

    #[test]
    fn the_text_names_every_level() {
        let nodes = chain();
        let whole = cut(&nodes, &CutPolicy::default());
        let s = schedule(&nodes, &whole, Strategy::Reorder);
        let text = render("chain", &nodes, &s);
        assert!(text.contains("\nnodes 3\nlevels 2\nbarriers 1\n"), "{text}");
        assert!(
            text.contains("\n0 0 - copy n0\n1 1 - copy n1\n2 0 - copy n2\n"),
            "{text}"
        );
    }

    #[test]
    fn a_changed_level_fails() {
        let nodes = chain();
        let whole = cut(&nodes, &CutPolicy::default());
        let s = schedule(&nodes, &whole, Strategy::Reorder);
        let text = render("chain", &nodes, &s);
        let dir = std::env::temp_dir().join(format!("weft-snapshot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch folder");
        let path = dir.join("chain.txt");
        std::fs::write(
            &path,
            text.replace("\n2 0 - copy n2\n", "\n2 1 - copy n2\n"),
        )
        .expect("write");
        let failed = std::panic::catch_unwind(|| check(&path, &text));
        let message = failed
            .err()
            .and_then(|e| e.downcast_ref::<String>().cloned())
            .expect("a changed level fails");
        assert!(
            message.contains("snapshot `2 1 - copy n2`, now `2 0 - copy n2`"),
            "{message}"
        );
        std::fs::write(&path, &text).expect("write");
        check(&path, &text);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
