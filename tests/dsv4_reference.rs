//! The plain f64 DeepSeek-V4 forward pass (`weft_testkit::deepseek4`)
//! against the fixtures' reference outputs: logits at every prompt position,
//! argmax, per-layer streams and the per-layer debug values (hyper-connection
//! coefficients, routing, indexer choices), and the 16-token greedy
//! continuation (by re-running the whole sequence). This pins the maths down
//! before any graph work is compared with it.

mod dsv4_common;

use dsv4_common::{argmax, max_abs_diff, Fixture};
use weft::models::gguf::GgufFile;
use weft_testkit::deepseek4::RefModel;

const LOGITS_TOL: f64 = 1e-3;

fn load(f: &Fixture) -> RefModel {
    let file = GgufFile::open(&f.gguf()).expect("gguf");
    RefModel::load(&file).expect("reference model")
}

#[test]
fn reference_forward_matches_every_fixture() {
    for f in Fixture::all() {
        let model = load(&f);
        let out = model.forward(&f.prompt).expect("forward");
        let s = f.prompt.len();
        let v = f.vocab;
        let logits: Vec<f32> = out.logits.iter().map(|&x| x as f32).collect();
        let want = f.logits_all();
        let all_diff = max_abs_diff(&logits, &want);
        let last_diff = max_abs_diff(&logits[(s - 1) * v..], &f.logits_last());
        let got_argmax: Vec<u32> = logits.chunks_exact(v).map(argmax).collect();
        assert_eq!(got_argmax, f.argmax(), "{}: argmax per position", f.name());
        let mut layer_diffs = Vec::new();
        for (l, layer) in out.layers.iter().enumerate() {
            let want = f.layer_streams(l);
            layer_diffs.push(max_abs_diff(&layer.streams_last, &want));
            let rms = f.floats(&f.json["layers"][l]["rms_per_position"]);
            assert!(
                max_abs_diff(&layer.rms_per_position, &rms) < 1e-4,
                "{} layer {l} rms",
                f.name()
            );
            check_debug(&f, l, &layer.debug);
        }
        let hn = f.floats(&f.json["final_hidden_norm"]);
        assert!(
            max_abs_diff(&out.final_hidden_norm, &hn) < 1e-3,
            "{} final norm",
            f.name()
        );
        eprintln!(
            "{}: max |logit diff| all positions {all_diff:.2e}, last {last_diff:.2e}; layer streams {:?}",
            f.name(),
            layer_diffs.iter().map(|d| format!("{d:.1e}")).collect::<Vec<_>>()
        );
        assert!(
            all_diff < LOGITS_TOL,
            "{}: logits differ by {all_diff}",
            f.name()
        );
        assert!(
            layer_diffs.iter().all(|&d| d < LOGITS_TOL),
            "{}: layer streams",
            f.name()
        );
    }
}

fn check_debug(f: &Fixture, l: usize, d: &weft_testkit::deepseek4::LayerDebug) {
    let j = &f.json["layers"][l]["debug_last_position"];
    let name = format!("{} layer {l}", f.name());
    for (site, got) in [("hc_attn", &d.hc_attn), ("hc_ffn", &d.hc_ffn)] {
        let pre = f.floats(&j[site]["pre"]);
        let post = f.floats(&j[site]["post"]);
        let comb: Vec<Vec<f64>> = serde_json::from_value(j[site]["comb"].clone()).expect("comb");
        assert!(max_abs_diff(&got.pre, &pre) < 1e-4, "{name} {site} pre");
        assert!(max_abs_diff(&got.post, &post) < 1e-4, "{name} {site} post");
        assert!(
            max_abs_diff(&got.comb.concat(), &comb.concat()) < 1e-4,
            "{name} {site} comb"
        );
    }
    let router = f.floats(&j["router_logits"]);
    assert!(
        max_abs_diff(&d.router_logits, &router) < 1e-4,
        "{name} router logits"
    );
    let experts: Vec<usize> = serde_json::from_value(j["experts"].clone()).expect("experts");
    assert_eq!(d.experts, experts, "{name} experts");
    let weights = f.floats(&j["expert_weights"]);
    assert!(
        max_abs_diff(&d.expert_weights, &weights) < 1e-4,
        "{name} expert weights"
    );
    if let Some(sel) = j.get("indexer_selected").filter(|v| !v.is_null()) {
        let sel: Vec<usize> = serde_json::from_value(sel.clone()).expect("selected");
        assert_eq!(d.indexer_selected, sel, "{name} indexer selection");
        let scores = f.floats(&j["indexer_scores"]);
        let scale = scores.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        assert!(
            max_abs_diff(&d.indexer_scores, &scores) < 1e-4 * scale,
            "{name} indexer scores"
        );
    }
}

#[test]
fn reference_greedy_continuation_matches_by_full_reruns() {
    for f in Fixture::all() {
        let model = load(&f);
        let tokens = f.greedy_tokens();
        let want = f.greedy_logits();
        let v = f.vocab;
        let mut seq = f.prompt.clone();
        let mut worst = 0f64;
        for (j, &tok) in tokens.iter().enumerate() {
            let out = model.forward(&seq).expect("forward");
            let last: Vec<f32> = out.logits[out.logits.len() - v..]
                .iter()
                .map(|&x| x as f32)
                .collect();
            assert_eq!(argmax(&last), tok, "{} greedy step {j}", f.name());
            worst = worst.max(max_abs_diff(&last, &want[j * v..(j + 1) * v]));
            seq.push(tok);
        }
        eprintln!(
            "{}: 16 greedy tokens identical, max |logit diff| {worst:.2e}",
            f.name()
        );
        assert!(worst < LOGITS_TOL);
    }
}
