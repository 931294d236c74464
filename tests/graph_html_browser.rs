//! The HTML graph page in a real headless browser (Debian's chromium): it
//! loads without script errors and shows the expected node count. CI
//! installs chromium and sets `WEFT_TEST_REQUIRE_BROWSER=1`; elsewhere the test
//! is skipped with a message when no browser is found.

use std::process::Command;
use weft::graph::cut::{cut, CutPolicy};
use weft::graph::reorder::{schedule, Strategy};
use weft::graph::{dump, html, synth};

fn browser() -> Option<String> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(str::to_string)
}

#[test]
fn graph_page_loads_in_chromium_and_counts_nodes() {
    let Some(chrome) = browser() else {
        weft_testkit::require::skip_or_fail(
            weft_testkit::require::REQUIRE_BROWSER,
            "no chromium was found on this machine",
        );
        return;
    };
    let syn = synth::llama_shape(&synth::LlamaShape {
        layers: 4,
        tokens: 8,
        ..Default::default()
    });
    let cuts = cut(
        &syn.nodes,
        &CutPolicy {
            layers_per_cb: Some(2),
            ..Default::default()
        },
    );
    let s = schedule(&syn.nodes, &cuts, Strategy::Reorder);
    let page = html::render(
        &dump::build(&syn.nodes, syn.buffers.clone(), &s),
        "test </script> page",
    );
    let dir = std::env::temp_dir().join(format!("weft-html-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("graph.html");
    std::fs::write(&path, page).expect("write page");
    let out = Command::new(&chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            &format!("--user-data-dir={}", dir.join("profile").display()),
            "--dump-dom",
        ])
        .arg(format!("file://{}", path.display()))
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        !log.contains("Uncaught"),
        "script error in the page:\n{log}"
    );
    let n = syn.nodes.len();
    assert!(
        dom.contains(&format!("<title>weft graph: {n} nodes</title>")),
        "title not set; DOM:\n{}",
        &dom[..dom.len().min(2000)]
    );
    assert!(
        dom.contains(&format!("data-nodes=\"{n}\"")),
        "status not set"
    );
    // The first command buffer's levels are rendered as node boxes.
    assert!(dom.matches("class=\"node\"").count() >= 1);
}
