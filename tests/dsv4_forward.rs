//! DeepSeek-V4 on weft (recorded graphs, CPU kernels, the cache module)
//! against every fixture of `tests/reference/dsv4_tiny/`: argmax at
//! every prompt position, logits at every position (the last one included)
//! within 1e-3, and the 16-token greedy continuation through the decode
//! path (one token per step through the cache), tokens identical and
//! logits within 1e-3.

mod dsv4_common;

use dsv4_common::{argmax, max_abs_diff, Fixture};
use weft::models::deepseek4::{DeepSeek4, LoadOptions};
use weft::models::gguf::GgufFile;
use weft::models::weights::WeightMap;
use weft::models::LogitRows;
use weft::runtime::cache::ChunkPolicy;
use weft::runtime::{Device, ExecutorConfig, GraphExecutor};

const TOL: f64 = 1e-3;

fn setup(f: &Fixture, threads: usize) -> (GraphExecutor, DeepSeek4, GgufFile) {
    let config = ExecutorConfig {
        threads,
        ..ExecutorConfig::default()
    };
    let mut exec = GraphExecutor::with_config(Device::Cpu, config).expect("executor");
    let file = GgufFile::open(&f.gguf()).expect("gguf");
    let weights = WeightMap::new(&file, &mut exec).expect("weights");
    let model = DeepSeek4::load(&weights, &mut exec, LoadOptions::default()).expect("model");
    (exec, model, file)
}

#[test]
fn prefill_and_greedy_decode_match_every_fixture() {
    for f in Fixture::all() {
        let (mut exec, model, _file) = setup(&f, 2);
        let v = f.vocab;
        let s = f.prompt.len();
        let mut cache = model.new_cache(&mut exec, 512, 512).expect("cache");
        let logits = model
            .prefill(
                &mut exec,
                &mut cache,
                &f.prompt,
                &ChunkPolicy::single(512),
                LogitRows::All,
            )
            .expect("prefill");
        let want = f.logits_all();
        let all = max_abs_diff(&logits, &want);
        let last = max_abs_diff(&logits[(s - 1) * v..], &f.logits_last());
        let got_argmax: Vec<u32> = logits.chunks_exact(v).map(argmax).collect();
        assert_eq!(
            got_argmax,
            f.argmax(),
            "{}: argmax per prompt position",
            f.name()
        );
        let tokens = f.greedy_tokens();
        assert_eq!(argmax(&logits[(s - 1) * v..]), tokens[0]);
        let (got, steps) = model
            .greedy(&mut exec, &mut cache, tokens[0], tokens.len() - 1)
            .expect("greedy");
        let glog = f.greedy_logits();
        let mut worst = 0f64;
        for (j, step) in steps.iter().enumerate() {
            worst = worst.max(max_abs_diff(step, &glog[(j + 1) * v..(j + 2) * v]));
        }
        eprintln!(
            "{}: prefill max |dlogit| {all:.2e} (last position {last:.2e}); greedy {} tokens, max |dlogit| {worst:.2e}",
            f.name(),
            got.len() + 1
        );
        assert_eq!(got, tokens[1..], "{}: greedy continuation", f.name());
        assert!(all < TOL, "{}: prefill logits differ by {all}", f.name());
        assert!(worst < TOL, "{}: decode logits differ by {worst}", f.name());
    }
}

/// A context shorter than the attention window (the ring then holds every
/// position) gives the same logits as a long one.
#[test]
fn a_context_shorter_than_the_window_gives_the_same_logits() {
    let f = &Fixture::load("flash-tiny", ""); // window 128
    let (mut exec, model, _file) = setup(f, 2);
    // 12 tokens: past one compressor window (8 positions with overlap);
    // 5: the compressor's ring (the context) is shorter than its window.
    for n in [12, 5] {
        short_context_case(&mut exec, &model, &f.prompt[..n]);
    }
}

fn short_context_case(exec: &mut GraphExecutor, model: &DeepSeek4, prompt: &[u32]) {
    let n = prompt.len();
    let mut logits = Vec::new();
    for context in [n as u32, 512] {
        let mut cache = model.new_cache(exec, context, context).expect("cache");
        logits.push(
            model
                .prefill(
                    exec,
                    &mut cache,
                    prompt,
                    &ChunkPolicy::single(context),
                    LogitRows::All,
                )
                .expect("prefill"),
        );
    }
    assert_eq!(logits[0], logits[1], "context {n} vs 512");
}

/// Greedy decoding one step ahead (`Model::decode_greedy`: each step embeds
/// the previous step's argmax from the device) gives the reference's
/// continuation on every fixture, with schedule checking on (every reused
/// step plan compared with a fresh one).
#[test]
fn greedy_decoding_one_step_ahead_matches_every_fixture() {
    for f in Fixture::all() {
        dsv4_common::check_greedy_one_step_ahead(&f, Device::Cpu);
    }
}
