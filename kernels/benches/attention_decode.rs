//! Decode attention on the CPU, exact against fast numerics, at the cache
//! depths users reach: one query row against 256 to 16,384 cached cells of
//! an f16 cache, in SmolLM2-135M's shape (9 query heads, 3 KV heads, head
//! size 64) and Gemma 3 270M's (4 query heads, 1 KV head, head size 256).
//!
//! Prints one table: microseconds per attention node (best of several
//! passes, so a noisy machine's slow passes drop out), the cache bytes read
//! per microsecond, and fast's speed-up over exact. Threads claim work items
//! from one counter, as the runtime's workers do. `WEFT_TEST_BENCH_FILTER`
//! keeps the rows whose name contains one of its comma-separated words;
//! `WEFT_CPU_ISA` caps the instruction set (`avx2` times the AVX2 path on
//! an AVX-512 machine, `scalar` the portable one).

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Instant;
use weft_kernels::cpu::{self, HostTensor};
use weft_kernels::Numerics;
use weft_ops::reference::HostMemory;
use weft_ops::{AttentionParams, DType, Op, OpNode, Tensor};
use weft_testkit::host::node;
use weft_testkit::Rng;

struct Shape {
    name: &'static str,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

const SHAPES: [Shape; 2] = [
    Shape {
        name: "smollm2",
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
    },
    Shape {
        name: "gemma3",
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
    },
];

/// One attention node over `cells` cached cells with its memory.
fn case(rng: &mut Rng, s: &Shape, cells: usize) -> (OpNode, HostMemory) {
    let mut mem = HostMemory::default();
    let (h, kvh, d) = (s.heads, s.kv_heads, s.head_dim);
    let q = mem.f32_tensor(&[1, h * d], &rng.vec(h * d, 1.0)).unwrap();
    let k = mem.zeros(DType::F16, &[cells, kvh * d]).unwrap();
    let v = mem.zeros(DType::F16, &[cells, kvh * d]).unwrap();
    mem.set_f32(&k, &rng.vec(cells * kvh * d, 1.0)).unwrap();
    mem.set_f32(&v, &rng.vec(cells * kvh * d, 1.0)).unwrap();
    let o = mem.zeros(DType::F32, &[1, h * d]).unwrap();
    let params = AttentionParams {
        heads: h,
        kv_heads: kvh,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        q_position: cells as u32 - 1,
        window: None,
        ring: None,
        softcap: 0.0,
        kv_capacity: 0,
        flash: true,
    };
    (node(Op::Attention(params), vec![q, k, v], vec![o]), mem)
}

fn resolve(mem: &mut HostMemory, t: &Tensor) -> HostTensor {
    HostTensor {
        ptr: mem
            .bytes_mut(&Tensor { offset: 0, ..*t })
            .as_mut_ptr()
            .wrapping_add(t.offset as usize),
        tensor: *t,
    }
}

/// Best microseconds per node over `passes` passes of `reps` runs each.
fn time(node: &OpNode, mem: &mut HostMemory, threads: usize, numerics: Numerics) -> f64 {
    let ins: Vec<HostTensor> = node.inputs.iter().map(|t| resolve(mem, t)).collect();
    let outs: Vec<HostTensor> = node.outputs.iter().map(|t| resolve(mem, t)).collect();
    let split = cpu::work_split_for(node, threads, numerics);
    let (passes, reps) = (7, 20);
    let start = Barrier::new(threads);
    let end = Barrier::new(threads);
    let next = AtomicUsize::new(0);
    let mut best = f64::INFINITY;
    // One run of the node: every worker claims items until none are left.
    let run_once = || {
        start.wait();
        loop {
            let item = next.fetch_add(1, Ordering::AcqRel);
            if item >= split.items {
                break;
            }
            // SAFETY: the tensors live in `mem` for the whole scope; each
            // item is run once per run.
            unsafe { cpu::run_item(node, &ins, &outs, &split, item) }.expect("attention item");
        }
        if end.wait().is_leader() {
            next.store(0, Ordering::Release);
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(|| (0..passes * reps).for_each(|_| run_once()));
        }
        // This thread is a worker too, and keeps the time.
        for _ in 0..passes {
            let t0 = Instant::now();
            (0..reps).for_each(|_| run_once());
            best = best.min(t0.elapsed().as_secs_f64() * 1e6 / reps as f64);
        }
    });
    black_box(&outs);
    best
}

fn main() {
    // The kernels read no environment: the bench applies `WEFT_CPU_ISA`.
    let cap = cpu::quant::Isa::from_env_value(std::env::var_os(cpu::quant::ISA_ENV))
        .and_then(cpu::quant::Isa::select);
    if let Err(e) = cap {
        eprintln!("{e}");
        std::process::exit(2);
    }
    // `cargo bench` passes `--bench`; nothing else is read from the args.
    let filter: Vec<String> = std::env::var("WEFT_TEST_BENCH_FILTER")
        .map(|f| f.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let mut rng = Rng::new(5);
    println!(
        "{:<22} {:>7} {:>11} {:>11} {:>9} {:>8}",
        "shape", "threads", "exact us", "fast us", "fast GB/s", "speed-up"
    );
    for s in &SHAPES {
        for cells in [256, 1024, 4096, 16384] {
            let name = format!("{} {cells}", s.name);
            if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
                continue;
            }
            let (node, mut mem) = case(&mut rng, s, cells);
            let bytes = 2.0 * (cells * s.kv_heads * s.head_dim * 2) as f64;
            for threads in [1, 2] {
                let exact = time(&node, &mut mem, threads, Numerics::Exact);
                let fast = time(&node, &mut mem, threads, Numerics::Fast);
                println!(
                    "{name:<22} {threads:>7} {exact:>11.1} {fast:>11.1} {:>9.2} {:>7.2}x",
                    bytes / fast / 1e3,
                    exact / fast
                );
            }
        }
    }
}
