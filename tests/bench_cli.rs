//! `weft bench --json` on SmolLM2 through the binary: one entry per depth,
//! and on the CPU the decode floor (bytes a step reads over the measured
//! read bandwidth) computed from the model's weights and cache rows.
//!
//! The model comes from `fetch::ensure`; without it the test prints why and
//! passes, unless `WEFT_TEST_REQUIRE_MODEL=1`. Nothing here is timed: the
//! rates are only checked to be positive and consistent with each other.

use std::process::Command;

#[test]
fn bench_json_reports_each_depth_and_the_cpu_decode_floor() {
    let Some(model) = weft_testkit::require::model_path(&weft::models::fetch::SMOLLM2_135M_Q4_1)
    else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["bench", "--backend", "cpu", "--threads", "1", "--pp", "8"])
        .args([
            "--tg", "4", "--depth", "0,16", "--reps", "1", "--json", "--model",
        ])
        .arg(&model)
        .output()
        .expect("weft runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "weft bench failed:\n{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["numerics"], "exact", "{v}");
    let rate = v["read_bytes_per_second"]
        .as_f64()
        .expect("a measured rate");
    assert!(rate > 1e8, "read rate {rate}");
    let depths = v["depths"].as_array().expect("depths");
    assert_eq!(depths.len(), 2, "{v}");
    let bytes: Vec<u64> = depths
        .iter()
        .map(|d| d["bytes_per_token"].as_u64().expect("bytes_per_token"))
        .collect();
    // SmolLM2 ties its output head to the embedding table, so a step reads
    // every weight, plus 30 layers of f16 keys and values (3 KV heads of
    // 64): 16 more cached cells read 16 * 30 * 2 * 384 bytes more.
    let file_bytes = std::fs::metadata(&model).expect("model file").len();
    assert!(
        bytes[0] > file_bytes * 9 / 10 && bytes[0] < file_bytes,
        "{bytes:?}"
    );
    assert_eq!(bytes[1] - bytes[0], 16 * 30 * 2 * 384, "{bytes:?}");
    for (d, depth) in depths.iter().zip([0, 16]) {
        assert_eq!(d["depth"], depth, "{d}");
        let tg = d["tg_tps"].as_f64().expect("tg_tps");
        let floor = d["floor_tps"].as_f64().expect("floor_tps");
        let share = d["floor_share"].as_f64().expect("floor_share");
        assert!(tg > 0.0 && floor > 0.0, "{d}");
        assert!((floor - rate / d["bytes_per_token"].as_f64().unwrap()).abs() < 1e-6 * floor);
        assert!((share - tg / floor).abs() < 1e-9 * share.max(1.0), "{d}");
    }
}
