//! DeepSeek-V4 on the CUDA backend against every fixture of
//! `tests/reference/dsv4_tiny/`: the same checks as `dsv4_forward.rs`
//! (argmax at every prompt position, logits within 1e-3 of the reference,
//! the 16-token greedy continuation through the decode path, one token per
//! step and one CUDA graph per step structure), and the distance to the CPU
//! backend on the same model. Prefill in one chunk and in several chunks.
//! Skipped with a message where CUDA is unavailable (CI has no GPU);
//! `WEFT_TEST_REQUIRE_CUDA=1` turns the skip into a failure (the device script).

mod dsv4_common;

use dsv4_common::{argmax, max_abs_diff, Fixture};
use weft::models::deepseek4::{DeepSeek4, LoadOptions};
use weft::models::gguf::GgufFile;
use weft::models::weights::WeightMap;
use weft::models::LogitRows;
use weft::runtime::cache::ChunkPolicy;
use weft::runtime::{Device, DiagnosticsConfig, ExecutorConfig, GraphExecutor, Numerics};

const TOL: f64 = 1e-3;

use weft_testkit::require::cuda_or_skip;

fn setup(f: &Fixture, device: Device, numerics: Numerics) -> (GraphExecutor, DeepSeek4, GgufFile) {
    let config = ExecutorConfig {
        threads: 2,
        numerics,
        cuda: weft_testkit::require::cuda_config(),
        // Every reused step plan is compared with a fresh fusion and schedule.
        diagnostics: DiagnosticsConfig::checked(),
        ..ExecutorConfig::default()
    };
    let mut exec = GraphExecutor::with_config(device, config).expect("executor");
    let file = GgufFile::open(&f.gguf()).expect("gguf");
    let weights = WeightMap::new(&file, &mut exec).expect("weights");
    let model = DeepSeek4::load(&weights, &mut exec, LoadOptions::default()).expect("model");
    (exec, model, file)
}

/// Prefill logits at every position, then the greedy continuation's tokens
/// and per-step logits.
fn run(
    f: &Fixture,
    device: Device,
    numerics: Numerics,
    policy: &ChunkPolicy,
) -> (Vec<f32>, Vec<u32>, Vec<Vec<f32>>) {
    let (mut exec, model, _file) = setup(f, device, numerics);
    let mut cache = model.new_cache(&mut exec, 512, 512).expect("cache");
    let logits = model
        .prefill(&mut exec, &mut cache, &f.prompt, policy, LogitRows::All)
        .expect("prefill");
    let first = argmax(&logits[(f.prompt.len() - 1) * f.vocab..]);
    let (tokens, steps) = model
        .greedy(&mut exec, &mut cache, first, f.greedy_tokens().len() - 1)
        .expect("greedy");
    (logits, tokens, steps)
}

#[test]
fn every_fixture_matches_the_reference_and_the_cpu_on_cuda() {
    if !cuda_or_skip() {
        return;
    }
    for f in Fixture::all() {
        let (v, s) = (f.vocab, f.prompt.len());
        let cpu = run(&f, Device::Cpu, Numerics::Exact, &ChunkPolicy::single(512));
        for (what, policy) in [
            ("one chunk", ChunkPolicy::single(512)),
            ("chunks of 16", ChunkPolicy::single(16)),
        ] {
            let (logits, tokens, steps) = run(&f, Device::Cuda(0), Numerics::Exact, &policy);
            let got_argmax: Vec<u32> = logits.chunks_exact(v).map(argmax).collect();
            assert_eq!(got_argmax, f.argmax(), "{} ({what}): argmax", f.name());
            let all = max_abs_diff(&logits, &f.logits_all());
            let last = max_abs_diff(&logits[(s - 1) * v..], &f.logits_last());
            let vs_cpu = max_abs_diff(&logits, &cpu.0);
            let want = f.greedy_tokens();
            assert_eq!(tokens, want[1..], "{} ({what}): greedy", f.name());
            let glog = f.greedy_logits();
            let (mut worst, mut worst_cpu) = (0f64, 0f64);
            for (j, step) in steps.iter().enumerate() {
                worst = worst.max(max_abs_diff(step, &glog[(j + 1) * v..(j + 2) * v]));
                worst_cpu = worst_cpu.max(max_abs_diff(step, &cpu.2[j]));
            }
            eprintln!(
                "{} ({what}) on CUDA: prefill max |dlogit| {all:.2e} vs the reference \
                 (last position {last:.2e}), {vs_cpu:.2e} vs the CPU; greedy {} tokens, \
                 max |dlogit| {worst:.2e} vs the reference, {worst_cpu:.2e} vs the CPU",
                f.name(),
                tokens.len() + 1
            );
            assert!(
                all < TOL,
                "{} ({what}): prefill logits differ by {all}",
                f.name()
            );
            assert!(
                worst < TOL,
                "{} ({what}): decode logits differ by {worst}",
                f.name()
            );
        }
    }
}

/// Numerics `fast` end to end: at every prompt position whose reference
/// top-2 margin exceeds 1e-3 the argmax is the reference's, and every logit
/// lies within 5e-3 of it, in one chunk and in chunks of 16. (The fixtures'
/// weights are F32, which the quantized tensor-core products do not take;
/// `kernels/tests/cuda_fast` checks those against the CPU.)
#[test]
fn every_fixture_in_fast_numerics_on_cuda_stays_near_the_reference() {
    if !cuda_or_skip() {
        return;
    }
    for f in Fixture::all() {
        let v = f.vocab;
        let want = f.logits_all();
        for (what, policy) in [
            ("one chunk", ChunkPolicy::single(512)),
            ("chunks of 16", ChunkPolicy::single(16)),
        ] {
            let started = std::time::Instant::now();
            let (logits, _, _) = run(&f, Device::Cuda(0), Numerics::Fast, &policy);
            eprintln!(
                "{} ({what}, fast): ran in {:.1?}",
                f.name(),
                started.elapsed()
            );
            let mut decided = 0;
            for (pos, (got, refr)) in logits.chunks_exact(v).zip(want.chunks_exact(v)).enumerate() {
                let mut sorted: Vec<f32> = refr.to_vec();
                sorted.sort_by(|a, b| b.total_cmp(a));
                if sorted[0] - sorted[1] > 1e-3 {
                    decided += 1;
                    assert_eq!(
                        argmax(got),
                        argmax(refr),
                        "{} ({what}, fast): argmax at position {pos}",
                        f.name()
                    );
                }
            }
            let all = max_abs_diff(&logits, &want);
            eprintln!(
                "{} ({what}) on CUDA, numerics fast: max |dlogit| {all:.2e} vs the reference; \
                 argmax equal at all {decided} positions with a top-2 margin above 1e-3",
                f.name()
            );
            assert!(
                all < 5e-3,
                "{} ({what}, fast): logits differ by {all}",
                f.name()
            );
        }
    }
}

/// Greedy decoding one step ahead on CUDA (each step embeds the previous
/// step's argmax from device memory, its CUDA graph replayed) gives the
/// reference's continuation on every fixture.
#[test]
fn greedy_decoding_one_step_ahead_on_cuda_matches_every_fixture() {
    if !cuda_or_skip() {
        return;
    }
    for f in Fixture::all() {
        dsv4_common::check_greedy_one_step_ahead(&f, Device::Cuda(0));
    }
}
