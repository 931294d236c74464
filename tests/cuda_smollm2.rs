//! SmolLM2 on the CUDA backend: greedy output identical to llama.cpp's
//! reference (and so to the CPU backend's), logits bit-identical to the
//! CPU's. Skipped with a message where CUDA is unavailable (CI has no GPU);
//! `WEFT_TEST_REQUIRE_CUDA=1` turns the skip into a failure (the device script).

mod common;

use weft::models::sampling::argmax;
use weft::models::{LogitRows, Model};
use weft::runtime::{Device, DiagnosticsConfig, ExecutorConfig, GraphExecutor};

use weft_testkit::require::cuda_or_skip;

fn load(device: Device) -> (GraphExecutor, Model) {
    let path = weft_testkit::require::fetch_config()
        .and_then(|c| {
            weft::models::fetch::ensure(&weft::models::fetch::SMOLLM2_135M_Q4_1, &c, &mut |_| {})
        })
        .expect("model");
    let config = ExecutorConfig {
        threads: 2,
        cuda: weft_testkit::require::cuda_config(),
        ..Default::default()
    };
    let mut exec = GraphExecutor::with_config(device, config).expect("executor");
    let model = Model::load(&path, &mut exec).expect("load");
    (exec, model)
}

/// Prefills `ids` on both executors, then decodes `steps` greedy tokens in
/// step (the CPU's argmax feeds both, so a tie cannot split them),
/// asserting bit-identical logits after the prefill and every step.
fn decode_in_step(
    (gpu, model): (&mut GraphExecutor, &Model),
    (cpu, cpu_model): (&mut GraphExecutor, &Model),
    ids: &[u32],
    capacity: u32,
    steps: usize,
) {
    let mut gc = model.new_cache(gpu, capacity, 512).expect("cache");
    let mut cc = cpu_model.new_cache(cpu, capacity, 512).expect("cache");
    let policy = model.chunk_policy();
    let mut lg = model
        .prefill(gpu, &mut gc, ids, &policy, LogitRows::Last)
        .expect("gpu prefill");
    let mut lc = cpu_model
        .prefill(cpu, &mut cc, ids, &policy, LogitRows::Last)
        .expect("cpu prefill");
    for k in 0..=steps {
        let differ = lg
            .iter()
            .zip(&lc)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "step {k} (position {}): logits differ",
            ids.len() + k
        );
        if k == steps {
            break;
        }
        let t = argmax(&lc) as u32;
        lg = model
            .step(gpu, &mut gc, &[t], LogitRows::Last)
            .expect("gpu decode");
        lc = cpu_model
            .step(cpu, &mut cc, &[t], LogitRows::Last)
            .expect("cpu decode");
    }
}

#[test]
fn greedy_on_cuda_matches_llama_cpp_and_the_cpu() {
    if !cuda_or_skip() {
        return;
    }
    let (mut gpu, model) = load(Device::Cuda(0));
    let (mut cpu, cpu_model) = load(Device::Cpu);
    for (i, (ids, want)) in common::reference_greedy_cases("smollm2.json")
        .into_iter()
        .enumerate()
    {
        let mut gc = model.new_cache(&mut gpu, 512, 512).expect("cache");
        let mut cc = cpu_model.new_cache(&mut cpu, 512, 512).expect("cache");
        let mut lg = model
            .prefill(
                &mut gpu,
                &mut gc,
                &ids,
                &model.chunk_policy(),
                LogitRows::Last,
            )
            .expect("gpu prefill");
        let lc = cpu_model
            .prefill(
                &mut cpu,
                &mut cc,
                &ids,
                &cpu_model.chunk_policy(),
                LogitRows::Last,
            )
            .expect("cpu prefill");
        let worst = lg
            .iter()
            .zip(&lc)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!("prompt {i}: max |cuda - cpu| = {worst}");
        let mut got = Vec::new();
        for k in 0..want.len() {
            let t = argmax(&lg) as u32;
            got.push(t);
            if k + 1 < want.len() {
                lg = model
                    .step(&mut gpu, &mut gc, &[t], LogitRows::Last)
                    .expect("gpu decode");
            }
        }
        assert_eq!(got, want, "prompt {i}: greedy on CUDA");
    }
    let stats = gpu.graph_stats().expect("cuda stats");
    eprintln!(
        "graphs: {} captured, {} replayed, {} eager",
        stats.0, stats.1, stats.2
    );
}

/// Greedy decoding one step ahead on CUDA (each step's argmax fed to the
/// next on the device): llama.cpp's continuations on the reference
/// prompts, and a 600-token decode (past both attention variants) with the
/// same ids as the CPU's one-step-ahead decode.
#[test]
fn pipelined_greedy_on_cuda_matches_llama_cpp_and_the_cpu() {
    if !cuda_or_skip() {
        return;
    }
    let (mut gpu, model) = load(Device::Cuda(0));
    let (mut cpu, cpu_model) = load(Device::Cpu);
    let cases = common::reference_greedy_cases("smollm2.json");
    let decode = |exec: &mut GraphExecutor, m: &Model, ids: &[u32], n: usize| {
        let (mut cache, logits) = common::prefilled(exec, m, 1024, ids);
        let first = argmax(&logits) as u32;
        let mut got = vec![first];
        m.decode_greedy(exec, &mut cache, first, n - 1, &mut |t| {
            got.push(t);
            true
        })
        .expect("decode");
        assert_eq!(cache.position() as usize, ids.len() + n - 1);
        got
    };
    for (i, (ids, want)) in cases.iter().enumerate() {
        let got = decode(&mut gpu, &model, ids, want.len());
        assert_eq!(&got, want, "prompt {i}: pipelined greedy on CUDA");
    }
    let ids = cases[1].0.clone();
    let before = gpu.graph_stats().expect("cuda stats");
    let g = decode(&mut gpu, &model, &ids, 600);
    let after = gpu.graph_stats().expect("cuda stats");
    let c = decode(&mut cpu, &cpu_model, &ids, 600);
    let first_diff = g.iter().zip(&c).position(|(a, b)| a != b);
    assert_eq!(first_diff, None, "600-token greedy: CUDA and CPU ids part");
    eprintln!(
        "600-token pipelined greedy: identical ids; graphs: {} captured, {} replayed, {} eager",
        after.0 - before.0,
        after.1 - before.1,
        after.2 - before.2
    );
}

/// A long greedy decode (past the 256- and 512-cell attention variants, so
/// one captured graph serves positions whose kernels choose differently on
/// the device): every step's logits identical to the CPU's.
#[test]
fn long_decode_on_cuda_is_bit_identical_to_the_cpu() {
    if !cuda_or_skip() {
        return;
    }
    let (mut gpu, model) = load(Device::Cuda(0));
    let (mut cpu, cpu_model) = load(Device::Cpu);
    let ids = common::reference_greedy_cases("smollm2.json")[0].0.clone();
    let steps = 700 - ids.len();
    decode_in_step(
        (&mut gpu, &model),
        (&mut cpu, &cpu_model),
        &ids,
        1024,
        steps,
    );
    let stats = gpu.graph_stats().expect("cuda stats");
    eprintln!(
        "{steps} steps; graphs: {} captured, {} replayed, {} eager",
        stats.0, stats.1, stats.2
    );
}

/// Traced decode on CUDA: every node of every command buffer gets a device
/// time on a stream track (events inside the graphs), the logits stay
/// bit-identical to the CPU's, and the profile says how nodes were timed.
#[test]
fn traced_decode_on_cuda_times_every_node_on_device_streams() {
    if !cuda_or_skip() {
        return;
    }
    let (mut gpu, model) = load(Device::Cuda(0));
    let (mut cpu, cpu_model) = load(Device::Cpu);
    let ids: Vec<u32> = (0..24).map(|i| 200 + 7 * i).collect();
    gpu.enable_trace();
    let steps = 6;
    decode_in_step((&mut gpu, &model), (&mut cpu, &cpu_model), &ids, 512, steps);
    let trace = gpu.take_trace();
    assert!(trace.streams >= 1, "no device stream tracks");
    let device: Vec<_> = trace.events.iter().filter(|e| e.track >= 1000).collect();
    // Every decode step's nodes (over 150) plus the prefill's.
    assert!(
        device.len() >= steps * 150,
        "only {} device node slices",
        device.len()
    );
    assert_eq!(device.len(), trace.nodes.len());
    for e in &device {
        assert!(
            e.dur_us.is_finite() && e.dur_us >= 0.0 && e.dur_us < 1e6,
            "node `{}`: device time {} us",
            e.name,
            e.dur_us
        );
    }
    // Device slices fall inside the traced run (on the host's timeline).
    let host_end = trace
        .events
        .iter()
        .filter(|e| e.track == 0)
        .map(|e| e.start_us + e.dur_us)
        .fold(0.0, f64::max);
    let first = device.iter().map(|e| e.start_us).fold(f64::MAX, f64::min);
    let last = device
        .iter()
        .map(|e| e.start_us + e.dur_us)
        .fold(0.0, f64::max);
    assert!(
        first > 0.0 && last <= host_end + 1e3,
        "device slices {first}..{last} us outside the host's 0..{host_end} us"
    );
    let json = trace.to_chrome_json();
    assert!(json.contains("device stream 0"));
    let profile = weft::runtime::Profile::from_trace(&trace, gpu.counters());
    let table = profile.table();
    assert!(table.contains("device events"), "{table}");
    eprintln!("{table}");
}

/// Decode steps reuse the first step's plan (fusion, schedule, graphs);
/// with schedule checking on, every reuse is compared against a fresh
/// fusion and schedule of the step (an error if they differ), and the
/// logits stay bit-identical to the CPU's.
#[test]
fn planned_decode_steps_equal_fresh_schedules_and_the_cpu() {
    if !cuda_or_skip() {
        return;
    }
    let path = weft_testkit::require::fetch_config()
        .and_then(|c| {
            weft::models::fetch::ensure(&weft::models::fetch::SMOLLM2_135M_Q4_1, &c, &mut |_| {})
        })
        .expect("model");
    let config = ExecutorConfig {
        diagnostics: DiagnosticsConfig::checked(),
        cuda: weft_testkit::require::cuda_config(),
        ..Default::default()
    };
    let mut gpu = GraphExecutor::with_config(Device::Cuda(0), config).expect("executor");
    let model = Model::load(&path, &mut gpu).expect("load");
    let (mut cpu, cpu_model) = load(Device::Cpu);
    let ids: Vec<u32> = (0..40).map(|i| 300 + 11 * i).collect();
    let before = gpu.counters();
    let steps = 24;
    decode_in_step((&mut gpu, &model), (&mut cpu, &cpu_model), &ids, 512, steps);
    let c = gpu.counters() - before;
    eprintln!(
        "{steps} decode steps: {} planned commits",
        c.planned_commits
    );
    // The first step runs eagerly, the second is captured (and planned),
    // every later one reuses the plan.
    assert!(
        c.planned_commits >= steps as u64 - 2,
        "only {} of {steps} steps reused the plan",
        c.planned_commits
    );
}
