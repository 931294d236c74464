//! Quantized matmul benchmarks at SmolLM2-135M sizes, with the machine's
//! memory bandwidth measured in the same run so the ratio is meaningful on
//! a shared, noisy machine.
//!
//! - `membw/{1,2}t`: sum of a 1 GiB buffer (read bandwidth).
//! - `decode_smollm2/{1,2}t`: one token through every matrix of SmolLM2
//!   (30 layers of Q4_1 576x576, 192x576 x2, 576x576, 1536x576 x2,
//!   576x1536, and the 49152x576 Q8_0 head): ~96 MB of weights, streamed.
//! - `decode/<fmt>/{1,2}t`: the same 30-layer set of shapes in one format.
//! - `prefill/<fmt>/{1,2}t`: 512 tokens through one layer's seven matrices.
//! - `decode_gemma3/{1,2}t`: one token through Gemma 3 270M Q4_K_M's
//!   matrices in their formats (18 layers of Q5_0 q/k/gate/up, Q5_0 or Q8_0
//!   v, Q4_K attention output, Q4_K or Q6_K down, and the 262144x640 Q8_0
//!   head: ~240 MB, the head ~178 MB of it); `decode_gemma3_head/{1,2}t`:
//!   the head alone.
//!
//! - `QUANT_BENCH_BATCH=1`: a batch decode step of 1 to 4 sequences
//!   through Qwen2.5-Coder-0.5B Q4_K_M's matrices, format by format, two
//!   threads: milliseconds per pass and the cost against one sequence.
//!
//! Threads split the weight rows (`OutColumns::split_at`), one
//! `std::thread::scope` per pass. `QUANT_BENCH_TABLE=1` prints a summary
//! table (best of several passes, ratios to the measured bandwidth) instead
//! of running criterion. `WEFT_CPU_ISA` picks the kernel path.

use criterion::{Criterion, Throughput};
use std::hint::black_box;
use std::time::{Duration, Instant};
use weft_kernels::cpu::quant::{self, OutColumns};
use weft_ops::quant::{quantize_row, vec_dot_type};
use weft_ops::DType;
use weft_testkit::Rng;

struct Matrix {
    dtype: DType,
    rows: usize,
    k: usize,
    data: Vec<u8>,
}

fn quantized(dtype: DType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; dtype.row_bytes(x.len()).unwrap_or(0)];
    quantize_row(dtype, x, &mut q).unwrap_or(());
    q
}

/// A matrix of real quantized rows (64 distinct ones, tiled: the content
/// does not change the speed).
fn matrix(rng: &mut Rng, dtype: DType, rows: usize, k: usize) -> Matrix {
    let distinct: Vec<Vec<u8>> = (0..64.min(rows))
        .map(|_| quantized(dtype, &rng.vec(k, 0.1)))
        .collect();
    let data = (0..rows)
        .flat_map(|r| distinct[r % distinct.len()].iter().copied())
        .collect();
    Matrix {
        dtype,
        rows,
        k,
        data,
    }
}

/// One layer of SmolLM2's projections with `k` rounded up for formats with
/// 256-element blocks.
fn layer_shapes(dtype: DType) -> Vec<(usize, usize)> {
    let (h, f) = if dtype.block_len() == 256 {
        (768, 1536)
    } else {
        (576, 1536)
    };
    vec![
        (h, h),
        (h / 3, h),
        (h / 3, h),
        (h, h),
        (f, h),
        (f, h),
        (h, f),
    ]
}

struct Model {
    mats: Vec<Matrix>,
    /// One activation row (or `n` rows) per distinct k.
    acts: Vec<(usize, Vec<u8>)>,
    n: usize,
}

impl Model {
    fn new(rng: &mut Rng, dtype: DType, layers: usize, head: bool, n: usize) -> Model {
        let mut mats = Vec::new();
        let shapes = layer_shapes(dtype);
        for _ in 0..layers {
            for &(rows, k) in &shapes {
                mats.push(matrix(rng, dtype, rows, k));
            }
        }
        if head {
            mats.push(matrix(rng, DType::Q8_0, 49152, 576));
        }
        Model::with_acts(rng, mats, n)
    }

    /// Activations for `mats` (`n` rows per distinct k and format).
    fn with_acts(rng: &mut Rng, mats: Vec<Matrix>, n: usize) -> Model {
        let mut acts: Vec<(usize, Vec<u8>)> = Vec::new();
        for m in &mats {
            let adtype = vec_dot_type(m.dtype);
            if !acts
                .iter()
                .any(|(k, a)| *k == m.k && a.len() == n * adtype.row_bytes(m.k).unwrap_or(0))
            {
                let rows: Vec<u8> = (0..n)
                    .flat_map(|_| quantized(adtype, &rng.vec(m.k, 0.1)))
                    .collect();
                acts.push((m.k, rows));
            }
        }
        Model { mats, acts, n }
    }

    /// Gemma 3 270M Q4_K_M's matrices (one token), optionally without the
    /// layers (the head alone).
    fn gemma3(rng: &mut Rng, layers: bool) -> Model {
        let (h, q, kv, f) = (640, 1024, 256, 2048);
        let mut mats = Vec::new();
        for l in 0..if layers { 18 } else { 0 } {
            let v = if l % 2 == 0 { DType::Q5_0 } else { DType::Q8_0 };
            let down = if l % 2 == 0 { DType::Q4_K } else { DType::Q6_K };
            mats.push(matrix(rng, DType::Q5_0, q, h));
            mats.push(matrix(rng, DType::Q5_0, kv, h));
            mats.push(matrix(rng, v, kv, h));
            mats.push(matrix(rng, DType::Q4_K, h, q));
            mats.push(matrix(rng, DType::Q5_0, f, h));
            mats.push(matrix(rng, DType::Q5_0, f, h));
            mats.push(matrix(rng, down, h, f));
        }
        mats.push(matrix(rng, DType::Q8_0, 262_144, h));
        Model::with_acts(rng, mats, 1)
    }

    fn weight_bytes(&self) -> u64 {
        self.mats.iter().map(|m| m.data.len() as u64).sum()
    }

    fn flops(&self) -> f64 {
        self.mats
            .iter()
            .map(|m| 2.0 * m.rows as f64 * m.k as f64 * self.n as f64)
            .sum()
    }

    fn act(&self, m: &Matrix) -> &[u8] {
        let want = self.n * vec_dot_type(m.dtype).row_bytes(m.k).unwrap_or(0);
        self.acts
            .iter()
            .find(|(k, a)| *k == m.k && a.len() == want)
            .map_or(&[], |(_, a)| a)
    }

    /// Every matrix once, rows split over `threads` threads.
    fn pass(&self, threads: usize, outs: &mut [Vec<f32>]) {
        std::thread::scope(|s| {
            let mut parts: Vec<Vec<(usize, OutColumns)>> =
                (0..threads).map(|_| Vec::new()).collect();
            for (i, (m, out)) in self.mats.iter().zip(outs.iter_mut()).enumerate() {
                let Ok(mut view) = OutColumns::new(out, self.n, m.rows) else {
                    continue;
                };
                for (t, part) in parts.iter_mut().enumerate().take(threads - 1) {
                    let (left, right) = view.split_at(m.rows * (t + 1) / threads);
                    part.push((i, left));
                    view = right;
                }
                parts[threads - 1].push((i, view));
            }
            for part in parts {
                s.spawn(move || {
                    for (i, mut view) in part {
                        let m = &self.mats[i];
                        let _ =
                            quant::matmul(m.dtype, &m.data, m.k, self.act(m), self.n, &mut view);
                    }
                });
            }
        });
    }

    fn outputs(&self) -> Vec<Vec<f32>> {
        self.mats
            .iter()
            .map(|m| vec![0f32; m.rows * self.n])
            .collect()
    }
}

/// Read bandwidth: sum a buffer much larger than the caches.
struct Bandwidth {
    buf: Vec<u64>,
}

impl Bandwidth {
    fn new() -> Bandwidth {
        let words = (1usize << 30) / 8;
        Bandwidth {
            buf: (0..words as u64)
                .map(|i| i.wrapping_mul(0x9E37_79B9))
                .collect(),
        }
    }
    fn bytes(&self) -> u64 {
        (self.buf.len() * 8) as u64
    }
    fn pass(&self, threads: usize) -> u64 {
        let chunk = self.buf.len().div_ceil(threads);
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .buf
                .chunks(chunk)
                .map(|c| {
                    s.spawn(move || {
                        c.chunks_exact(8).fold(0u64, |acc, w| {
                            acc.wrapping_add(w.iter().fold(0u64, |a, v| a ^ v))
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        })
    }
}

const FORMATS: [DType; 7] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q6_K,
    DType::F16,
];

fn criterion_benches(c: &mut Criterion) {
    let mut rng = Rng::from_state(0x1234_5678_9abc_def1);
    let bw = Bandwidth::new();
    let mut g = c.benchmark_group("membw");
    g.throughput(Throughput::Bytes(bw.bytes()));
    for t in [1, 2] {
        g.bench_function(format!("{t}t"), |b| b.iter(|| black_box(bw.pass(t))));
    }
    g.finish();
    drop(bw);

    let model = Model::new(&mut rng, DType::Q4_1, 30, true, 1);
    let mut outs = model.outputs();
    let mut g = c.benchmark_group("decode_smollm2");
    g.throughput(Throughput::Bytes(model.weight_bytes()));
    for t in [1, 2] {
        g.bench_function(format!("{t}t"), |b| b.iter(|| model.pass(t, &mut outs)));
    }
    g.finish();
    drop(model);

    for (name, layers) in [("decode_gemma3", true), ("decode_gemma3_head", false)] {
        let model = Model::gemma3(&mut rng, layers);
        let mut outs = model.outputs();
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Bytes(model.weight_bytes()));
        for t in [1, 2] {
            g.bench_function(format!("{t}t"), |b| b.iter(|| model.pass(t, &mut outs)));
        }
        g.finish();
    }

    for dtype in FORMATS {
        let model = Model::new(&mut rng, dtype, 30, false, 1);
        let mut outs = model.outputs();
        let mut g = c.benchmark_group(format!("decode/{dtype}"));
        g.throughput(Throughput::Bytes(model.weight_bytes()));
        for t in [1, 2] {
            g.bench_function(format!("{t}t"), |b| b.iter(|| model.pass(t, &mut outs)));
        }
        g.finish();
    }

    for dtype in FORMATS {
        let model = Model::new(&mut rng, dtype, 1, false, 512);
        let mut outs = model.outputs();
        let mut g = c.benchmark_group(format!("prefill/{dtype}"));
        g.throughput(Throughput::Elements(model.flops() as u64));
        for t in [1, 2] {
            g.bench_function(format!("{t}t"), |b| b.iter(|| model.pass(t, &mut outs)));
        }
        g.finish();
    }
}

/// Best of `reps` timings of `f`.
fn best(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn table() {
    let isa = quant::Isa::detect().map_or("?", |i| i.name());
    println!("quantized matmul summary (kernel path: {isa}; best of several passes)");
    let mut rng = Rng::from_state(0x1234_5678_9abc_def1);
    let bw = Bandwidth::new();
    let gbs = |bytes: u64, d: Duration| bytes as f64 / d.as_secs_f64() / 1e9;
    let bw_t: Vec<f64> = [1, 2]
        .iter()
        .map(|&t| {
            gbs(
                bw.bytes(),
                best(5, || {
                    black_box(bw.pass(t));
                }),
            )
        })
        .collect();
    drop(bw);
    println!(
        "memory read bandwidth: 1t {:.1} GB/s, 2t {:.1} GB/s",
        bw_t[0], bw_t[1]
    );

    let model = Model::new(&mut rng, DType::Q4_1, 30, true, 1);
    let mut outs = model.outputs();
    let mb = model.weight_bytes() as f64 / 1e6;
    for (i, t) in [1, 2].into_iter().enumerate() {
        let d = best(20, || model.pass(t, &mut outs));
        let g = gbs(model.weight_bytes(), d);
        println!(
            "decode SmolLM2 ({mb:.1} MB) {t}t: {:.2} ms/token = {:.0} tok/s (matmuls only), {g:.1} GB/s = {:.0}% of bandwidth",
            d.as_secs_f64() * 1e3,
            1.0 / d.as_secs_f64(),
            100.0 * g / bw_t[i]
        );
    }
    drop(model);

    // Eight copies of the layers (~600 MB): more than any L3 here, so the
    // weights really stream from DRAM.
    let model = Model::new(&mut rng, DType::Q4_1, 240, true, 1);
    let mut outs = model.outputs();
    let mb = model.weight_bytes() as f64 / 1e6;
    for (i, t) in [1, 2].into_iter().enumerate() {
        let g = gbs(model.weight_bytes(), best(5, || model.pass(t, &mut outs)));
        println!("decode 8x SmolLM2 layers ({mb:.0} MB, beyond L3) {t}t: {g:.1} GB/s = {:.0}% of bandwidth", 100.0 * g / bw_t[i]);
    }
    drop(model);

    for (name, layers) in [("Gemma 3 270M", true), ("Gemma 3 head", false)] {
        let model = Model::gemma3(&mut rng, layers);
        let mut outs = model.outputs();
        let mb = model.weight_bytes() as f64 / 1e6;
        for (i, t) in [1, 2].into_iter().enumerate() {
            let d = best(10, || model.pass(t, &mut outs));
            let g = gbs(model.weight_bytes(), d);
            println!(
                "decode {name} ({mb:.0} MB) {t}t: {:.2} ms/token, {g:.1} GB/s = {:.0}% of bandwidth",
                d.as_secs_f64() * 1e3,
                100.0 * g / bw_t[i]
            );
        }
    }

    println!(
        "{:<6} {:>9} {:>16} {:>16} {:>14} {:>14}",
        "format", "MB", "decode 1t GB/s", "decode 2t GB/s", "pp 1t GFLOP/s", "pp 2t GFLOP/s"
    );
    for dtype in FORMATS {
        let model = Model::new(&mut rng, dtype, 30, false, 1);
        let mut outs = model.outputs();
        let dec: Vec<f64> = [1, 2]
            .iter()
            .map(|&t| gbs(model.weight_bytes(), best(10, || model.pass(t, &mut outs))))
            .collect();
        let mb = model.weight_bytes() as f64 / 1e6;
        drop(model);
        let model = Model::new(&mut rng, dtype, 1, false, 512);
        let mut outs = model.outputs();
        let pp: Vec<f64> = [1, 2]
            .iter()
            .map(|&t| model.flops() / best(5, || model.pass(t, &mut outs)).as_secs_f64() / 1e9)
            .collect();
        println!(
            "{:<6} {mb:>9.1} {:>9.1} ({:>3.0}%) {:>9.1} ({:>3.0}%) {:>14.1} {:>14.1}",
            dtype.name(),
            dec[0],
            100.0 * dec[0] / bw_t[0],
            dec[1],
            100.0 * dec[1] / bw_t[1],
            pp[0],
            pp[1]
        );
    }
}

/// A batch decode step's products: `n` activation rows (1 to 4) through
/// Qwen2.5-Coder-0.5B Q4_K_M's matrices in their formats (24 layers of
/// Q5_0 q, k, o, gate and up, Q5_0 or Q8_0 v, Q4_K or Q6_K down, and the
/// 151936 x 896 Q8_0 head), then each format's matrices alone.
fn batch() {
    let mut rng = Rng::from_state(0x1234_5678_9abc_def1);
    let (h, kv, f) = (896, 128, 4864);
    let mut all = Vec::new();
    for l in 0..24 {
        let (v, down) = if l % 2 == 0 {
            (DType::Q5_0, DType::Q4_K)
        } else {
            (DType::Q8_0, DType::Q6_K)
        };
        for (dtype, rows, k) in [
            (DType::Q5_0, h, h),
            (DType::Q5_0, kv, h),
            (v, kv, h),
            (DType::Q5_0, h, h),
            (DType::Q5_0, f, h),
            (DType::Q5_0, f, h),
            (down, h, f),
        ] {
            all.push(matrix(&mut rng, dtype, rows, k));
        }
    }
    all.push(matrix(&mut rng, DType::Q8_0, 151_936, h));
    println!("batch decode, Qwen2.5-Coder-0.5B Q4_K_M's matrices, 2 threads, best of 5");
    let mut groups: Vec<(String, Vec<Matrix>)> = Vec::new();
    for dtype in [DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q6_K] {
        let (mine, rest): (Vec<Matrix>, Vec<Matrix>) =
            all.into_iter().partition(|m| m.dtype == dtype);
        all = rest;
        groups.push((dtype.name().to_string(), mine));
    }
    for (name, mats) in &mut groups {
        let mut one = None;
        let mut line = format!("{name:<6}");
        for n in 1..=4 {
            let m = Model::with_acts(&mut rng, std::mem::take(mats), n);
            let mut outs = m.outputs();
            let ms = best(5, || m.pass(2, &mut outs)).as_secs_f64() * 1e3;
            let base = *one.get_or_insert(ms);
            line += &format!("  n={n}: {ms:.2} ms ({:.2}x n=1)", ms / base);
            *mats = m.mats;
        }
        println!("{line}");
    }
}

/// Cache-resident single matrices, best of many short runs: the kernels'
/// compute throughput, robust to a loaded machine (short runs are rarely
/// preempted).
fn hot() {
    let mut rng = Rng::from_state(0x1234_5678_9abc_def1);
    for dtype in FORMATS {
        let (rows, k) = if dtype.block_len() == 256 {
            (1536, 768)
        } else {
            (1536, 576)
        };
        let mut line = format!("{:<6} {rows}x{k}:", dtype.name());
        for n in [1usize, 64] {
            let mut m = Model::new(&mut rng, dtype, 0, false, n);
            m.mats.push(matrix(&mut rng, dtype, rows, k));
            let adtype = vec_dot_type(dtype);
            m.acts = vec![(
                k,
                (0..n)
                    .flat_map(|_| quantized(adtype, &rng.vec(k, 0.1)))
                    .collect(),
            )];
            let mut outs = m.outputs();
            let mat = &m.mats[0];
            let act = m.act(mat).to_vec();
            let d = best(300, || {
                if let Ok(mut v) = OutColumns::new(&mut outs[0], n, rows) {
                    let _ = quant::matmul(dtype, &mat.data, k, &act, n, &mut v);
                }
            });
            if n == 1 {
                line += &format!(
                    " matvec {:.1} GB/s ({:.1} us)",
                    mat.data.len() as f64 / d.as_secs_f64() / 1e9,
                    d.as_secs_f64() * 1e6
                );
            } else {
                line += &format!(", n={n} {:.1} GFLOP/s", m.flops() / d.as_secs_f64() / 1e9);
            }
        }
        println!("{line}");
    }
}

/// Prefill of one 1536x576 Q4_1 matrix for 512 tokens on one thread, as
/// one call or as calls of `chunk` rows (how the runtime splits work):
/// shows the per-call cost of preparing the activations.
fn chunks() {
    let mut rng = Rng::from_state(0x1234_5678_9abc_def1);
    let (rows, k, n) = (1536, 576, 512);
    let mat = matrix(&mut rng, DType::Q4_1, rows, k);
    let act: Vec<u8> = (0..n)
        .flat_map(|_| quantized(DType::Q8_1, &rng.vec(k, 0.1)))
        .collect();
    let mut out = vec![0f32; rows * n];
    for chunk in [1536, 384, 128, 64, 36, 16] {
        let d = best(5, || {
            let Ok(mut view) = OutColumns::new(&mut out, n, rows) else {
                return;
            };
            while !view.cols().is_empty() {
                let start = view.cols().start;
                let (mut part, rest) = view.split_at(start + chunk);
                let _ = quant::matmul(DType::Q4_1, &mat.data, k, &act, n, &mut part);
                view = rest;
            }
        });
        let flops = 2.0 * (rows * k * n) as f64;
        println!(
            "q4_1 {rows}x{k} n={n}, calls of {chunk:>4} rows: {:.1} GFLOP/s",
            flops / d.as_secs_f64() / 1e9
        );
    }
}

fn main() {
    // The kernels read no environment: the bench applies `WEFT_CPU_ISA`.
    let cap =
        quant::Isa::from_env_value(std::env::var_os(quant::ISA_ENV)).and_then(quant::Isa::select);
    if let Err(e) = cap {
        eprintln!("{e}");
        std::process::exit(2);
    }
    if std::env::var("QUANT_BENCH_CHUNKS").is_ok_and(|v| v == "1") {
        chunks();
        return;
    }
    if std::env::var("QUANT_BENCH_BATCH").is_ok_and(|v| v == "1") {
        batch();
        return;
    }
    if std::env::var("QUANT_BENCH_HOT").is_ok_and(|v| v == "1") {
        hot();
        return;
    }
    if std::env::var("QUANT_BENCH_TABLE").is_ok_and(|v| v == "1") {
        table();
        return;
    }
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    criterion_benches(&mut c);
    c.final_summary();
}
