//! TailRope on CUDA against the CPU kernel.
//!
//! The frequencies and the f32 angle are the CPU's own; only the f64
//! sin/cos differ (CUDA's against glibc's, both within an ulp or two in
//! f64), so a (cos, sin) pair may differ by one f32 ulp where the true value
//! sits next to an f32 rounding midpoint. Tolerance: each rotated element
//! within 2^-21 (|a| + |b|) of the CPU's (a, b: the input pair; one ulp
//! of cos and sin, plus the products' and sum's own roundings, with
//! margin); pass-through elements bit for bit.

use crate::cuda_common::*;
use weft_ops::reference::HostMemory;
use weft_ops::{DType, Op, OpNode};
use weft_ops::{TailRopeParams, YarnScaling};

/// DeepSeek-V4-Flash's main rope (YaRN over theta 10000).
fn yarn_flash() -> YarnScaling {
    YarnScaling {
        factor: 16.0,
        orig_ctx: 65536,
        beta_fast: 32.0,
        beta_slow: 1.0,
    }
}

fn params(
    head_dim: usize,
    n_dims: usize,
    base: f32,
    yarn: Option<YarnScaling>,
    inverse: bool,
) -> TailRopeParams {
    TailRopeParams {
        head_dim,
        n_dims,
        base,
        yarn,
        inverse,
    }
}

/// Random positions: a few fixed ones (0, 1, the YaRN context edge, 70000,
/// 2^20 + 3), the rest anywhere below 200000.
fn positions(rng: &mut Rng, n: usize) -> Vec<i32> {
    let fixed = [0, 1, 65535, 70000, (1 << 20) + 3, 12345];
    (0..n)
        .map(|i| match fixed.get(i) {
            Some(&p) if n > 1 => p,
            _ => (rng.next() % 200_000) as i32,
        })
        .collect()
}

/// Runs `node` on both backends and checks the tolerance above; returns
/// (values compared, values not bit-identical).
fn check_rope(
    g: Option<&Gpu>,
    what: &str,
    node: &OpNode,
    mem: &mut HostMemory,
    p: &TailRopeParams,
) -> (usize, usize) {
    poison_outputs(node, mem);
    let x = mem.to_f32(&node.inputs[0]).unwrap();
    let want = run_cpu(node, mem);
    let got = run_gpu(g, node, mem);
    let w: &[f32] = bytemuck::cast_slice(&want[0]);
    let o: &[f32] = bytemuck::cast_slice(&got[0]);
    assert_eq!(w.len(), o.len(), "{what}: sizes");
    let nope = p.head_dim - p.n_dims;
    let mut differ = 0;
    for (i, (&gv, &cv)) in o.iter().zip(w).enumerate() {
        let d = i % p.head_dim;
        if gv.to_bits() == cv.to_bits() {
            continue;
        }
        differ += 1;
        assert!(
            d >= nope,
            "{what}: pass-through element {i} differs: gpu {gv:e} cpu {cv:e}"
        );
        let j = i - (d - nope) % 2; // first element of the pair
        let bound = 2f32.powi(-21) * (x[j].abs() + x[j + 1].abs());
        assert!(
            (gv - cv).abs() <= bound,
            "{what}: element {i} (pair at {j}): gpu {gv:e} cpu {cv:e}, beyond 2^-21 (|a| + |b|) = {bound:e}"
        );
    }
    (w.len(), differ)
}

struct Case {
    rows: usize,
    heads: usize,
    head_dim: usize,
    n_dims: usize,
    base: f32,
    yarn: Option<YarnScaling>,
}

fn case(
    rows: usize,
    heads: usize,
    head_dim: usize,
    n_dims: usize,
    base: f32,
    yarn: Option<YarnScaling>,
) -> Case {
    Case {
        rows,
        heads,
        head_dim,
        n_dims,
        base,
        yarn,
    }
}

#[test]
fn tail_rope_within_an_ulp_of_the_cpu() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0x7a11);
    let fixture_yarn = YarnScaling {
        factor: 16.0,
        orig_ctx: 65536,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    let cases = [
        // DeepSeek-V4-Flash attention: 64 heads x 512, rope on the last 64.
        case(1, 64, 512, 64, 10000.0, Some(yarn_flash())),
        case(37, 64, 512, 64, 10000.0, Some(yarn_flash())),
        // The indexer's queries: 64 heads x 128, rope on the last 64, no YaRN.
        case(1, 64, 128, 64, 10000.0, None),
        case(37, 64, 128, 64, 10000.0, None),
        // The tiny fixture (theta 160000, r 16, YaRN lo 3 hi 7).
        case(37, 4, 64, 16, 160000.0, Some(fixture_yarn)),
        case(1, 4, 64, 16, 160000.0, Some(fixture_yarn)),
        // The whole head rotated (n_dims = head_dim), one and several heads.
        case(9, 3, 64, 64, 10000.0, None),
        case(5, 1, 128, 128, 1e6, Some(yarn_flash())),
        // Odd sizes: 100-wide heads rotating 36 (units not multiples of 32),
        // a pass-through of one element, nothing rotated.
        case(37, 5, 100, 36, 10000.0, Some(yarn_flash())),
        case(3, 7, 34, 32, 500.0, None),
        case(4, 2, 10, 0, 10000.0, None),
        // A single pair per head.
        case(6, 3, 6, 2, 10000.0, Some(yarn_flash())),
    ];
    let (mut total, mut differ) = (0, 0);
    for c in &cases {
        for inverse in [false, true] {
            let p = params(c.head_dim, c.n_dims, c.base, c.yarn, inverse);
            let cols = c.heads * c.head_dim;
            let mut mem = HostMemory::default();
            let x = mem
                .f32_tensor(&[c.rows, cols], &rng.rows(c.rows, cols))
                .unwrap();
            let pos = positions(&mut rng, c.rows);
            let pt = mem
                .tensor(DType::I32, &[c.rows], bytemuck::cast_slice(&pos))
                .unwrap();
            let o = mem.zeros(DType::F32, &[c.rows, cols]).unwrap();
            let n = node(Op::TailRope(p), vec![x, pt], vec![o]);
            let what = format!(
                "tail_rope {}x{}x{} n_dims {} base {} yarn {} inverse {inverse}",
                c.rows,
                c.heads,
                c.head_dim,
                c.n_dims,
                c.base,
                c.yarn.is_some()
            );
            let (t, d) = check_rope(g, &what, &n, &mut mem, &p);
            total += t;
            differ += d;
        }
    }
    println!(
        "tail_rope: {differ} of {total} values not bit-identical to the CPU's (within tolerance)"
    );
}

#[test]
fn tail_rope_in_place_and_inverse_undoes_forward() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0x7a12);
    let (rows, heads, head_dim, n_dims) = (37, 8, 192, 64);
    let cols = heads * head_dim;
    let fwd = params(head_dim, n_dims, 10000.0, Some(yarn_flash()), false);
    let inv = TailRopeParams {
        inverse: true,
        ..fwd
    };
    let mut mem = HostMemory::default();
    let values = rng.rows(rows, cols);
    let x = mem.f32_tensor(&[rows, cols], &values).unwrap();
    let pos = positions(&mut rng, rows);
    let pt = mem
        .tensor(DType::I32, &[rows], bytemuck::cast_slice(&pos))
        .unwrap();
    // In place (out = x), as the CPU kernel allows.
    let n = node(Op::TailRope(fwd), vec![x, pt], vec![x]);
    check_rope(g, "tail_rope in place", &n, &mut mem, &fwd);
    // Forward then inverse on the GPU comes back to x within rounding.
    let mut turned = mem.clone();
    let rotated = run_gpu(g, &n, &turned);
    turned.bytes_mut(&x).copy_from_slice(&rotated[0]);
    let back = run_gpu(g, &node(Op::TailRope(inv), vec![x, pt], vec![x]), &turned);
    let back: &[f32] = bytemuck::cast_slice(&back[0]);
    for (i, (b, v)) in back.iter().zip(&values).enumerate() {
        let pair = i - (i % head_dim) % 2;
        let scale = values[pair].abs() + values[pair + 1].abs();
        assert!(
            (b - v).abs() <= 2f32.powi(-20) * scale,
            "inverse(forward(x))[{i}] = {b:e}, x = {v:e}"
        );
    }
}

#[test]
fn tail_rope_limits_are_errors() {
    let Some(g) = gpu_or_dry() else { return };
    let mut mem = HostMemory::default();
    let (rows, head_dim) = (2, 256);
    let x = mem
        .f32_tensor(&[rows, head_dim], &Rng::new(3).vec(rows * head_dim, 1.0))
        .unwrap();
    let pt = mem
        .tensor(DType::I32, &[rows], bytemuck::cast_slice(&[3i32, 4]))
        .unwrap();
    let o = mem.zeros(DType::F32, &[rows, head_dim]).unwrap();
    // 65 pairs: more frequencies than the kernel takes by value.
    let p = params(head_dim, 130, 10000.0, None, false);
    let n = node(Op::TailRope(p), vec![x, pt], vec![o]);
    if let Some(g) = g {
        let e = g.kernels.supports(&n).expect_err("130 rotated dims");
        assert!(e.to_string().contains("130"), "{e}");
        // 128 (64 pairs) is the largest supported.
        let p = params(head_dim, 128, 10000.0, None, false);
        g.kernels
            .supports(&node(Op::TailRope(p), vec![x, pt], vec![o]))
            .expect("128 rotated dims");
    }
}
