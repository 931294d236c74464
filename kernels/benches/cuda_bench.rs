//! Per-kernel timings on the GPU at SmolLM2-135M shapes: a benchmark, not
//! a test (it asserts nothing). Built with `cargo bench -p weft-kernels
//! --features cuda --no-run` (or `scripts/cuda/build-kernel-tests.sh`) and
//! run on the device by `scripts/cuda/run-kernel-tests.sh`; without a GPU
//! it says why and exits, `WEFT_TEST_CUDA_DRY_RUN=1` builds the cases only.
//! `WEFT_TEST_BENCH_FILTER=A,B` keeps the cases whose names contain A or B.
//!
//! Each kernel is captured `REPS` times into one CUDA graph as a serial
//! chain (as a decode step's dependent nodes are) and the graph is replayed;
//! the time per node includes the graph's per-node launch cost. Weights
//! rotate over enough copies to exceed the L2 cache, as a whole model's
//! weights do. Eager launch times (stream launches, no graph) are printed
//! beside them.

#[path = "../tests/cuda_common/mod.rs"]
mod cuda_common;

use cuda_common::*;
use std::sync::Arc;
use weft_kernels::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use weft_kernels::cuda::cudarc::driver::{CudaSlice, CudaStream};
use weft_kernels::cuda::DeviceTensor;
use weft_ops::reference::HostMemory;
use weft_ops::{AttentionParams, DType, Op, OpNode, RopeMode, RopeParams, Tensor};
use weft_testkit::host::quantized;

const REPS: usize = 200;
/// Bytes of weights to rotate over (several times the H200's 60 MB L2).
const ROTATE_BYTES: usize = 256 << 20;

struct Case {
    name: String,
    /// One node per weight copy (rotated through the graph).
    nodes: Vec<OpNode>,
    mem: HostMemory,
    /// Bytes a launch must move at least (for the bandwidth column).
    bytes: usize,
}

/// Whether `WEFT_TEST_BENCH_FILTER` (comma-separated parts of case names)
/// keeps the case `name`: cases it drops are never built (building the
/// large ones takes seconds each).
fn wanted(name: &str) -> bool {
    std::env::var("WEFT_TEST_BENCH_FILTER")
        .map_or(true, |f| f.split(',').any(|part| name.contains(part)))
}

impl Case {
    /// A case the filter dropped: no nodes, nothing timed.
    fn skipped(name: String) -> Case {
        Case {
            name,
            nodes: Vec::new(),
            mem: HostMemory::default(),
            bytes: 0,
        }
    }
}

fn matvec_case(rng: &mut Rng, wdtype: DType, m: usize, k: usize, n: usize) -> Case {
    let name = format!("matmul {wdtype} {m}x{k} n={n}");
    if !wanted(&name) {
        return Case::skipped(name);
    }
    let mut mem = HostMemory::default();
    let row: Vec<u8> = quantized(wdtype, &rng.rows(1, k));
    let wbytes = row.len() * m;
    let copies = if n == 1 {
        (ROTATE_BYTES / wbytes).clamp(1, REPS)
    } else {
        1
    };
    let adtype = weft_ops::quant::vec_dot_type(wdtype);
    let act: Vec<u8> = (0..n)
        .flat_map(|_| quantized(adtype, &rng.rows(1, k)))
        .collect();
    let x = mem.tensor(adtype, &[n, k], &act).unwrap();
    let o = mem.zeros(DType::F32, &[n, m]).unwrap();
    let mut nodes = Vec::new();
    for _ in 0..copies {
        let mut bytes = Vec::with_capacity(wbytes);
        for _ in 0..m {
            bytes.extend(quantized(wdtype, &rng.rows(1, k)));
        }
        let w = mem.tensor(wdtype, &[m, k], &bytes).unwrap();
        nodes.push(node(Op::MatMul, vec![x, w], vec![o]));
    }
    Case {
        name,
        nodes,
        mem,
        bytes: wbytes + act.len() + n * m * 4,
    }
}

/// A prefill chunk's routed-expert product: `n` tokens, six distinct
/// experts each out of `experts` (x shared by a token's slots), random
/// weight blocks.
fn expert_case(rng: &mut Rng, wdtype: DType, experts: usize, m: usize, k: usize, n: usize) -> Case {
    let name = format!("matmul_id {wdtype} {experts}x{m}x{k} n={n}");
    if !wanted(&name) {
        return Case::skipped(name);
    }
    use cuda_common::experts::{expert_weights, matmul_id_node, route, Route};
    let mut mem = HostMemory::default();
    let w = expert_weights(rng, &mut mem, wdtype, [experts, m, k], 0, true);
    let ids = route(rng, Route::Distinct, n, 6, experts);
    let nd = matmul_id_node(rng, &mut mem, w, &ids, n, false);
    let bytes = experts * m * wdtype.row_bytes(k).unwrap();
    Case {
        name,
        nodes: vec![nd],
        mem,
        bytes,
    }
}

/// The feed-forward's fused gate/up projection with silu_mul and quantize
/// (one decode token), weights rotated as in `matvec_case`.
fn gate_up_case(rng: &mut Rng, wdtype: DType, m: usize, k: usize) -> Case {
    let name = format!("gate_up+silu_mul+quantize {wdtype} {m}x{k} n=1");
    if !wanted(&name) {
        return Case::skipped(name);
    }
    let mut mem = HostMemory::default();
    let row_bytes = quantized(wdtype, &rng.rows(1, k)).len();
    let wbytes = 2 * row_bytes * m;
    let copies = (ROTATE_BYTES / wbytes).clamp(1, REPS);
    let adtype = weft_ops::quant::vec_dot_type(wdtype);
    let act = quantized(adtype, &rng.rows(1, k));
    let x = mem.tensor(adtype, &[1, k], &act).unwrap();
    let o = mem.zeros(DType::Q8_1, &[1, m]).unwrap();
    let mut nodes = Vec::new();
    for _ in 0..copies {
        let mut w = || {
            let bytes: Vec<u8> = (0..m)
                .flat_map(|_| quantized(wdtype, &rng.rows(1, k)))
                .collect();
            mem.tensor(wdtype, &[m, k], &bytes).unwrap()
        };
        let (wg, wu) = (w(), w());
        nodes.push(node(
            Op::MatMulSiluQuantize { up: true },
            vec![x, wg, wu],
            vec![o],
        ));
    }
    Case {
        name,
        nodes,
        mem,
        bytes: wbytes + act.len(),
    }
}

fn attention_case(rng: &mut Rng, n: usize, q_position: u32) -> Case {
    let (heads, kvh, d) = (9, 3, 64);
    let rows = q_position as usize + n;
    let name = format!("attention f16 n={n} at {q_position} ({rows} cached)");
    if !wanted(&name) {
        return Case::skipped(name);
    }
    let mut mem = HostMemory::default();
    let q = mem
        .f32_tensor(&[n, heads * d], &rng.vec(n * heads * d, 1.0))
        .unwrap();
    let k = mem.zeros(DType::F16, &[rows, kvh * d]).unwrap();
    let v = mem.zeros(DType::F16, &[rows, kvh * d]).unwrap();
    mem.set_f32(&k, &rng.vec(rows * kvh * d, 1.0)).unwrap();
    mem.set_f32(&v, &rng.vec(rows * kvh * d, 1.0)).unwrap();
    let o = mem.zeros(DType::F32, &[n, heads * d]).unwrap();
    let p = AttentionParams {
        heads,
        kv_heads: kvh,
        head_dim: d,
        scale: 0.125,
        q_position,
        window: None,
        ring: None,
        softcap: 0.0,
        kv_capacity: 0,
        flash: true,
    };
    Case {
        name,
        nodes: vec![node(Op::Attention(p), vec![q, k, v], vec![o])],
        mem,
        bytes: 2 * rows * kvh * d * 2,
    }
}

fn simple_case(name: &str, build: impl FnOnce(&mut HostMemory) -> (OpNode, usize)) -> Case {
    if !wanted(name) {
        return Case::skipped(name.to_string());
    }
    let mut mem = HostMemory::default();
    let (n, bytes) = build(&mut mem);
    Case {
        name: name.to_string(),
        nodes: vec![n],
        mem,
        bytes,
    }
}

/// One ready launch: the node, its device tensors, scratch and step buffers.
type Launch = (
    OpNode,
    Vec<DeviceTensor>,
    Vec<DeviceTensor>,
    CudaSlice<u8>,
    CudaSlice<u8>,
);

struct Prepared {
    dev: DevMem,
    launches: Vec<Launch>,
}

fn prepare(g: &Gpu, stream: &Arc<CudaStream>, case: &Case) -> Prepared {
    let mut all: Vec<Tensor> = Vec::new();
    for n in &case.nodes {
        all.extend(n.inputs.iter().chain(&n.outputs).copied());
    }
    let dev = DevMem::upload(stream, &case.mem, &all);
    let written: Vec<_> = case
        .nodes
        .iter()
        .flat_map(|n| n.outputs.iter().map(|t| t.buffer))
        .collect();
    let mut launches = Vec::new();
    for n in &case.nodes {
        g.kernels.prepare(n, stream).unwrap();
        // As a command buffer marks them (DeviceTensor::constant).
        let ins = n
            .inputs
            .iter()
            .map(|t| DeviceTensor {
                constant: !written.contains(&t.buffer),
                ..dev.tensor(stream, t)
            })
            .collect();
        let outs = n.outputs.iter().map(|t| dev.tensor(stream, t)).collect();
        let scratch = device_u8(stream, g.kernels.scratch_bytes(n));
        let mut s = g.kernels.step_scalars(n);
        s.resize(4, 0);
        let step = stream
            .clone_htod(bytemuck::cast_slice::<u32, u8>(&s))
            .unwrap();
        launches.push((n.clone(), ins, outs, scratch, step));
    }
    Prepared { dev, launches }
}

fn enqueue(g: &Gpu, stream: &Arc<CudaStream>, p: &Prepared, i: usize) {
    let (n, ins, outs, scratch, step) = &p.launches[i % p.launches.len()];
    // SAFETY: the tensors live in `p.dev`, sized by the kernels' answers.
    unsafe {
        g.kernels
            .launch(
                stream,
                n,
                ins,
                outs,
                ptr_of(stream, scratch),
                ptr_of(stream, step),
            )
            .unwrap();
    }
}

/// (graph µs per node, eager µs per launch)
fn time_case(g: &Gpu, case: &Case) -> (f64, f64) {
    let stream = g.stream();
    let p = prepare(g, &stream, case);
    let _keep = &p.dev;
    for i in 0..10 {
        enqueue(g, &stream, &p, i);
    }
    stream.synchronize().unwrap();
    let timing = Some(weft_kernels::cuda::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = g.ctx.new_event(timing).unwrap();
    let end = g.ctx.new_event(timing).unwrap();
    start.record(&stream).unwrap();
    for i in 0..REPS {
        enqueue(g, &stream, &p, i);
    }
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    let eager = start.elapsed_ms(&end).unwrap() as f64 * 1000.0 / REPS as f64;
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    for i in 0..REPS {
        enqueue(g, &stream, &p, i);
    }
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .unwrap()
        .unwrap();
    graph.launch().unwrap();
    stream.synchronize().unwrap();
    let mut best = f64::MAX;
    for _ in 0..5 {
        start.record(&stream).unwrap();
        graph.launch().unwrap();
        end.record(&stream).unwrap();
        end.synchronize().unwrap();
        best = best.min(start.elapsed_ms(&end).unwrap() as f64 * 1000.0 / REPS as f64);
    }
    (best, eager)
}

fn main() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(99);
    let mut cases = vec![
        matvec_case(&mut rng, DType::Q4_1, 576, 576, 1),
        matvec_case(&mut rng, DType::Q4_1, 192, 576, 1),
        matvec_case(&mut rng, DType::Q4_1, 1536, 576, 1),
        matvec_case(&mut rng, DType::Q4_1, 576, 1536, 1),
        matvec_case(&mut rng, DType::Q8_0, 49152, 576, 1),
        // Qwen2.5-0.5B's and Gemma 3 270M's decode shapes.
        matvec_case(&mut rng, DType::Q5_0, 896, 896, 1),
        matvec_case(&mut rng, DType::Q5_0, 4864, 896, 1),
        matvec_case(&mut rng, DType::Q4_K, 896, 4864, 1),
        matvec_case(&mut rng, DType::Q6_K, 896, 4864, 1),
        matvec_case(&mut rng, DType::Q4_K, 640, 2048, 1),
        matvec_case(&mut rng, DType::Q6_K, 640, 2048, 1),
        matvec_case(&mut rng, DType::Q4_K, 640, 1024, 1),
        gate_up_case(&mut rng, DType::Q4_1, 1536, 576),
        attention_case(&mut rng, 1, 63),
        attention_case(&mut rng, 1, 255),
        attention_case(&mut rng, 1, 1023),
    ];
    let d = 576;
    let x1 = rng.rows(1, 1536);
    cases.push(simple_case("rms_norm 1x576", |m| {
        let x = m.f32_tensor(&[1, d], &x1[..d]).unwrap();
        let w = m.f32_tensor(&[d], &x1[..d]).unwrap();
        let o = m.zeros(DType::F32, &[1, d]).unwrap();
        (
            node(Op::RmsNorm { eps: 1e-5 }, vec![x, w], vec![o]),
            3 * d * 4,
        )
    }));
    cases.push(simple_case(
        "rms_norm 1x576 of ones (sequential fallback)",
        |m| {
            let ones = vec![1.0f32; d];
            let x = m.f32_tensor(&[1, d], &ones).unwrap();
            let w = m.f32_tensor(&[d], &ones).unwrap();
            let o = m.zeros(DType::F32, &[1, d]).unwrap();
            (
                node(Op::RmsNorm { eps: 1e-5 }, vec![x, w], vec![o]),
                3 * d * 4,
            )
        },
    ));
    cases.push(simple_case("rms_norm+quantize q8_1 1x576 (fused)", |m| {
        let x = m.f32_tensor(&[1, d], &x1[..d]).unwrap();
        let w = m.f32_tensor(&[d], &x1[..d]).unwrap();
        let o = m.zeros(DType::Q8_1, &[1, d]).unwrap();
        (
            node(Op::RmsNormQuantize { eps: 1e-5 }, vec![x, w], vec![o]),
            2 * d * 4 + 18 * 36,
        )
    }));
    cases.push(simple_case(
        "add+rms_norm+quantize q8_1 1x576 (fused, in place)",
        |m| {
            let x = m.f32_tensor(&[1, d], &x1[..d]).unwrap();
            let b = m.f32_tensor(&[1, d], &x1[d..2 * d]).unwrap();
            let w = m.f32_tensor(&[d], &x1[..d]).unwrap();
            let o = m.zeros(DType::Q8_1, &[1, d]).unwrap();
            (
                node(
                    Op::AddRmsNormQuantize { eps: 1e-5 },
                    vec![x, b, w],
                    vec![x, o],
                ),
                4 * d * 4 + 18 * 36,
            )
        },
    ));
    cases.push(simple_case("silu_mul+quantize q8_1 1x1536 (fused)", |m| {
        let a = m.f32_tensor(&[1, 1536], &x1).unwrap();
        let b = m.f32_tensor(&[1, 1536], &x1).unwrap();
        let o = m.zeros(DType::Q8_1, &[1, 1536]).unwrap();
        (
            node(Op::SiluMulQuantize, vec![a, b], vec![o]),
            2 * 1536 * 4 + 48 * 36,
        )
    }));
    cases.push(simple_case("quantize q8_1 1x576", |m| {
        let x = m.f32_tensor(&[1, d], &x1[..d]).unwrap();
        let o = m.zeros(DType::Q8_1, &[1, d]).unwrap();
        (node(Op::QuantizeRows, vec![x], vec![o]), d * 4 + 18 * 36)
    }));
    cases.push(simple_case("silu_mul 1x1536", |m| {
        let a = m.f32_tensor(&[1, 1536], &x1).unwrap();
        let b = m.f32_tensor(&[1, 1536], &x1).unwrap();
        let o = m.zeros(DType::F32, &[1, 1536]).unwrap();
        (node(Op::SiluMul, vec![a, b], vec![o]), 3 * 1536 * 4)
    }));
    cases.push(simple_case("add 1x576", |m| {
        let a = m.f32_tensor(&[1, d], &x1[..d]).unwrap();
        let b = m.f32_tensor(&[1, d], &x1[..d]).unwrap();
        let o = m.zeros(DType::F32, &[1, d]).unwrap();
        (node(Op::Add, vec![a, b], vec![o]), 3 * d * 4)
    }));
    cases.push(simple_case("rope 1x576 (9 heads)", |m| {
        let x = m.f32_tensor(&[1, d], &x1[..d]).unwrap();
        let p = m
            .tensor(DType::I32, &[1], bytemuck::cast_slice(&[300i32]))
            .unwrap();
        let o = m.zeros(DType::F32, &[1, d]).unwrap();
        let rp = RopeParams::plain(RopeMode::Normal, 64, 64, 100000.0);
        (node(Op::Rope(rp), vec![x, p], vec![o]), 2 * d * 4)
    }));
    cases.push(simple_case("set_rows f16 1x192", |m| {
        let x = m.f32_tensor(&[1, 192], &x1[..192]).unwrap();
        let c = m.zeros(DType::F16, &[1024, 192]).unwrap();
        (
            node(
                Op::SetRows {
                    start: 300,
                    ring: None,
                },
                vec![x],
                vec![c],
            ),
            192 * 6,
        )
    }));
    cases.push(simple_case("argmax 1x49152", |m| {
        let v: Vec<f32> = (0..49152).map(|i| ((i * 7919) % 10007) as f32).collect();
        let x = m.f32_tensor(&[1, 49152], &v).unwrap();
        let o = m.zeros(DType::I32, &[1]).unwrap();
        (node(Op::Argmax, vec![x], vec![o]), 49152 * 4)
    }));
    // prefill 512
    let n = 512;
    let xp = rng.rows(n, d);
    cases.push(matvec_case(&mut rng, DType::Q4_1, 192, 576, n));
    cases.push(simple_case("rms_norm 512x576", |m| {
        let x = m.f32_tensor(&[n, d], &xp).unwrap();
        let w = m.f32_tensor(&[d], &xp[..d]).unwrap();
        let o = m.zeros(DType::F32, &[n, d]).unwrap();
        (
            node(Op::RmsNorm { eps: 1e-5 }, vec![x, w], vec![o]),
            2 * n * d * 4,
        )
    }));
    cases.push(simple_case("quantize q8_1 512x576", |m| {
        let x = m.f32_tensor(&[n, d], &xp).unwrap();
        let o = m.zeros(DType::Q8_1, &[n, d]).unwrap();
        (
            node(Op::QuantizeRows, vec![x], vec![o]),
            n * d * 4 + n * 18 * 36,
        )
    }));
    cases.push(simple_case("rope 512x576", |m| {
        let x = m.f32_tensor(&[n, d], &xp).unwrap();
        let pos: Vec<i32> = (0..n as i32).collect();
        let p = m
            .tensor(DType::I32, &[n], bytemuck::cast_slice(&pos))
            .unwrap();
        let o = m.zeros(DType::F32, &[n, d]).unwrap();
        let rp = RopeParams::plain(RopeMode::Normal, 64, 64, 100000.0);
        (node(Op::Rope(rp), vec![x, p], vec![o]), 2 * n * d * 4)
    }));
    // Prefill products of every format the tensor-core kernel takes
    // (SmolLM2's, Gemma 3's and Qwen2.5's shapes) and attention at depth,
    // timed in both numerics modes below.
    let mut prefill = vec![
        matvec_case(&mut rng, DType::Q4_1, 576, 576, n),
        matvec_case(&mut rng, DType::Q4_1, 1536, 576, n),
        matvec_case(&mut rng, DType::Q4_1, 576, 1536, n),
        matvec_case(&mut rng, DType::Q4_1, 576, 576, 4096),
        matvec_case(&mut rng, DType::Q4_0, 1536, 576, n),
        matvec_case(&mut rng, DType::Q5_0, 1536, 576, n),
        matvec_case(&mut rng, DType::Q8_0, 1536, 576, n),
        matvec_case(&mut rng, DType::Q5_0, 2048, 640, n),
        matvec_case(&mut rng, DType::Q8_0, 2048, 640, n),
        matvec_case(&mut rng, DType::Q4_K, 640, 2048, n),
        matvec_case(&mut rng, DType::Q6_K, 640, 2048, n),
        matvec_case(&mut rng, DType::Q4_K, 896, 4864, n),
        // DeepSeek-V4's f16 matrices at a 512-token chunk: the indexer's
        // query (8192 x 1024), a compressor (1024 x 4096), the
        // hyper-connection mixer (24 x 16384); a bf16 one.
        matvec_case(&mut rng, DType::F16, 8192, 1024, n),
        matvec_case(&mut rng, DType::F16, 1024, 4096, n),
        matvec_case(&mut rng, DType::F16, 24, 16384, n),
        matvec_case(&mut rng, DType::BF16, 1024, 4096, n),
        // DeepSeek-V4's routed experts (gate/up 2048 x 4096, down 4096 x
        // 2048) over a 512-token chunk, 16 and 64 experts.
        expert_case(&mut rng, DType::IQ2_XXS, 16, 2048, 4096, n),
        expert_case(&mut rng, DType::Q2_K, 16, 4096, 2048, n),
        expert_case(&mut rng, DType::MXFP4, 16, 2048, 4096, n),
        expert_case(&mut rng, DType::Q4_K, 16, 4096, 2048, n),
        expert_case(&mut rng, DType::IQ2_XXS, 64, 2048, 4096, n),
        attention_case(&mut rng, n, 0),
        attention_case(&mut rng, 4096, 0),
        attention_case(&mut rng, 1, 4095),
        attention_case(&mut rng, 1, 16383),
    ];
    cases.retain(|c| !c.nodes.is_empty());
    prefill.retain(|c| !c.nodes.is_empty());
    let Some(g) = g else {
        println!("dry run: {} cases built", cases.len());
        return;
    };
    println!();
    println!(
        "{:<52} {:>10} {:>10} {:>8}",
        "kernel", "graph µs", "eager µs", "GB/s"
    );
    for case in &cases {
        let (graph, eager) = time_case(g, case);
        let gbs = case.bytes as f64 / (graph * 1e-6) / 1e9;
        println!(
            "{:<52} {:>10.2} {:>10.2} {:>8.0}",
            case.name, graph, eager, gbs
        );
    }
    let fast = Gpu {
        ctx: g.ctx.clone(),
        kernels: weft_kernels::cuda::CudaKernels::with_numerics(
            g.ctx.clone(),
            std::env::var_os("WEFT_CUDA_PTX_CACHE")
                .map(std::path::PathBuf::from)
                .as_deref(),
            weft_kernels::Numerics::Fast,
        )
        .unwrap(),
    };
    for case in &prefill {
        for (mode, gpu) in [("exact", g), ("fast", &fast)] {
            let (graph, eager) = time_case(gpu, case);
            let gbs = case.bytes as f64 / (graph * 1e-6) / 1e9;
            let name = format!("{} [{mode}]", case.name);
            println!("{name:<52} {graph:>10.2} {eager:>10.2} {gbs:>8.0}");
        }
    }
    // What a persistent decode kernel would pay per level instead of a
    // kernel boundary: a grid-wide wait of one block per SM (and fewer).
    let sms = g
        .kernels
        .context()
        .attribute(
            weft_kernels::cuda::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .unwrap() as u32;
    let stream = g.stream();
    for blocks in [sms, sms / 2, 16] {
        let us = weft_kernels::cuda::testing::grid_barrier_us(&g.kernels, &stream, blocks, 20_000)
            .unwrap();
        let name = format!("grid-wide wait, {blocks} blocks of 64 ({sms} SMs)");
        println!("{name:<52} {us:>10.2}");
    }
}
