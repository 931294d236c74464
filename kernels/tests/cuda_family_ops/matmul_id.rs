//! MatMulId (the indexed expert matmul) on CUDA against the CPU kernel, bit
//! for bit, for every weight format the CUDA kernels take: random weights,
//! random activations, random routings (distinct experts per token as top-k
//! gives, repeated experts across slots and tokens, most pairs on a few
//! experts so the groups reach the sizes where Q4_K, Q6_K and the float
//! formats change order), x as `[n, k]` and as `[n * slots, k]`, one warp's
//! routing (up to 32 pairs) and the whole block's, tiles of one and of four
//! pairs, and DeepSeek-V4's expert sizes.

use crate::cuda_common::experts::*;
use crate::cuda_common::*;
use weft_ops::reference::HostMemory;
use weft_ops::DType;

/// Every weight format the CUDA kernels take.
const FORMATS: [DType; 13] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q6_K,
    DType::Q2_K,
    DType::IQ2_XXS,
    DType::MXFP4,
];

/// The routings of one weight matrix: decode (one token, six slots, as a
/// gate/up product and as a down product), a few tokens (one warp routes),
/// many tokens (the block routes), concentrated.
const CASES: [(usize, Route, bool); 7] = [
    (1, Route::Distinct, false),
    (1, Route::Repeats, true),
    (5, Route::Uniform, false),
    (5, Route::Concentrated, true),
    (33, Route::Uniform, true),
    (33, Route::Concentrated, false),
    (33, Route::Repeats, true),
];

#[test]
fn matmul_id_every_format_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(71);
    let experts = 8;
    for dtype in FORMATS {
        // A second k per format: float tails (100), odd 32-element rows
        // (96: MXFP4 rows at odd addresses), two super-blocks.
        let k2 = match dtype.block_len() {
            1 => 100,
            32 => 96,
            _ => 512,
        };
        for (k, m) in [(256, 70), (256, 72), (k2, 40)] {
            let mut mem = HostMemory::default();
            let offset = if dtype == DType::MXFP4 { 3 } else { 0 };
            let w = expert_weights(&mut rng, &mut mem, dtype, [experts, m, k], offset, false);
            for (n, how, per_pair) in CASES {
                let ids = route(&mut rng, how, n, 6, experts);
                let nd = matmul_id_node(&mut rng, &mut mem, w, &ids, n, per_pair);
                let what = format!(
                    "matmul_id {dtype} {experts}x{m}x{k}, {n} tokens {how:?}, x per pair {per_pair}"
                );
                check_exact(g, &what, &nd, &mut mem);
            }
        }
    }
}

/// Many experts: more than 32 pairs but fewer than two per expert (the
/// block routes, one pair per tile); rows not a multiple of a pass.
#[test]
fn matmul_id_many_experts_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(72);
    for dtype in [DType::Q8_0, DType::Q4_K, DType::MXFP4, DType::F16] {
        let (experts, m, k) = (128, 40, 256);
        let mut mem = HostMemory::default();
        let w = expert_weights(&mut rng, &mut mem, dtype, [experts, m, k], 0, false);
        for (n, how, per_pair) in [
            (33, Route::Distinct, false),
            (20, Route::Uniform, true),
            (40, Route::Concentrated, false),
        ] {
            let ids = route(&mut rng, how, n, 6, experts);
            let nd = matmul_id_node(&mut rng, &mut mem, w, &ids, n, per_pair);
            let what = format!("matmul_id {dtype} {experts}x{m}x{k}, {n} tokens {how:?}");
            check_exact(g, &what, &nd, &mut mem);
        }
    }
}

/// The decode kernels (tiles of one pair, weights streamed through shared
/// memory): 64 experts so that up to 127 pairs still take tiles of one
/// (one warp routes, then the block), rows not a multiple of a pass, whole
/// ring slices (k = 2048), Q4_K in both repacked orders (a concentrated
/// routing gives groups of four and more), x shared and per pair.
#[test]
fn matmul_id_decode_kernels_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(80);
    for dtype in [
        DType::Q8_0,
        DType::Q4_K,
        DType::Q2_K,
        DType::IQ2_XXS,
        DType::MXFP4,
    ] {
        let (experts, m, k) = (64, 72, 2048);
        let mut mem = HostMemory::default();
        let w = expert_weights(&mut rng, &mut mem, dtype, [experts, m, k], 0, true);
        for (n, how, per_pair) in [
            (1, Route::Distinct, false),
            (1, Route::Repeats, true),
            (5, Route::Uniform, true),
            (20, Route::Uniform, false),
            (20, Route::Concentrated, true),
        ] {
            let ids = route(&mut rng, how, n, 6, experts);
            let nd = matmul_id_node(&mut rng, &mut mem, w, &ids, n, per_pair);
            let what = format!(
                "matmul_id {dtype} {experts}x{m}x{k}, {n} tokens {how:?}, x per pair {per_pair}"
            );
            check_exact(g, &what, &nd, &mut mem);
        }
    }
}

/// DeepSeek-V4's expert matrices (2048 x 4096 gate/up, 4096 x 2048 down)
/// of random blocks: decode (six distinct experts, x shared; one repeat, x
/// per pair) and a 33-token prefill (x shared and per pair).
fn real_sizes(dtype: DType, seed: u64) {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(seed);
    let experts = 8;
    for (m, k) in [(2048, 4096), (4096, 2048)] {
        let mut mem = HostMemory::default();
        let w = expert_weights(&mut rng, &mut mem, dtype, [experts, m, k], 0, true);
        let cases: &[(usize, Route, bool)] = if m == 2048 {
            &[
                (1, Route::Distinct, false),
                (33, Route::Uniform, false),
                (33, Route::Uniform, true),
            ]
        } else {
            &[(1, Route::Repeats, true), (33, Route::Concentrated, true)]
        };
        for &(n, how, per_pair) in cases {
            let ids = route(&mut rng, how, n, 6, experts);
            let nd = matmul_id_node(&mut rng, &mut mem, w, &ids, n, per_pair);
            let what = format!(
                "matmul_id {dtype} {experts}x{m}x{k}, {n} tokens {how:?}, x per pair {per_pair}"
            );
            check_exact(g, &what, &nd, &mut mem);
        }
    }
}

#[test]
fn matmul_id_real_sizes_mxfp4_bit_exact() {
    real_sizes(DType::MXFP4, 73);
}

#[test]
fn matmul_id_real_sizes_q2_k_bit_exact() {
    real_sizes(DType::Q2_K, 74);
}

#[test]
fn matmul_id_real_sizes_iq2_xxs_bit_exact() {
    real_sizes(DType::IQ2_XXS, 75);
}

#[test]
fn matmul_id_real_sizes_q4_k_bit_exact() {
    real_sizes(DType::Q4_K, 76);
}

#[test]
fn matmul_id_real_sizes_q8_0_bit_exact() {
    real_sizes(DType::Q8_0, 77);
}

/// Ids outside `0..experts` (the CPU refuses them): NaN rows; the other
/// pairs as the CPU computes them with those ids replaced (Q8_0 and MXFP4
/// products do not depend on the grouping).
#[test]
fn matmul_id_invalid_ids_give_nan_rows() {
    let Some(g) = gpu_or_dry() else { return };
    let Some(g) = g else { return }; // a dry run: the CPU would refuse the ids
    let mut rng = Rng::new(78);
    let (experts, m, k, slots) = (8, 72, 256, 6);
    for dtype in [DType::Q8_0, DType::MXFP4] {
        for n in [1, 33] {
            let mut mem = HostMemory::default();
            let w = expert_weights(&mut rng, &mut mem, dtype, [experts, m, k], 0, false);
            let mut ids = route(&mut rng, Route::Uniform, n, slots, experts);
            let bad = [
                (0, -1),
                (ids.len() / 2, experts as i32),
                (ids.len() - 1, 1 << 30),
            ];
            for &(p, v) in &bad {
                ids[p] = v;
            }
            let nd = matmul_id_node(&mut rng, &mut mem, w, &ids, n, true);
            poison_outputs(&nd, &mut mem);
            let got = run_gpu(Some(g), &nd, &mem);
            let mut fixed = mem.clone();
            let mut valid = ids.clone();
            for &(p, _) in &bad {
                valid[p] = 0;
            }
            fixed
                .bytes_mut(&nd.inputs[2])
                .copy_from_slice(bytemuck::cast_slice(&valid));
            let want = run_cpu(&nd, &fixed);
            let (gv, wv): (&[f32], &[f32]) = (
                bytemuck::cast_slice(&got[0]),
                bytemuck::cast_slice(&want[0]),
            );
            for (p, id) in ids.iter().enumerate() {
                let rows = p * m..(p + 1) * m;
                if bad.iter().any(|&(b, _)| b == p) {
                    assert!(
                        gv[rows].iter().all(|v| v.is_nan()),
                        "{dtype} n={n}: pair {p} (id {id}) should be NaN"
                    );
                } else {
                    let same = gv[rows.clone()]
                        .iter()
                        .zip(&wv[rows])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{dtype} n={n}: pair {p} differs from the CPU");
                }
            }
        }
    }
}

/// Formats without a CUDA kernel are refused with an error, not a panic.
#[test]
fn matmul_id_refuses_other_formats() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(79);
    for dtype in [DType::Q3_K, DType::Q5_K] {
        let mut mem = HostMemory::default();
        let w = mem.zeros(dtype, &[4, 8, 256]).unwrap();
        let ids = route(&mut rng, Route::Uniform, 2, 3, 4);
        let nd = matmul_id_node(&mut rng, &mut mem, w, &ids, 2, false);
        if let Some(g) = g {
            let err = g.kernels.supports(&nd).expect_err("unsupported format");
            assert!(err.to_string().contains(&dtype.to_string()), "{err}");
        }
    }
}
