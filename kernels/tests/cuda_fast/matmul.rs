//! The tensor-core prefill products (numerics `fast`) against the
//! reference's integer-exact block dot products: every weight format the
//! kernel takes, shapes that end inside a tile and inside a stage, each
//! tile size, outputs poisoned first; and the half-precision products
//! (f16, bf16 weights) below. Each case is launched twice; both launches
//! must give the same bits.
//!
//! Bound: |gpu - reference| <= 1e-5 * sum_k |w_k x_k| + 1e-6 per output
//! (the same block terms summed in another f32 order; see fast/matmul.cu).

use super::*;

/// Relative error bound against the row's absolute product sum.
const MATMUL_TOLERANCE: f64 = 1e-5;

/// (weight format, weight rows m, tokens n, columns k).
const CASES: &[(DType, usize, usize, usize)] = &[
    (DType::Q4_0, 72, 37, 320),
    (DType::Q4_1, 72, 37, 320),
    (DType::Q5_0, 72, 37, 320),
    (DType::Q8_0, 72, 37, 320),
    (DType::Q4_1, 576, 300, 576),
    (DType::Q4_1, 1088, 1040, 96),
    (DType::Q8_0, 40, 16, 64),
    (DType::Q4_K, 72, 37, 512),
    (DType::Q6_K, 72, 37, 512),
    (DType::Q4_K, 1088, 1040, 256),
    (DType::Q6_K, 200, 64, 768),
    (DType::Q4_K, 33, 17, 256),
];

/// Per output, the absolute sum of the dequantized products.
fn abs_sums(mem: &HostMemory, x: &Tensor, w: &Tensor) -> Vec<f64> {
    let (xf, wf) = (mem.to_f32(x).unwrap(), mem.to_f32(w).unwrap());
    let m = w.rows();
    let rows = (0..x.rows()).flat_map(|t| (0..m).map(move |r| (t, r)));
    abs_dot_sums(&xf, &wf, w.cols(), rows)
}

#[test]
fn tensor_core_matmul_matches_the_reference() {
    let Some(g) = fast() else { return };
    check_products(g, 91, CASES, MATMUL_TOLERANCE, "fast matmul");
}

/// Runs every `(weight format, m, n, k)` case twice on `g` (activations in
/// the weights' dot type, outputs poisoned first) against the CPU, each
/// output within `tol` of its sum of |w x|, both launches the same bits.
fn check_products(
    g: &Gpu,
    seed: u64,
    cases: &[(DType, usize, usize, usize)],
    tol: f64,
    what: &str,
) {
    let mut rng = Rng::new(seed);
    let mut failures = Vec::new();
    for &(wdtype, m, n, k) in cases {
        let mut mem = HostMemory::default();
        let w = weights(&mut rng, &mut mem, wdtype, m, k);
        let adtype = vec_dot_type(wdtype);
        let mut xbytes = Vec::new();
        for _ in 0..n {
            xbytes.extend(quantized(adtype, &rng.rows(1, k)));
        }
        let x = mem.tensor(adtype, &[n, k], &xbytes).unwrap();
        let o = mem.zeros(DType::F32, &[n, m]).unwrap();
        let nd = node(Op::MatMul, vec![x, w], vec![o]);
        poison_outputs(&nd, &mut mem);
        let got = run_fast(g, &nd, &mem, vec![0, 0], 2);
        let want = run_cpu(&node(Op::MatMul, vec![x, w], vec![o]), &mem);
        let want: Vec<f32> = bytemuck_f32(&want[0]);
        let sums = abs_sums(&mem, &x, &w);
        for (launch, outs) in got.iter().enumerate() {
            let out = bytemuck_f32(&outs[0]);
            let (worst, bad) = within_product_bound(&out, &want, &sums, tol);
            eprintln!("NOTE {what} {wdtype} m {m} n {n} k {k} launch {launch}: worst |err| / sum|wx| {worst:.2e}");
            if let Some((i, a, b)) = bad {
                failures.push(format!(
                    "{wdtype} m {m} n {n} k {k}: output {i} (token {}, row {}) is {a}, reference {b}",
                    i / m,
                    i % m
                ));
            }
        }
        if got.len() == 2 && got[0] != got[1] {
            failures.push(format!("{wdtype} m {m} n {n} k {k}: two launches differ"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The half-precision tensor-core products: f16 and bf16 weights against
/// activations in the weights' type, shapes that end inside a tile, odd
/// row counts (single stores), both tile sizes. Bound: 1e-4 of the
/// output's sum of |w x| (f32 accumulation sixteen products at a time; see
/// fast/matmul_half.cu).
const HALF_CASES: &[(DType, usize, usize, usize)] = &[
    (DType::F16, 72, 37, 320),
    (DType::BF16, 72, 37, 320),
    (DType::F16, 33, 17, 128),
    (DType::BF16, 200, 64, 768),
    (DType::F16, 24, 300, 4096),
    (DType::F16, 1088, 1040, 128),
    (DType::BF16, 1088, 1040, 128),
    (DType::F16, 512, 96, 1024),
];

const HALF_TOLERANCE: f64 = 1e-4;

#[test]
fn half_tensor_core_matmul_matches_the_reference() {
    let Some(g) = fast() else { return };
    check_products(g, 92, HALF_CASES, HALF_TOLERANCE, "fast half matmul");
}
