//! The grouped tensor-core expert products (numerics `fast`) against the
//! CPU's `MatMulId` (the same quantized activations and block dot products
//! in the exact order): every weight format the grouped product takes,
//! both tiles, x shared by a token's slots and x per pair, routings spread
//! and concentrated, rows that end inside a tile, MXFP4 at odd addresses,
//! DeepSeek-V4's expert size; outputs poisoned first, two launches (the
//! routing's counters and table are rebuilt each time).
//!
//! Bound: |gpu - cpu| <= 1e-5 * sum_k |w_k x_k| + 1e-6 per output, as the
//! dense product's (the same terms in another f32 order).

use super::*;
use cuda_common::experts::{expert_weights, matmul_id_node, route, Route};

/// Relative error bound against the output's absolute product sum.
const MATMUL_ID_TOLERANCE: f64 = 1e-5;

/// (weight format, experts, rows m, columns k, tokens, routing, x per pair).
type IdCase = (DType, usize, usize, usize, usize, Route, bool);

const CASES: &[IdCase] = &[
    (DType::Q8_0, 8, 72, 512, 40, Route::Uniform, false),
    (DType::Q4_K, 8, 72, 512, 40, Route::Concentrated, true),
    (DType::Q2_K, 8, 72, 512, 40, Route::Uniform, true),
    (DType::IQ2_XXS, 8, 72, 512, 40, Route::Distinct, false),
    (DType::MXFP4, 8, 72, 96, 40, Route::Uniform, false),
    (DType::Q4_0, 8, 40, 256, 24, Route::Repeats, true),
    (DType::Q4_1, 8, 40, 256, 24, Route::Uniform, false),
    (DType::Q5_0, 8, 40, 256, 24, Route::Uniform, true),
    (DType::Q6_K, 8, 40, 256, 24, Route::Concentrated, false),
    // 48 or more pairs per expert: the 64-pair tile.
    (DType::Q2_K, 4, 136, 256, 70, Route::Uniform, false),
    (DType::IQ2_XXS, 4, 136, 256, 70, Route::Concentrated, true),
    (DType::MXFP4, 4, 136, 256, 70, Route::Uniform, true),
    // DeepSeek-V4's gate/up experts (2048 x 4096), a 64-token chunk.
    (DType::IQ2_XXS, 16, 2048, 4096, 64, Route::Distinct, false),
];

/// Per (pair, row), the absolute sum of the dequantized products.
fn abs_sums(mem: &HostMemory, nd: &OpNode) -> Vec<f64> {
    let (x, w, ids) = (&nd.inputs[0], &nd.inputs[1], &nd.inputs[2]);
    let (xf, wf) = (mem.to_f32(x).unwrap(), mem.to_f32(w).unwrap());
    let id: Vec<usize> = mem
        .bytes(ids)
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .collect();
    let (m, slots, shared) = (w.shape.dims()[1], ids.cols(), x.rows() == ids.rows());
    let rows = id.iter().enumerate().flat_map(|(p, &e)| {
        let row = if shared { p / slots } else { p };
        (0..m).map(move |r| (row, e * m + r))
    });
    abs_dot_sums(&xf, &wf, w.shape.dims()[2], rows)
}

#[test]
fn grouped_expert_matmul_matches_the_cpu() {
    let Some(g) = fast() else { return };
    let mut rng = Rng::new(93);
    let mut failures = Vec::new();
    for &(dtype, experts, m, k, n, how, per_pair) in CASES {
        let mut mem = HostMemory::default();
        let offset = if dtype == DType::MXFP4 { 3 } else { 0 };
        let raw = k >= 4096;
        let w = expert_weights(&mut rng, &mut mem, dtype, [experts, m, k], offset, raw);
        let ids = route(&mut rng, how, n, 6, experts);
        let nd = matmul_id_node(&mut rng, &mut mem, w, &ids, n, per_pair);
        assert!(
            g.kernels.scratch_bytes(&nd) > 0,
            "{dtype} {experts}x{m}x{k}, {n} tokens: not grouped"
        );
        poison_outputs(&nd, &mut mem);
        let got = run_fast(g, &nd, &mem, vec![0], 2);
        let want = bytemuck_f32(&run_cpu(&nd, &mem)[0]);
        let sums = abs_sums(&mem, &nd);
        for (launch, outs) in got.iter().enumerate() {
            let out = bytemuck_f32(&outs[0]);
            let (worst, bad) = within_product_bound(&out, &want, &sums, MATMUL_ID_TOLERANCE);
            eprintln!(
                "NOTE fast matmul_id {dtype} {experts}x{m}x{k} {n} tokens {how:?} launch {launch}: worst |err| / sum|wx| {worst:.2e}"
            );
            if let Some((i, a, b)) = bad {
                failures.push(format!(
                    "{dtype} {experts}x{m}x{k}, {n} tokens {how:?}, x per pair {per_pair}: output {i} (pair {}, row {}) is {a}, the CPU's {b}",
                    i / m,
                    i % m
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
