//! Diagnostic (ignored by default): tapped intermediates of prompt 0 written
//! as JSON (`name -> [sum, first values]`) to compare with llama.cpp's
//! per-op trace in `tests/reference/smollm2_layer_trace_prompt0.txt.gz`.
//! Run: `cargo test --release --test trace_taps -- --ignored` (writes
//! `target/weft_taps_prompt0.json`).

mod common;

use weft::models::LogitRows;

#[test]
#[ignore]
fn dump_taps_of_prompt_0() {
    let Some(common::Setup { mut exec, model }) = common::load_smollm2(2, None) else {
        return;
    };
    exec.enable_taps();
    let ids = model.tokenizer.encode("The capital of France is");
    let mut cache = model.new_cache(&mut exec, 512, 512).expect("cache");
    model
        .prefill(
            &mut exec,
            &mut cache,
            &ids,
            &model.chunk_policy(),
            LogitRows::Last,
        )
        .expect("prefill");
    let taps = exec.take_taps().expect("taps");
    let mut out = serde_json::Map::new();
    for (name, dims, v) in taps {
        let sum: f64 = v.iter().map(|x| *x as f64).sum();
        let cols = *dims.last().unwrap_or(&1);
        let rows: Vec<Vec<f32>> = v
            .chunks(cols)
            .map(|r| [&r[..3.min(r.len())], &r[r.len().saturating_sub(3)..]].concat())
            .collect();
        out.insert(
            name,
            serde_json::json!({"dims": dims, "sum": sum, "rows": rows}),
        );
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/target/weft_taps_prompt0.json");
    std::fs::write(path, serde_json::to_string_pretty(&out).expect("json")).expect("write");
}
