//! Graphviz DOT of a scheduled recording.
//!
//! Levels are ranks, barriers are red bars between levels, command buffers
//! are clusters, and edges show data flow (a node reading bytes an earlier
//! node wrote). Layers outside a chosen range collapse into one box each
//! run, so a whole 30-layer model stays readable.

use crate::dump::Dump;
use std::fmt::Write;
use std::ops::Range;

/// Renders `dump`; nodes of layers outside `layers` (when given) collapse.
pub fn render(dump: &Dump, layers: Option<Range<u32>>) -> String {
    let shown = |layer: Option<u32>| match (&layers, layer) {
        (Some(r), Some(l)) => r.contains(&l),
        _ => true,
    };
    let mut s = String::new();
    let _ = writeln!(s, "digraph weft {{\n  rankdir=TB; newrank=true; node [shape=box, fontsize=9, fontname=\"Helvetica\"]; edge [color=\"#888888\", arrowsize=0.5];");
    let mut cb_count = dump
        .nodes
        .iter()
        .map(|n| n.command_buffer + 1)
        .max()
        .unwrap_or(0);
    cb_count = cb_count.max(dump.command_buffers.len());
    let mut collapsed_names = Vec::new();
    for cb in 0..cb_count {
        let stats = dump.command_buffers.iter().find(|c| c.index == cb);
        let title = stats.map_or(format!("command buffer {cb}"), |c| {
            format!(
                "command buffer {cb}: {} nodes, {} levels, {} barriers, {} reordered",
                c.nodes, c.levels, c.barriers, c.reordered
            )
        });
        let _ = writeln!(s, "  subgraph cluster_cb{cb} {{\n    label=\"{title}\"; style=rounded; color=\"#4060a0\";");
        let members: Vec<_> = dump
            .nodes
            .iter()
            .filter(|n| n.command_buffer == cb)
            .collect();
        let max_level = members.iter().map(|n| n.level).max().unwrap_or(0);
        let mut prev_anchor: Option<String> = None;
        for level in 0..=max_level {
            let in_level: Vec<_> = members.iter().filter(|n| n.level == level).collect();
            let visible: Vec<_> = in_level.iter().filter(|n| shown(n.layer)).collect();
            let anchor = if visible.is_empty() {
                if in_level.is_empty() {
                    continue;
                }
                // Collapsed levels: one box per run of levels is enough.
                let name = format!("c{cb}_{level}");
                if prev_anchor.as_deref().is_some_and(|p| p.starts_with('c')) {
                    continue;
                }
                let _ = writeln!(s, "    {name} [label=\"collapsed layers\", style=dashed];");
                collapsed_names.push(name.clone());
                name
            } else {
                let _ = writeln!(s, "    {{ rank=same;");
                for n in &visible {
                    let layer = n.layer.map_or(String::new(), |l| format!(" L{l}"));
                    let _ = writeln!(
                        s,
                        "      n{} [label=\"{}{layer}\\n{}\"];",
                        n.id,
                        n.op,
                        escape(&n.label)
                    );
                }
                let _ = writeln!(s, "    }}");
                format!("n{}", visible[0].id)
            };
            if let Some(prev) = &prev_anchor {
                let bar = format!("b{cb}_{level}");
                let _ = writeln!(s, "    {bar} [label=\"barrier\", shape=box, style=filled, fillcolor=\"#d04040\", fontcolor=white, height=0.1, fontsize=7];");
                let _ = writeln!(s, "    {prev} -> {bar} -> {anchor} [style=invis];");
            }
            prev_anchor = Some(anchor);
        }
        let _ = writeln!(s, "  }}");
    }
    write_flow_edges(dump, &shown, &mut s);
    let _ = writeln!(s, "}}");
    s
}

/// Edges from the last writer of each read range to the reader.
fn write_flow_edges(dump: &Dump, shown: &dyn Fn(Option<u32>) -> bool, s: &mut String) {
    let mut writers: Vec<(u32, u64, u64, usize)> = Vec::new();
    for n in &dump.nodes {
        if shown(n.layer) {
            for &(b, start, end) in &n.reads {
                if let Some(w) = writers
                    .iter()
                    .rev()
                    .find(|w| w.0 == b && w.1 < end && start < w.2)
                {
                    if shown(dump.nodes[w.3].layer) && w.3 != n.id {
                        let _ = writeln!(s, "  n{} -> n{};", w.3, n.id);
                    }
                }
            }
        }
        for &(b, start, end) in &n.writes {
            writers.push((b, start, end, n.id));
        }
    }
}

fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"")
}
