//! The MoE ops (routing, expert weights, clamped SwiGLU, combination) on
//! CUDA against the CPU kernels. Routing ids, SwiGLU and the combination
//! must be bit-exact; the expert weights go through the f64 router score,
//! whose exp and log1p are CUDA's on the device and glibc's on the CPU, so
//! they are held to 2 f32 ulp (see `WEIGHT_ULPS`).

use super::cuda_common::*;
use weft_ops::reference::HostMemory;
use weft_ops::{DType, Op, OpError, OpNode, Tensor};
use weft_ops::{MoeRouteParams, MoeSelect, MoeWeightsParams};

/// Router shapes `(tokens, experts, k)`: DeepSeek-V4 (256 experts, 6 used)
/// at decode and prefill, the small configurations (8 experts k 2, 64
/// experts k 6), and expert counts that are not multiples of 32.
const ROUTE_SHAPES: [(usize, usize, usize); 9] = [
    (1, 256, 6),
    (100, 256, 6),
    (1, 8, 2),
    (37, 8, 2),
    (1, 64, 6),
    (45, 64, 6),
    (13, 200, 8),
    (3, 72, 5),
    (2, 1000, 6),
];

/// Largest distance in f32 ulp allowed between the CUDA and CPU expert
/// weights: the f64 score (CUDA's exp and log1p, each within 1 ulp, against
/// glibc's) can differ in its last bits, which moves the f32 score, and
/// then the weight, by at most one rounding each.
const WEIGHT_ULPS: u64 = 2;

fn i32_tensor(mem: &mut HostMemory, dims: &[usize], values: &[i32]) -> Tensor {
    mem.tensor(DType::I32, dims, bytemuck::cast_slice(values))
        .unwrap()
}

fn i32s(bytes: &[u8]) -> Vec<i32> {
    bytemuck::pod_collect_to_vec(bytes)
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(bytes)
}

/// Runs `node` on both backends (outputs poisoned first), asserts the bits
/// are the same and returns the CPU's output.
fn exact(g: Option<&Gpu>, what: &str, node: &OpNode, mem: &mut HostMemory) -> Vec<u8> {
    poison_outputs(node, mem);
    let want = run_cpu(node, mem);
    let got = run_gpu(g, node, mem);
    assert_same(what, node.outputs[0].dtype, &got[0], &want[0]);
    want[0].clone()
}

/// The CPU kernel's result (in one piece), errors included.
fn try_cpu(node: &OpNode, mem: &HostMemory) -> Result<(), OpError> {
    weft_testkit::host::try_run_cpu(node, mem, 1, weft_kernels::Numerics::Exact).map(drop)
}

/// A top-k routing node over `logits [n, experts]` and `bias [experts]`.
fn top_k_node(mem: &mut HostMemory, n: usize, k: usize, logits: &[f32], bias: &[f32]) -> OpNode {
    let experts = bias.len();
    let l = mem.f32_tensor(&[n, experts], logits).unwrap();
    let b = mem.f32_tensor(&[experts], bias).unwrap();
    let o = mem.zeros(DType::I32, &[n, k]).unwrap();
    node(
        Op::MoeRoute(MoeRouteParams {
            k,
            select: MoeSelect::TopK,
        }),
        vec![l, b],
        vec![o],
    )
}

#[test]
fn moe_route_top_k_picks_the_cpu_experts() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(71);
    for (n, experts, k) in ROUTE_SHAPES {
        // Scale 4: every logit through exp/log1p; scale 40: some past the
        // softplus cut at 30 as well.
        for scale in [4.0, 40.0] {
            let mut mem = HostMemory::default();
            let logits = rng.vec(n * experts, scale);
            let bias = rng.vec(experts, 0.5);
            let nd = top_k_node(&mut mem, n, k, &logits, &bias);
            let what = format!("moe_route top-{k} of {n}x{experts} (logits ±{scale})");
            let ids = i32s(&exact(g, &what, &nd, &mut mem));
            // The CPU's own answer is sane: distinct ids in range per token.
            for row in ids.chunks(k) {
                let mut seen = row.to_vec();
                seen.sort_unstable();
                seen.dedup();
                assert_eq!(seen.len(), k, "{what}: repeated expert in {row:?}");
                assert!(row.iter().all(|&e| (0..experts as i32).contains(&e)));
            }
        }
    }
}

#[test]
fn moe_route_ties_go_to_the_lower_expert() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(72);
    let case = |what: &str, n: usize, k: usize, logits: Vec<f32>, bias: Vec<f32>| {
        let mut mem = HostMemory::default();
        let nd = top_k_node(&mut mem, n, k, &logits, &bias);
        i32s(&exact(g, &format!("moe_route ties: {what}"), &nd, &mut mem))
    };
    // Every score equal: the first k experts, in id order.
    let ids = case("all equal", 2, 6, vec![0.25; 2 * 256], vec![0.125; 256]);
    assert_eq!(ids, [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]);
    let ids = case("8 experts equal", 1, 2, vec![-1.5; 8], vec![0.5; 8]);
    assert_eq!(ids, [0, 1]);
    // Equal logits in groups (through exp/log1p): the best group, lowest ids first.
    let logits: Vec<f32> = (0..3 * 256).map(|i| ((i % 256) % 4) as f32).collect();
    let ids = case("groups of 4", 3, 6, logits, vec![0.01; 256]);
    assert_eq!(ids[..6], [3, 7, 11, 15, 19, 23]);
    assert_eq!(ids[6..12], ids[..6]);
    // Equal biased scores from different logits and biases: past the
    // softplus cut the score is sqrt(x), so sqrt(36) + 0 = sqrt(49) - 1 =
    // ... = 6.0 exactly on both sides. Seven experts tie; the rest score
    // below 1.8.
    let mut logits = rng.vec(64, 2.0);
    let mut bias = vec![0.25f32; 64];
    for (i, e) in [40usize, 17, 60, 5, 33, 31, 3].into_iter().enumerate() {
        let root = 6 + i;
        logits[e] = (root * root) as f32;
        bias[e] = -(i as f32);
    }
    let ids = case("sqrt ties", 1, 6, logits, bias);
    assert_eq!(ids, [3, 5, 17, 31, 33, 40]);
}

#[test]
fn moe_route_hash_reads_the_table_by_token() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(73);
    // (tokens, vocabulary, k, experts); 129280 is DeepSeek-V4's vocabulary.
    for (n, vocab, k, experts) in [
        (1, 1000, 6, 256),
        (100, 1000, 6, 256),
        (37, 129_280, 6, 256),
        (9, 50, 2, 8),
    ] {
        let mut mem = HostMemory::default();
        let logits = mem
            .f32_tensor(&[n, experts], &rng.vec(n * experts, 4.0))
            .unwrap();
        let table: Vec<i32> = (0..vocab * k).map(|_| rng.below(experts) as i32).collect();
        let table = i32_tensor(&mut mem, &[vocab, k], &table);
        let tokens: Vec<i32> = (0..n).map(|_| rng.below(vocab) as i32).collect();
        let tokens = i32_tensor(&mut mem, &[n], &tokens);
        let o = mem.zeros(DType::I32, &[n, k]).unwrap();
        let nd = node(
            Op::MoeRoute(MoeRouteParams {
                k,
                select: MoeSelect::Hash,
            }),
            vec![logits, table, tokens],
            vec![o],
        );
        exact(
            g,
            &format!("moe_route hash, {n} tokens of {vocab}, k {k}"),
            &nd,
            &mut mem,
        );
    }
}

#[test]
fn moe_route_hash_outside_the_table() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(74);
    let (vocab, k, experts) = (40, 6, 64);
    let mut mem = HostMemory::default();
    let table: Vec<i32> = (0..vocab * k).map(|_| rng.below(experts) as i32).collect();
    let tokens = [3, -1, 39, 40, i32::MAX, i32::MIN, 0];
    let n = tokens.len();
    let logits = mem
        .f32_tensor(&[n, experts], &rng.vec(n * experts, 4.0))
        .unwrap();
    let tt = i32_tensor(&mut mem, &[vocab, k], &table);
    let tk = i32_tensor(&mut mem, &[n], &tokens);
    let o = mem.zeros(DType::I32, &[n, k]).unwrap();
    let nd = node(
        Op::MoeRoute(MoeRouteParams {
            k,
            select: MoeSelect::Hash,
        }),
        vec![logits, tt, tk],
        vec![o],
    );
    // The CPU refuses the node with a clear error.
    let err = try_cpu(&nd, &mem).expect_err("token -1 must be refused on the CPU");
    assert!(
        err.to_string().contains("outside the hash table"),
        "unexpected CPU error: {err}"
    );
    // CUDA cannot return an error from the kernel: those tokens route to -1.
    let Some(g) = g else { return };
    poison_outputs(&nd, &mut mem);
    let got = i32s(&run_gpu(Some(g), &nd, &mem)[0]);
    for (r, &t) in tokens.iter().enumerate() {
        let want: Vec<i32> = if (0..vocab as i32).contains(&t) {
            table[t as usize * k..(t as usize + 1) * k].to_vec()
        } else {
            vec![-1; k]
        };
        assert_eq!(got[r * k..(r + 1) * k], want, "token {t}");
    }
}

/// Distance in f32 ulp (the order of `f32::total_cmp`; NaN to NaN is 0).
fn ulps(a: f32, b: f32) -> u64 {
    if a.is_nan() && b.is_nan() {
        return 0;
    }
    if a.is_nan() || b.is_nan() {
        return u64::MAX;
    }
    let key = |v: f32| {
        let b = v.to_bits() as i32;
        (b ^ (((b >> 31) as u32) >> 1) as i32) as i64
    };
    key(a).abs_diff(key(b))
}

fn weights_node(
    mem: &mut HostMemory,
    logits: &[f32],
    ids: &[i32],
    n: usize,
    experts: usize,
    p: MoeWeightsParams,
) -> OpNode {
    let k = ids.len() / n;
    let l = mem.f32_tensor(&[n, experts], logits).unwrap();
    let i = i32_tensor(mem, &[n, k], ids);
    let o = mem.zeros(DType::F32, &[n, k]).unwrap();
    node(Op::MoeWeights(p), vec![l, i], vec![o])
}

#[test]
fn moe_weights_match_the_cpu_within_two_ulp() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(75);
    let params = [
        MoeWeightsParams {
            normalize: true,
            scale: 1.5,
        },
        MoeWeightsParams {
            normalize: false,
            scale: 2.5,
        },
        MoeWeightsParams {
            normalize: true,
            scale: 1.0,
        },
    ];
    let (mut total, mut differing) = (0usize, 0usize);
    for (n, experts, k) in ROUTE_SHAPES {
        for scale in [4.0, 40.0] {
            for (pi, p) in params.into_iter().enumerate() {
                let mut mem = HostMemory::default();
                let logits = rng.vec(n * experts, scale);
                // The experts the CPU router picks, or random ids (repeats allowed).
                let ids: Vec<i32> = if pi == 0 {
                    let bias = rng.vec(experts, 0.5);
                    let route = top_k_node(&mut mem, n, k, &logits, &bias);
                    i32s(&run_cpu(&route, &mem)[0])
                } else {
                    (0..n * k).map(|_| rng.below(experts) as i32).collect()
                };
                let nd = weights_node(&mut mem, &logits, &ids, n, experts, p);
                poison_outputs(&nd, &mut mem);
                let want = f32s(&run_cpu(&nd, &mem)[0]);
                let got = f32s(&run_gpu(g, &nd, &mem)[0]);
                let what = format!("moe_weights {n}x{experts} k {k} {p:?} (logits ±{scale})");
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    let d = ulps(*a, *b);
                    assert!(
                        d <= WEIGHT_ULPS,
                        "{what}: [{i}] gpu {a:e} cpu {b:e}: {d} ulp apart (at most {WEIGHT_ULPS})"
                    );
                    differing += (d != 0) as usize;
                }
                total += want.len();
            }
        }
    }
    eprintln!("moe_weights: {differing} of {total} weights differ from the CPU's bits (<= {WEIGHT_ULPS} ulp)");
}

#[test]
fn moe_weights_of_an_unknown_expert() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(76);
    let (n, experts, k) = (3, 16, 4);
    let logits = rng.vec(n * experts, 4.0);
    let ids = [1, 2, 3, 4, 5, -1, 6, 7, 8, 9, 16, 10];
    for normalize in [true, false] {
        let mut mem = HostMemory::default();
        let p = MoeWeightsParams {
            normalize,
            scale: 1.5,
        };
        let nd = weights_node(&mut mem, &logits, &ids, n, experts, p);
        let err = try_cpu(&nd, &mem).expect_err("expert -1 must be refused on the CPU");
        assert!(
            err.to_string().contains("outside 0..16"),
            "unexpected CPU error: {err}"
        );
        // CUDA: the unknown expert's weight is NaN (the token's every weight
        // when normalizing); other tokens are untouched.
        let Some(g) = g else { continue };
        poison_outputs(&nd, &mut mem);
        let got = f32s(&run_gpu(Some(g), &nd, &mem)[0]);
        assert!(got[..4].iter().all(|v| v.is_finite()), "{got:?}");
        for (r, bad) in [(1usize, 1usize), (2, 2)] {
            let row = &got[r * k..(r + 1) * k];
            for (j, v) in row.iter().enumerate() {
                assert_eq!(v.is_nan(), normalize || j == bad, "row {r}: {row:?}");
            }
        }
    }
}

#[test]
fn swiglu_clamp_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(77);
    let limit = 10.0f32;
    // Rows of expert_ff 2048: one token's one expert, its 6 experts, a
    // prefill of 100 tokens x 6; then odd sizes.
    for (rows, cols) in [(1, 2048), (6, 2048), (600, 2048), (3, 1000), (5, 33)] {
        let mut mem = HostMemory::default();
        // Row scales up to 10 with outliers x20, times 3: many values past
        // the limit on both sides.
        let gate: Vec<f32> = rng.rows(rows, cols).iter().map(|v| v * 3.0).collect();
        let up: Vec<f32> = rng.rows(rows, cols).iter().map(|v| v * 3.0).collect();
        let past = gate.iter().chain(&up).filter(|v| v.abs() > limit).count();
        assert!(rows * cols < 100 || past > 0, "no value beyond the limit");
        let gt = mem.f32_tensor(&[rows, cols], &gate).unwrap();
        let ut = mem.f32_tensor(&[rows, cols], &up).unwrap();
        let o = mem.zeros(DType::F32, &[rows, cols]).unwrap();
        let nd = node(Op::SwigluClamp { limit }, vec![gt, ut], vec![o]);
        exact(
            g,
            &format!("swiglu_clamp {rows}x{cols} ({past} values past ±{limit})"),
            &nd,
            &mut mem,
        );
    }
    // Edge values: at and just past the limit, huge, infinite, NaN (a NaN
    // gate clamps to the limit, a NaN up stays NaN), exp overflow and
    // underflow of -gate, subnormals.
    let next_up = f32::from_bits(limit.to_bits() + 1);
    let edges = [
        limit,
        -limit,
        next_up,
        -next_up,
        f32::from_bits(limit.to_bits() - 1),
        1e30,
        -1e30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -100.0,
        -88.5,
        88.5,
        -87.0,
        1e-40,
        -1e-40,
        0.5,
        -0.5,
    ];
    let m = edges.len();
    let gate: Vec<f32> = (0..m * m).map(|i| edges[i / m]).collect();
    let up: Vec<f32> = (0..m * m).map(|i| edges[i % m]).collect();
    let mut mem = HostMemory::default();
    let gt = mem.f32_tensor(&[m, m], &gate).unwrap();
    let ut = mem.f32_tensor(&[m, m], &up).unwrap();
    let o = mem.zeros(DType::F32, &[m, m]).unwrap();
    let nd = node(Op::SwigluClamp { limit }, vec![gt, ut], vec![o]);
    let out = f32s(&exact(g, "swiglu_clamp edge values", &nd, &mut mem));
    // The CPU clamps as documented: a NaN gate and an infinite one act as
    // the limit.
    assert_eq!(out[9 * m + 16], out[7 * m + 16], "NaN gate as +inf gate");
    assert_eq!(out[7 * m + 16], out[16], "+inf gate as the limit");
}

#[test]
fn moe_combine_bit_exact_with_and_without_the_shared_expert() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(78);
    // (tokens, k, d): DeepSeek-V4 decode and prefill (k 6, hidden 4096),
    // the small configurations, odd widths.
    for (n, k, d) in [
        (1, 6, 4096),
        (100, 6, 4096),
        (1, 2, 4096),
        (7, 2, 100),
        (3, 8, 33),
        (2, 1, 31),
    ] {
        for shared in [false, true] {
            let mut mem = HostMemory::default();
            let y = mem.f32_tensor(&[n, k * d], &rng.rows(n, k * d)).unwrap();
            let w: Vec<f32> = (0..n * k).map(|_| rng.unit() * 2.5 + 0.01).collect();
            let w = mem.f32_tensor(&[n, k], &w).unwrap();
            let o = mem.zeros(DType::F32, &[n, d]).unwrap();
            let mut ins = vec![y, w];
            if shared {
                ins.push(mem.f32_tensor(&[n, d], &rng.rows(n, d)).unwrap());
            }
            let nd = node(Op::MoeCombine, ins, vec![o]);
            exact(
                g,
                &format!("moe_combine {n}x{k}x{d} (shared expert: {shared})"),
                &nd,
                &mut mem,
            );
        }
    }
}

#[test]
fn moe_sizes_past_the_kernel_limits_are_refused() {
    let Some(Some(g)) = gpu_or_dry() else { return };
    let mut mem = HostMemory::default();
    let experts = 5000;
    let route = top_k_node(&mut mem, 1, 6, &vec![0.5; experts], &vec![0.0; experts]);
    let err = g.kernels.supports(&route).expect_err("5000 experts");
    assert!(matches!(err, OpError::Unsupported { .. }), "{err}");
    let ids: Vec<i32> = (0..5000).map(|i| i % 64).collect();
    let p = MoeWeightsParams {
        normalize: true,
        scale: 1.0,
    };
    let nd = weights_node(&mut mem, &[0.5; 64], &ids, 1, 64, p);
    let err = g.kernels.supports(&nd).expect_err("5000 slots");
    assert!(matches!(err, OpError::Unsupported { .. }), "{err}");
}
