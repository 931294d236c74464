//! Hyper-connections on CUDA against the CPU kernels: HcCollapse and
//! HcExpand bit for bit; HcMix within a tolerance, because its sigmoids and
//! softmax call f64 `exp` (CUDA's against glibc's, both within an ulp in
//! f64): tolerance 2^-20 relative per value (8 f32 ulps; a differing f64 exp
//! moves the f32 result by at most one ulp in practice, and the Sinkhorn
//! iterations do not amplify it). The f64 sums of squares (HcMix's stream
//! RMS, HcCollapse's norm) must be exact, including rows built to defeat
//! the bounded sum (which then falls back to summing in order).

use crate::cuda_common::*;
use weft_ops::reference::HostMemory;
use weft_ops::HcMixParams;
use weft_ops::{DType, Op, OpNode};

/// HcMix's tolerance (see the module doc).
const MIX_TOLERANCE: f32 = 1.0 / (1 << 20) as f32;

/// Runs `node` on both backends and checks every value within `tol`
/// relative of the CPU's; returns (values, values not bit-identical).
fn check_close(
    g: Option<&Gpu>,
    what: &str,
    node: &OpNode,
    mem: &mut HostMemory,
    tol: f32,
) -> (usize, usize) {
    poison_outputs(node, mem);
    let want = run_cpu(node, mem);
    let got = run_gpu(g, node, mem);
    let w: &[f32] = bytemuck::cast_slice(&want[0]);
    let o: &[f32] = bytemuck::cast_slice(&got[0]);
    assert_eq!(w.len(), o.len(), "{what}: sizes");
    let mut differ = 0;
    for (i, (&gv, &cv)) in o.iter().zip(w).enumerate() {
        if gv.to_bits() == cv.to_bits() {
            continue;
        }
        differ += 1;
        assert!(
            (gv - cv).abs() <= tol * cv.abs(),
            "{what}: value {i}: gpu {gv:e} ({:#010x}) cpu {cv:e} ({:#010x}), beyond {tol:e} relative",
            gv.to_bits(),
            cv.to_bits()
        );
    }
    (w.len(), differ)
}

/// A row of `n` values whose f64 sum of f32 squares sits on a rounding
/// edge of `f32(1 / sqrt(sum / n + eps))`: one head term just below the
/// edge and `n - 1` equal tiny terms whose sum depends on the order, so
/// the bounded method must fall back to the exact one (and that must give
/// the CPU's bits).
fn edge_row(n: usize, eps: f32) -> Vec<f32> {
    let g = |s: f64| (1.0 / (s / n as f64 + eps as f64).sqrt()) as f32;
    let (mut lo, mut hi) = (n as f64, n as f64 * (1.0 + 2f64.powi(-18)));
    assert_ne!(g(lo), g(hi), "no rounding edge in the range");
    while hi.to_bits() - lo.to_bits() > 1 {
        let mid = f64::from_bits((lo.to_bits() + hi.to_bits()) / 2);
        if g(mid) == g(lo) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let x0 = (lo * (1.0 - 2f64.powi(-22))).sqrt() as f32;
    let p0 = (x0 * x0) as f64;
    let v = ((hi - p0) / (n - 1) as f64).sqrt() as f32;
    let mut row = vec![v; n];
    row[0] = x0;
    // The kernels' bounded check (hyper.cu's hc_sum_margin) cannot decide it.
    let sum: f64 = row.iter().map(|&x| (x * x) as f64).sum();
    let margin = sum * ((n + 2) as f64 * 2f64.powi(-50));
    assert_ne!(g(sum - margin), g(sum + margin), "not on the edge");
    row
}

/// Rows of streams: activation-like rows, plus (for the first few rows)
/// adversarial ones: magnitudes spread over 2^-60..2^10, all ones, a
/// rounding edge of the inverse RMS.
fn stream_rows(rng: &mut Rng, rows: usize, cols: usize, eps: f32) -> Vec<f32> {
    let mut v = rng.rows(rows, cols);
    if rows >= 4 {
        for (i, x) in v[..cols].iter_mut().enumerate() {
            *x = 2f32.powi((i % 70) as i32 - 60) * if i % 3 == 0 { -1.0 } else { 1.5 };
        }
        v[cols..2 * cols].fill(1.0);
        v[2 * cols..3 * cols].copy_from_slice(&edge_row(cols, eps));
    }
    v
}

fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|v| (v * v) as f64).sum::<f64>() / x.len() as f64).sqrt() as f32
}

struct MixCase {
    rows: usize,
    hc: usize,
    /// Elements per stream (0: no normalisation input).
    d: usize,
    head: bool,
    iters: usize,
}

fn mix_node(rng: &mut Rng, mem: &mut HostMemory, c: &MixCase, in_place: bool) -> OpNode {
    let hc = c.hc;
    let mix = if c.head { hc } else { (2 + hc) * hc };
    let norm_eps = 1e-6;
    let xc = hc * c.d;
    let streams = (c.d > 0).then(|| stream_rows(rng, c.rows, xc, norm_eps));
    // Mixer outputs of the streams' scale, so the normalised values are O(1);
    // the last row saturates the sigmoids and the softmax.
    let mut m = Vec::with_capacity(c.rows * mix);
    for r in 0..c.rows {
        // (Not on the rounding-edge row, row 2: its m[0] must be exactly 1.)
        let s = match &streams {
            Some(x) if !(r == 2 && c.rows >= 4) => rms(&x[r * xc..(r + 1) * xc]),
            _ => 1.0,
        };
        let big = if r + 1 == c.rows && c.rows > 1 {
            300.0
        } else {
            1.0
        };
        for j in 0..mix {
            let v = if j == 0 { 1.0 } else { rng.val(3.0) };
            m.push(v * s * big);
        }
    }
    let scale: Vec<f32> = if c.head {
        vec![0.9]
    } else {
        vec![0.7, 1.1, 2.5]
    };
    let mt = mem.f32_tensor(&[c.rows, mix], &m).unwrap();
    let st = mem.f32_tensor(&[scale.len()], &scale).unwrap();
    let bt = mem.f32_tensor(&[mix], &rng.vec(mix, 1.0)).unwrap();
    let mut ins = vec![mt, st, bt];
    if let Some(x) = &streams {
        ins.push(mem.f32_tensor(&[c.rows, xc], x).unwrap());
    }
    let out = if in_place {
        mt
    } else {
        mem.zeros(DType::F32, &[c.rows, mix]).unwrap()
    };
    let p = HcMixParams {
        hc,
        iters: c.iters,
        eps: 1e-6,
        norm_eps: streams.is_some().then_some(norm_eps),
    };
    node(Op::HcMix(p), ins, vec![out])
}

#[test]
fn hc_mix_within_tolerance() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0x4c01);
    let mc = |rows, hc, d, head, iters| MixCase {
        rows,
        hc,
        d,
        head,
        iters,
    };
    let cases = [
        // DeepSeek-V4-Flash: hc 4 over 4096-wide streams, 20 Sinkhorn iterations.
        mc(1, 4, 4096, false, 20),
        mc(37, 4, 4096, false, 20),
        // Small streams (64, and 100: not a multiple of 32).
        mc(1, 4, 64, false, 20),
        mc(37, 4, 100, false, 20),
        // Without the normalisation input.
        mc(1, 4, 0, false, 20),
        mc(37, 4, 0, false, 20),
        // The output head: pre only.
        mc(1, 4, 4096, true, 1),
        mc(37, 4, 100, true, 1),
        mc(5, 4, 0, true, 1),
        // One iteration (softmax and one column normalisation); odd hc;
        // the largest hc the kernel takes.
        mc(7, 4, 64, false, 1),
        mc(9, 3, 100, false, 7),
        mc(6, 16, 64, false, 20),
        mc(4, 1, 64, false, 3),
        // Prefill past the few-rows kernels (a block of 256 per row), the
        // block Sinkhorn with many rows, a stream width not a multiple of 4.
        mc(100, 4, 4096, false, 20),
        mc(65, 16, 64, false, 20),
        mc(9, 3, 33, false, 7),
        mc(70, 3, 33, false, 7),
    ];
    let (mut total, mut differ) = (0, 0);
    for c in &cases {
        let mut mem = HostMemory::default();
        let n = mix_node(&mut rng, &mut mem, c, false);
        let what = format!(
            "hc_mix {} rows hc {} d {} head {} iters {}",
            c.rows, c.hc, c.d, c.head, c.iters
        );
        let (t, d) = check_close(g, &what, &n, &mut mem, MIX_TOLERANCE);
        total += t;
        differ += d;
    }
    // In place (out = m), as the CPU kernel allows.
    let mut mem = HostMemory::default();
    let n = mix_node(&mut rng, &mut mem, &mc(37, 4, 100, false, 20), true);
    check_close(g, "hc_mix in place", &n, &mut mem, MIX_TOLERANCE);
    println!(
        "hc_mix: {differ} of {total} values not bit-identical to the CPU's (within tolerance)"
    );
}

#[test]
fn hc_mix_limits_are_errors() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0x4c02);
    let mut mem = HostMemory::default();
    let c = MixCase {
        rows: 2,
        hc: 17,
        d: 0,
        head: false,
        iters: 2,
    };
    let n = mix_node(&mut rng, &mut mem, &c, false);
    if let Some(g) = g {
        let e = g.kernels.supports(&n).expect_err("17 streams");
        assert!(e.to_string().contains("17 streams"), "{e}");
    }
}

fn collapse_node(
    rng: &mut Rng,
    mem: &mut HostMemory,
    rows: usize,
    hc: usize,
    d: usize,
    cc: usize,
    norm: bool,
) -> OpNode {
    let eps = 1e-6;
    let xv = if hc == 1 {
        stream_rows(rng, rows, d, eps)
    } else {
        rng.rows(rows, hc * d)
    };
    let x = mem.f32_tensor(&[rows, hc * d], &xv).unwrap();
    // hc = 1 with coefficient 1: y = x exactly, so the adversarial rows of
    // `stream_rows` reach the norm's sum as they are.
    let cv: Vec<f32> = if hc == 1 {
        (0..rows * cc)
            .map(|i| if i % cc == 0 { 1.0 } else { 0.5 })
            .collect()
    } else {
        rng.vec(rows * cc, 1.5)
    };
    let co = mem.f32_tensor(&[rows, cc], &cv).unwrap();
    let mut ins = vec![x, co];
    if norm {
        let w: Vec<f32> = if hc == 1 {
            vec![1.0; d]
        } else {
            rng.vec(d, 1.5)
        };
        ins.push(mem.f32_tensor(&[d], &w).unwrap());
    }
    let out = mem.zeros(DType::F32, &[rows, d]).unwrap();
    node(
        Op::HcCollapse {
            hc,
            norm_eps: norm.then_some(eps),
        },
        ins,
        vec![out],
    )
}

#[test]
fn hc_collapse_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0x4c03);
    // (rows, hc, d, coefficient columns): real size (4096, staged), small
    // and odd sizes, a row too long to stage in shared memory (9000), the
    // coefficients as HcMix writes them (24 columns, pre first) or just hc.
    let shapes = [
        (1, 4, 4096, 24),
        (37, 4, 4096, 24),
        (1, 4, 64, 4),
        (37, 4, 100, 24),
        (5, 4, 9000, 24),
        (3, 3, 100, 15),
        // hc 1, coefficient 1: the adversarial rows for the norm's sum.
        (6, 1, 576, 3),
        (4, 1, 9000, 3),
        // Prefill past the few-rows kernels (a block of 256 per row, four
        // passes over the row), a tiny row, odd streams over many rows.
        (100, 4, 4096, 24),
        (2, 4, 36, 24),
        (70, 3, 100, 15),
    ];
    for (rows, hc, d, cc) in shapes {
        for norm in [false, true] {
            let mut mem = HostMemory::default();
            let n = collapse_node(&mut rng, &mut mem, rows, hc, d, cc, norm);
            check_exact(
                g,
                &format!("hc_collapse {rows}x{hc}x{d} coeffs {cc} norm {norm}"),
                &n,
                &mut mem,
            );
        }
    }
}

/// The norm's rounding edge through every collapse kernel of four streams
/// (the cluster kernel for few rows, one block per row for many, rows too
/// long for either's one pass): coefficients (1, 0, 0, 0) pass stream 0
/// through unchanged, and stream 0 of some rows is `edge_row`.
#[test]
fn hc_collapse_rounding_edge_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0x4c06);
    let (hc, cc) = (4, 24);
    for (rows, d) in [(1, 4096), (5, 4096), (70, 4096), (3, 4000), (3, 9000)] {
        let mut mem = HostMemory::default();
        let eps = 1e-6;
        let mut xv = rng.rows(rows, hc * d);
        let mut cv = rng.vec(rows * cc, 1.5);
        for r in (0..rows).filter(|r| r % 2 == 0) {
            xv[r * hc * d..r * hc * d + d].copy_from_slice(&edge_row(d, eps));
            let c = &mut cv[r * cc..(r + 1) * cc];
            c[..hc].copy_from_slice(&[1.0, 0.0, 0.0, 0.0]);
        }
        let x = mem.f32_tensor(&[rows, hc * d], &xv).unwrap();
        let co = mem.f32_tensor(&[rows, cc], &cv).unwrap();
        let w = mem.f32_tensor(&[d], &rng.vec(d, 1.5)).unwrap();
        let out = mem.zeros(DType::F32, &[rows, d]).unwrap();
        let n = node(
            Op::HcCollapse {
                hc,
                norm_eps: Some(eps),
            },
            vec![x, co, w],
            vec![out],
        );
        check_exact(
            g,
            &format!("hc_collapse edge rows {rows}x{hc}x{d}"),
            &n,
            &mut mem,
        );
    }
}

#[test]
fn hc_expand_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0x4c04);
    for (rows, hc, d) in [
        (1, 4, 4096),
        (37, 4, 4096),
        (1, 4, 64),
        (37, 4, 100),
        (3, 3, 100),
        (2, 1, 33),
        (2, 16, 64),
    ] {
        let mut mem = HostMemory::default();
        let x = mem
            .f32_tensor(&[rows, hc * d], &rng.rows(rows, hc * d))
            .unwrap();
        let f = mem.f32_tensor(&[rows, d], &rng.rows(rows, d)).unwrap();
        let cc = (2 + hc) * hc;
        let co = mem
            .f32_tensor(&[rows, cc], &rng.vec(rows * cc, 1.2))
            .unwrap();
        let out = mem.zeros(DType::F32, &[rows, hc * d]).unwrap();
        let n = node(Op::HcExpand { hc }, vec![x, f, co], vec![out]);
        check_exact(g, &format!("hc_expand {rows}x{hc}x{d}"), &n, &mut mem);
    }
}

/// One hyper-connection step as the model records it: mix the streams,
/// collapse them (normed) for the sublayer, expand the sublayer's output
/// back; each op against the CPU on the CPU's own inputs.
#[test]
fn hc_chain_of_a_layer() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0x4c05);
    let (rows, hc, d) = (37, 4, 4096);
    let mix = (2 + hc) * hc;
    let mut mem = HostMemory::default();
    let xv = rng.rows(rows, hc * d);
    let x = mem.f32_tensor(&[rows, hc * d], &xv).unwrap();
    let mut m = Vec::with_capacity(rows * mix);
    for r in 0..rows {
        let s = rms(&xv[r * hc * d..(r + 1) * hc * d]);
        m.extend((0..mix).map(|_| rng.val(2.0) * s));
    }
    let mt = mem.f32_tensor(&[rows, mix], &m).unwrap();
    let st = mem.f32_tensor(&[3], &[0.5, 0.8, 1.7]).unwrap();
    let bt = mem.f32_tensor(&[mix], &rng.vec(mix, 1.0)).unwrap();
    let co = mem.zeros(DType::F32, &[rows, mix]).unwrap();
    let p = HcMixParams {
        hc,
        iters: 20,
        eps: 1e-6,
        norm_eps: Some(1e-6),
    };
    let n_mix = node(Op::HcMix(p), vec![mt, st, bt, x], vec![co]);
    check_close(g, "chain: hc_mix", &n_mix, &mut mem, MIX_TOLERANCE);
    // The CPU's coefficients feed the next ops on both sides.
    let coeffs = run_cpu(&n_mix, &mem);
    mem.bytes_mut(&co).copy_from_slice(&coeffs[0]);
    let w = mem.f32_tensor(&[d], &rng.vec(d, 1.5)).unwrap();
    let y = mem.zeros(DType::F32, &[rows, d]).unwrap();
    let n_col = node(
        Op::HcCollapse {
            hc,
            norm_eps: Some(1e-6),
        },
        vec![x, co, w],
        vec![y],
    );
    check_exact(g, "chain: hc_collapse", &n_col, &mut mem);
    let f = mem.f32_tensor(&[rows, d], &rng.rows(rows, d)).unwrap();
    let out = mem.zeros(DType::F32, &[rows, hc * d]).unwrap();
    let n_exp = node(Op::HcExpand { hc }, vec![x, f, co], vec![out]);
    check_exact(g, "chain: hc_expand", &n_exp, &mut mem);
}
