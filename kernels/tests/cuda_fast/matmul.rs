//! The tensor-core prefill products (numerics `fast`) against the
//! reference's integer-exact block dot products: every weight format the
//! kernel takes, shapes that end inside a tile and inside a stage, each
//! tile size, outputs poisoned first.
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
    let xf = mem.to_f32(x).unwrap();
    let wf = mem.to_f32(w).unwrap();
    let k = w.cols();
    let mut out = Vec::with_capacity(x.rows() * w.rows());
    for t in 0..x.rows() {
        let xr = &xf[t * k..(t + 1) * k];
        for r in 0..w.rows() {
            let wr = &wf[r * k..(r + 1) * k];
            out.push(
                xr.iter()
                    .zip(wr)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum(),
            );
        }
    }
    out
}

#[test]
fn tensor_core_matmul_matches_the_reference() {
    let Some(g) = fast() else { return };
    let mut rng = Rng::new(91);
    let mut failures = Vec::new();
    for &(wdtype, m, n, k) in CASES {
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
            let mut worst = 0f64;
            let mut bad = None;
            for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                let err = (*a as f64 - *b as f64).abs();
                let bound = MATMUL_TOLERANCE * sums[i] + 1e-6;
                let rel = err / (sums[i] + 1e-30);
                if err > bound || err.is_nan() {
                    bad.get_or_insert((i, *a, *b));
                }
                if rel.is_finite() {
                    worst = worst.max(rel);
                }
            }
            eprintln!("NOTE fast matmul {wdtype} m {m} n {n} k {k} launch {launch}: worst |err| / sum|wx| {worst:.2e}");
            if let Some((i, a, b)) = bad {
                failures.push(format!(
                    "{wdtype} m {m} n {n} k {k}: output {i} (token {}, row {}) is {a}, reference {b}",
                    i / m,
                    i % m
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
