//! Shared set-up of the DeepSeek-V4 tests: the tiny fixtures of
//! `tests/reference/dsv4_tiny/` (GGUF, reference.json, logits files)
//! and comparison helpers.

#![allow(dead_code)]

use std::path::PathBuf;
use weft_testkit::reference;

/// One fixture case: a GGUF and one prompt's expected outputs.
pub struct Fixture {
    /// `flash-tiny`, `flash-tiny-short`.
    pub config: &'static str,
    /// `""`, `"_p375"`, `"_p43"`.
    pub tag: &'static str,
    pub dir: PathBuf,
    pub json: serde_json::Value,
    pub prompt: Vec<u32>,
    pub vocab: usize,
}

/// Every case: two configs, two prompts each.
pub const CASES: [(&str, &str); 4] = [
    ("flash-tiny-short", ""),
    ("flash-tiny-short", "_p43"),
    ("flash-tiny", ""),
    ("flash-tiny", "_p375"),
];

/// `dsv4_tiny` of the reference folder (`$WEFT_TEST_REFERENCE_DIR`, else the
/// repository's `tests/reference`).
pub fn fixture_root() -> PathBuf {
    reference::reference_dir().join("dsv4_tiny")
}

impl Fixture {
    pub fn load(config: &'static str, tag: &'static str) -> Fixture {
        let dir = fixture_root().join(config);
        let json = reference::read_reference_json(&dir.join(format!("reference{tag}.json")));
        let prompt = serde_json::from_value(json["prompt"]["token_ids"].clone()).expect("prompt");
        let vocab = json["config"]["vocab"].as_u64().expect("vocab") as usize;
        Fixture {
            config,
            tag,
            dir,
            json,
            prompt,
            vocab,
        }
    }

    pub fn all() -> Vec<Fixture> {
        CASES.iter().map(|&(c, t)| Fixture::load(c, t)).collect()
    }

    pub fn name(&self) -> String {
        format!("{}{}", self.config, self.tag)
    }

    /// The fixture's GGUF (its absence fails the test, naming the path).
    pub fn gguf(&self) -> PathBuf {
        let path = self.dir.join("model.gguf");
        assert!(
            path.is_file(),
            "reference file {} is missing",
            path.display()
        );
        path
    }

    fn f32_file(&self, stem: &str) -> Vec<f32> {
        let path = self.dir.join(format!("{stem}{}.f32", self.tag));
        reference::read_reference(&path)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    /// Prefill logits `[S, V]`.
    pub fn logits_all(&self) -> Vec<f32> {
        self.f32_file("logits_all")
    }

    /// The logits behind each greedy token `[16, V]`.
    pub fn greedy_logits(&self) -> Vec<f32> {
        self.f32_file("greedy_logits")
    }

    pub fn argmax(&self) -> Vec<u32> {
        serde_json::from_value(self.json["argmax"].clone()).expect("argmax")
    }

    pub fn greedy_tokens(&self) -> Vec<u32> {
        serde_json::from_value(self.json["greedy"]["tokens"].clone()).expect("greedy tokens")
    }

    pub fn logits_last(&self) -> Vec<f32> {
        serde_json::from_value(self.json["logits_last"].clone()).expect("logits_last")
    }

    /// `layers[l].last_position.streams`, flattened stream-major.
    pub fn layer_streams(&self, l: usize) -> Vec<f32> {
        let streams: Vec<Vec<f32>> =
            serde_json::from_value(self.json["layers"][l]["last_position"]["streams"].clone())
                .expect("streams");
        streams.concat()
    }

    pub fn floats(&self, v: &serde_json::Value) -> Vec<f64> {
        serde_json::from_value(v.clone()).expect("floats")
    }
}

/// Index of the largest value (ties: lowest index).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Largest |a - b|.
pub fn max_abs_diff<A: Copy + Into<f64>, B: Copy + Into<f64>>(a: &[A], b: &[B]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| ((*x).into() - (*y).into()).abs())
        .fold(0.0, f64::max)
}

/// Prefills fixture `f` on `device` (schedule checking on), then decodes
/// greedily one step ahead (`Model::decode_greedy`) and asserts the
/// reference's continuation and that every step was published.
pub fn check_greedy_one_step_ahead(f: &Fixture, device: weft::runtime::Device) {
    use weft::models::LogitRows;
    use weft::runtime::cache::ChunkPolicy;
    use weft::runtime::{DiagnosticsConfig, ExecutorConfig, GraphExecutor};
    let config = ExecutorConfig {
        threads: 2,
        diagnostics: DiagnosticsConfig::checked(),
        cuda: weft_testkit::require::cuda_config(),
        ..ExecutorConfig::default()
    };
    let mut exec = GraphExecutor::with_config(device, config).expect("executor");
    let model = weft::models::Model::load(&f.gguf(), &mut exec).expect("model");
    let mut cache = model.new_cache(&mut exec, 512, 512).expect("cache");
    let logits = model
        .prefill(
            &mut exec,
            &mut cache,
            &f.prompt,
            &ChunkPolicy::single(512),
            LogitRows::Last,
        )
        .expect("prefill");
    let want = f.greedy_tokens();
    assert_eq!(argmax(&logits), want[0], "{}: first token", f.name());
    let mut got = Vec::new();
    let produced = model
        .decode_greedy(&mut exec, &mut cache, want[0], want.len() - 1, &mut |t| {
            got.push(t);
            true
        })
        .expect("decode_greedy");
    assert_eq!(produced, want.len() - 1);
    assert_eq!(
        got,
        want[1..],
        "{} on {device}: greedy one step ahead",
        f.name()
    );
    assert_eq!(
        cache.position() as usize,
        f.prompt.len() + want.len() - 1,
        "{}: every step published",
        f.name()
    );
}
