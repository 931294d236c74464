//! The CPU kernels against the reference semantics in weft-ops: every op,
//! on seeded random inputs, with the tolerance stated per op. The element-
//! wise, norm, rope and attention cases are `weft_testkit::cases`' lists,
//! which the Metal harness (`metal_vs_cpu.rs`) runs too.

use weft_kernels::{cpu, Numerics};
use weft_ops::reference::{self, HostMemory};
use weft_ops::{AttentionParams, DType, Op, OpNode, RopeMode, RopeParams, Tensor};
use weft_testkit::cases::{self, OpCase};
use weft_testkit::host::{encoded_tensor, node, run_cpu, run_cpu_in, run_ref};
use weft_testkit::Rng;

/// Largest |a - b| / (|b| + floor) over the output.
fn compare(node: &OpNode, mem: &HostMemory, tol: f32, floor: f32, what: &str) {
    for threads in [1, 3] {
        let got = run_cpu(node, mem, threads);
        let want = run_ref(node, mem);
        let out = node.outputs[0];
        let (g, w) = (got.to_f32(&out).unwrap(), want.to_f32(&out).unwrap());
        let mut worst = 0f32;
        for (a, b) in g.iter().zip(&w) {
            let e = (a - b).abs() / (b.abs() + floor);
            assert!(e.is_finite(), "{what}: non-finite result {a} vs {b}");
            worst = worst.max(e);
        }
        assert!(worst <= tol, "{what}: worst relative error {worst} > {tol}");
    }
}

/// The CPU kernels' bound against the reference for a shared case's op.
fn tolerance(node: &OpNode) -> (f32, f32) {
    match &node.op {
        // Exact in f32 up to the order of one operation.
        Op::Add | Op::Mul | Op::Scale { .. } => (1e-6, 1e-6),
        // silu uses expf: a few ulps.
        Op::SiluMul => (1e-5, 1e-5),
        // ggml's f16 table (see gelu_and_layer_norm_match_reference); the
        // product with |b| < 3 scales the error against the same floor.
        Op::Gelu => (2e-3, 1e-2),
        Op::GeluMul => (6e-3, 1e-2),
        // f64 sums in both; the scale differs by f32 rounding. A layer
        // norm's `norm * w + b` can cancel to near zero: a floor of 0.1.
        Op::RmsNorm { .. } => (1e-5, 1e-5),
        Op::LayerNorm { .. } => (1e-5, 0.1),
        Op::Softmax { .. } => (1e-5, 1e-6),
        // The kernel builds theta by repeated multiplication (as ggml
        // does), the reference with powf: the angle drifts by about
        // n_dims/2 ulps, i.e. ~4e-4 rad at position 190.
        Op::Rope(_) => (2e-3, 1e-2),
        // f16 caches: the kernel rounds q and its running output to f16
        // like llama.cpp (~1e-3 relative per step); f32: summation order.
        Op::Attention(_) if node.inputs[1].dtype == DType::F16 => (3e-2, 5e-2),
        Op::Attention(_) => (1e-4, 5e-2),
        op => panic!("no CPU tolerance for {}", op.name()),
    }
}

/// Every case of a shared list, CPU kernels against the reference.
fn check_cases(cases: Vec<OpCase>) {
    for c in cases {
        let (tol, floor) = tolerance(&c.node);
        compare(&c.node, &c.mem, tol, floor, &c.name);
    }
}

#[test]
fn elementwise_and_norm_match_reference() {
    check_cases(cases::elementwise(&mut Rng::new(1)));
}

#[test]
fn argmax_copy_and_rows_match_reference() {
    let mut rng = Rng::new(2);
    let mut mem = HostMemory::default();
    let x = mem.f32_tensor(&[5, 300], &rng.vec(1500, 2.0)).unwrap();
    let ids = mem.zeros(DType::I32, &[5]).unwrap();
    compare(
        &node(Op::Argmax, vec![x], vec![ids]),
        &mem,
        0.0,
        1.0,
        "argmax",
    );
    for dt in [DType::F16, DType::BF16] {
        let o = mem.zeros(dt, &[5, 300]).unwrap();
        // One rounding to the narrow type: exact match expected.
        compare(&node(Op::Copy, vec![x], vec![o]), &mem, 0.0, 1e-6, "copy");
        let cache = mem.zeros(dt, &[16, 300]).unwrap();
        compare(
            &node(
                Op::SetRows {
                    start: 3,
                    ring: None,
                },
                vec![x],
                vec![cache],
            ),
            &mem,
            0.0,
            1e-6,
            "set_rows",
        );
        compare(
            &node(
                Op::SetRows {
                    start: 14,
                    ring: Some(8),
                },
                vec![x],
                vec![cache],
            ),
            &mem,
            0.0,
            1e-6,
            "set_rows ring",
        );
    }
}

#[test]
fn rope_matches_reference() {
    check_cases(cases::rope(&mut Rng::new(3)));
}

#[test]
fn moe_softmax_routing_matches_reference() {
    let mut rng = Rng::new(11);
    let mut mem = HostMemory::default();
    let (n, e, k) = (5, 8, 3);
    let mut probs = rng.vec(n * e, 1.0);
    probs[3] = probs[5]; // a tie: the lower id first
    let p = mem.f32_tensor(&[n, e], &probs).unwrap();
    let ids = mem.zeros(DType::I32, &[n, k]).unwrap();
    let w = mem.zeros(DType::F32, &[n, k]).unwrap();
    let top = node(Op::MoeTopK { k }, vec![p], vec![ids]);
    let got = run_cpu(&top, &mem, 2);
    assert_eq!(
        got.to_i32(&ids),
        run_ref(&top, &mem).to_i32(&ids),
        "moe_top_k"
    );
    for normalize in [false, true] {
        // The same sums in the same order: identical.
        compare(
            &node(Op::MoeGather { normalize }, vec![p, ids], vec![w]),
            &got,
            0.0,
            0.0,
            "moe_gather",
        );
    }
}

#[test]
fn attention_matches_reference() {
    check_cases(cases::attention(&mut Rng::new(4)));
}

#[test]
fn gelu_and_layer_norm_match_reference() {
    let mut rng = Rng::new(5);
    let mut mem = HostMemory::default();
    for (rows, cols, scale) in [(1, 2048, 3.0), (7, 640, 12.0), (3, 100, 0.5)] {
        let a = mem
            .f32_tensor(&[rows, cols], &rng.vec(rows * cols, scale))
            .unwrap();
        let b = mem
            .f32_tensor(&[rows, cols], &rng.vec(rows * cols, 2.0))
            .unwrap();
        let w = mem.f32_tensor(&[cols], &rng.vec(cols, 1.0)).unwrap();
        let bias = mem.f32_tensor(&[cols], &rng.vec(cols, 1.0)).unwrap();
        let o = mem.zeros(DType::F32, &[rows, cols]).unwrap();
        // The CPU kernel follows ggml: the input is rounded to f16 (2^-11
        // relative), looked up in a table of f16 results (another 2^-11);
        // GELU's slope is at most 1.13, so the error stays below ~3.3 * 2^-11
        // of |x|. Where gelu(x) is tiny (x < -3) that is relative to |x|, so
        // the floor is 1e-2.
        compare(&node(Op::Gelu, vec![a], vec![o]), &mem, 2e-3, 1e-2, "gelu");
        // gelu_mul scales that error by |b| < 2 against the same floor:
        // twice gelu's bound.
        compare(
            &node(Op::GeluMul, vec![a, b], vec![o]),
            &mem,
            4e-3,
            1e-2,
            "gelu_mul",
        );
        // f64 sums in both; the kernel's scale and products are f32, a few
        // ulps of the O(1) terms `norm * w` and `b`. Their sum can cancel to
        // near zero, so the error is measured against a floor of 0.1.
        compare(
            &node(Op::LayerNorm { eps: 1e-5 }, vec![a, w, bias], vec![o]),
            &mem,
            1e-5,
            0.1,
            "layer_norm",
        );
    }
}

// ---- Family-module ops (weft_ops::family): each against its reference ----

fn i32_tensor(mem: &mut HostMemory, dims: &[usize], values: &[i32]) -> Tensor {
    mem.tensor(DType::I32, dims, bytemuck::cast_slice(values))
        .unwrap()
}

#[test]
fn dsv4_tail_rope_matches_reference() {
    use weft_ops::{TailRopeParams, YarnScaling};
    let mut rng = Rng::new(11);
    let mut mem = HostMemory::default();
    let (rows, heads, d) = (5, 3, 64);
    let x = mem
        .f32_tensor(&[rows, heads * d], &rng.vec(rows * heads * d, 2.0))
        .unwrap();
    let p = i32_tensor(&mut mem, &[rows], &[0, 1, 47, 383, 65_000]);
    let o = mem.zeros(DType::F32, &[rows, heads * d]).unwrap();
    for yarn in [
        None,
        Some(YarnScaling {
            factor: 16.0,
            orig_ctx: 65536,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }),
    ] {
        for inverse in [false, true] {
            let params = TailRopeParams {
                head_dim: d,
                n_dims: 16,
                base: 160000.0,
                yarn,
                inverse,
            };
            // Same angles and f32 rotation; the reference rotates in f64.
            compare(
                &node(Op::TailRope(params), vec![x, p], vec![o]),
                &mem,
                1e-5,
                1e-3,
                "tail_rope",
            );
        }
    }
}

#[test]
fn dsv4_hyper_connections_match_reference() {
    use weft_ops::HcMixParams;
    let mut rng = Rng::new(12);
    let mut mem = HostMemory::default();
    let (n, hc, d) = (6, 4, 64);
    let mix = (2 + hc) * hc;
    let params = HcMixParams {
        hc,
        iters: 20,
        eps: 1e-6,
        norm_eps: None,
    };
    let m = mem.f32_tensor(&[n, mix], &rng.vec(n * mix, 3.0)).unwrap();
    let scale = mem.f32_tensor(&[3], &[0.9, 1.2, 3.0]).unwrap();
    let base = mem.f32_tensor(&[mix], &rng.vec(mix, 1.0)).unwrap();
    let co = mem.zeros(DType::F32, &[n, mix]).unwrap();
    // Both run the same f64 row function.
    let mix_node = node(Op::HcMix(params), vec![m, scale, base], vec![co]);
    compare(&mix_node, &mem, 0.0, 1e-6, "hc_mix");
    let mh = mem.f32_tensor(&[n, hc], &rng.vec(n * hc, 3.0)).unwrap();
    let s1 = mem.f32_tensor(&[1], &[0.8]).unwrap();
    let bh = mem.f32_tensor(&[hc], &rng.vec(hc, 1.0)).unwrap();
    let oh = mem.zeros(DType::F32, &[n, hc]).unwrap();
    compare(
        &node(Op::HcMix(params), vec![mh, s1, bh], vec![oh]),
        &mem,
        0.0,
        1e-6,
        "hc_mix head",
    );
    // The mixer outputs of raw streams, normalised by the streams' RMS.
    let streams = mem
        .f32_tensor(&[n, hc * d], &rng.vec(n * hc * d, 30.0))
        .unwrap();
    let normed = HcMixParams {
        norm_eps: Some(1e-6),
        ..params
    };
    compare(
        &node(Op::HcMix(normed), vec![m, scale, base, streams], vec![co]),
        &mem,
        1e-5,
        1e-3,
        "hc_mix normalised",
    );
    // Real coefficients for the collapse and the post-mix.
    let mut ref_mem = mem.clone();
    reference::run(&mix_node, &mut ref_mem).unwrap();
    mem = ref_mem;
    let x = mem
        .f32_tensor(&[n, hc * d], &rng.vec(n * hc * d, 4.0))
        .unwrap();
    let f = mem.f32_tensor(&[n, d], &rng.vec(n * d, 2.0)).unwrap();
    let y = mem.zeros(DType::F32, &[n, d]).unwrap();
    let x2 = mem.zeros(DType::F32, &[n, hc * d]).unwrap();
    // f32 sums of hc (+1) products against f64: absolute errors of a few
    // ulps of the O(1) terms, hence the floor.
    compare(
        &node(Op::HcCollapse { hc, norm_eps: None }, vec![x, co], vec![y]),
        &mem,
        1e-5,
        0.5,
        "hc_collapse",
    );
    let w = mem.f32_tensor(&[d], &rng.vec(d, 1.0)).unwrap();
    compare(
        &node(
            Op::HcCollapse {
                hc,
                norm_eps: Some(1e-6),
            },
            vec![x, co, w],
            vec![y],
        ),
        &mem,
        1e-5,
        0.5,
        "hc_collapse + rms_norm",
    );
    compare(
        &node(Op::HcExpand { hc }, vec![x, f, co], vec![x2]),
        &mem,
        1e-5,
        0.5,
        "hc_expand",
    );
}

#[test]
fn dsv4_compress_matches_reference() {
    use weft_ops::{CompressParams, TailRopeParams, YarnScaling};
    let mut rng = Rng::new(13);
    // (ratio, overlap, dc, ring, first_row, rows): the first row with
    // overlap (no previous window), a ring that wraps, plain pooling.
    for (ratio, overlap, dc, ring, first_row, rows) in [
        (4u32, true, 32usize, 20u32, 0u32, 3usize),
        (4, true, 32, 12, 7, 2),
        (3, false, 16, 10, 5, 2),
        (16, false, 64, 24, 1, 1),
    ] {
        let mut mem = HostMemory::default();
        let width = dc * (1 + overlap as usize);
        let n = ring as usize * width;
        let kv = mem
            .f32_tensor(&[ring as usize, width], &rng.vec(n, 2.0))
            .unwrap();
        let gate = mem
            .f32_tensor(&[ring as usize, width], &rng.vec(n, 3.0))
            .unwrap();
        let ape = mem
            .f32_tensor(
                &[ratio as usize, width],
                &rng.vec(ratio as usize * width, 1.0),
            )
            .unwrap();
        let norm = mem.f32_tensor(&[dc], &rng.vec(dc, 1.0)).unwrap();
        // The whole row table, two rows longer than the pooled ones: the
        // rows not pooled keep their (random) values.
        let table = first_row as usize + rows + 2;
        let out = mem
            .f32_tensor(&[table, dc], &rng.vec(table * dc, 1.0))
            .unwrap();
        let p = CompressParams {
            ratio,
            overlap,
            first_row,
            rows: rows as u32,
            ring,
            eps: 1e-6,
            rope: TailRopeParams {
                head_dim: dc,
                n_dims: 16,
                base: 160000.0,
                yarn: Some(YarnScaling {
                    factor: 16.0,
                    orig_ctx: 65536,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                }),
                inverse: false,
            },
        };
        // f32 softmax over at most 2c slots, norm and rotation against f64.
        compare(
            &node(Op::Compress(p), vec![kv, gate, ape, norm], vec![out]),
            &mem,
            1e-5,
            1e-2,
            "compress",
        );
    }
}

#[test]
fn dsv4_indexer_and_sink_attention_match_reference() {
    use weft_ops::{IndexerParams, SinkAttentionParams, TailRopeParams};
    let mut rng = Rng::new(14);
    let (heads, d, ih, id) = (4, 64, 8, 32);
    // (queries, first position, window, ring, ratio, top_k)
    for (n, q_position, window, ring, ratio, top_k) in [
        (5usize, 0u32, 8u32, 16u32, 4u32, 3usize),
        (1, 45, 8, 12, 4, 3),
        (3, 30, 8, 12, 16, 0),
        (4, 100, 128, 160, 0, 0),
        (2, 61, 16, 20, 4, 40),
    ] {
        let mut mem = HostMemory::default();
        let end = q_position as usize + n;
        let m = if ratio > 0 {
            (end / ratio as usize).max(1)
        } else {
            1
        };
        let q = mem
            .f32_tensor(&[n, heads * d], &rng.vec(n * heads * d, 1.0))
            .unwrap();
        let sinks = mem.f32_tensor(&[heads], &rng.vec(heads, 3.0)).unwrap();
        let o = mem.zeros(DType::F32, &[n, heads * d]).unwrap();
        let selection = if top_k > 0 {
            let qi = mem
                .f32_tensor(&[n, ih * id], &rng.vec(n * ih * id, 1.0))
                .unwrap();
            let wi = mem.f32_tensor(&[n, ih], &rng.vec(n * ih, 1.0)).unwrap();
            let keys = mem.f32_tensor(&[m, id], &rng.vec(m * id, 1.0)).unwrap();
            let sel = mem.zeros(DType::I32, &[n, top_k]).unwrap();
            let ip = IndexerParams {
                heads: ih,
                head_dim: id,
                top_k,
                ratio,
                q_position,
            };
            let inode = node(Op::IndexerTopK(ip), vec![qi, wi, keys], vec![sel]);
            // Selections are ids: exactly equal.
            compare(&inode, &mem, 0.0, 1.0, "indexer_topk");
            reference::run(&inode, &mut mem).unwrap();
            Some(sel)
        } else {
            None
        };
        for dtype in [DType::F32, DType::F16] {
            let win = mem.zeros(dtype, &[ring as usize, d]).unwrap();
            mem.set_f32(&win, &rng.vec(ring as usize * d, 1.0)).unwrap();
            let rows = mem.zeros(dtype, &[m, d]).unwrap();
            mem.set_f32(&rows, &rng.vec(m * d, 1.0)).unwrap();
            let p = SinkAttentionParams {
                heads,
                head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
                q_position,
                window,
                ring,
                ratio,
                top_k,
                out_rope: (ratio > 0).then_some(TailRopeParams {
                    head_dim: d,
                    n_dims: 16,
                    base: 160000.0,
                    yarn: None,
                    inverse: true,
                }),
            };
            let mut inputs = vec![q, win, rows, sinks];
            inputs.extend(selection);
            compare(
                &node(Op::SinkAttention(p), inputs, vec![o]),
                &mem,
                1e-4,
                5e-2,
                "sink_attention",
            );
        }
    }
}

#[test]
fn dsv4_moe_ops_match_reference() {
    use weft_ops::{MoeRouteParams, MoeSelect, MoeWeightsParams};
    let mut rng = Rng::new(15);
    let mut mem = HostMemory::default();
    let (n, e, k, dm, ff) = (5, 8, 2, 256, 32);
    let logits = mem.f32_tensor(&[n, e], &rng.vec(n * e, 3.0)).unwrap();
    let bias = mem.f32_tensor(&[e], &rng.vec(e, 0.3)).unwrap();
    let ids = mem.zeros(DType::I32, &[n, k]).unwrap();
    let top = MoeRouteParams {
        k,
        select: MoeSelect::TopK,
    };
    let route = node(Op::MoeRoute(top), vec![logits, bias], vec![ids]);
    compare(&route, &mem, 0.0, 1.0, "moe_route top-k");
    let table: Vec<i32> = (0..16 * k).map(|i| ((i * 5 + i / k) % e) as i32).collect();
    let table = i32_tensor(&mut mem, &[16, k], &table);
    let tokens = i32_tensor(&mut mem, &[n], &[3, 0, 15, 7, 3]);
    let hash = MoeRouteParams {
        k,
        select: MoeSelect::Hash,
    };
    compare(
        &node(Op::MoeRoute(hash), vec![logits, table, tokens], vec![ids]),
        &mem,
        0.0,
        1.0,
        "moe_route hash",
    );
    reference::run(&route, &mut mem).unwrap();
    let w = mem.zeros(DType::F32, &[n, k]).unwrap();
    for normalize in [true, false] {
        let p = MoeWeightsParams {
            normalize,
            scale: 1.5,
        };
        compare(
            &node(Op::MoeWeights(p), vec![logits, ids], vec![w]),
            &mem,
            1e-6,
            1e-6,
            "moe_weights",
        );
    }
    let g = mem
        .f32_tensor(&[n, k * ff], &rng.vec(n * k * ff, 14.0))
        .unwrap();
    let u = mem
        .f32_tensor(&[n, k * ff], &rng.vec(n * k * ff, 14.0))
        .unwrap();
    let a = mem.zeros(DType::F32, &[n, k * ff]).unwrap();
    compare(
        &node(Op::SwigluClamp { limit: 10.0 }, vec![g, u], vec![a]),
        &mem,
        1e-5,
        1e-5,
        "swiglu_clamp",
    );
    let y = mem
        .f32_tensor(&[n, k * dm], &rng.vec(n * k * dm, 2.0))
        .unwrap();
    let c = mem.zeros(DType::F32, &[n, dm]).unwrap();
    compare(
        &node(Op::MoeCombine, vec![y, w], vec![c]),
        &mem,
        1e-5,
        1e-3,
        "moe_combine",
    );
    let shared = mem.f32_tensor(&[n, dm], &rng.vec(n * dm, 2.0)).unwrap();
    compare(
        &node(Op::MoeCombine, vec![y, w, shared], vec![c]),
        &mem,
        1e-5,
        1e-2,
        "moe_combine + shared",
    );
    // Indexed matmul: activations per token, then per (token, slot).
    for (dtype, k_in) in [(DType::F32, dm), (DType::Q8_0, dm), (DType::Q4_K, dm)] {
        for per_slot in [false, true] {
            let m_out = if per_slot { 64 } else { ff };
            let wv = rng.vec(e * m_out * k_in, 1.0);
            let experts = encoded_tensor(&mut mem, dtype, &[e, m_out, k_in], &wv);
            let row = dtype.row_bytes(k_in).unwrap();
            let x_rows = if per_slot { n * k } else { n };
            let x = mem
                .f32_tensor(&[x_rows, k_in], &rng.vec(x_rows * k_in, 1.0))
                .unwrap();
            let out = mem.zeros(DType::F32, &[n, k * m_out]).unwrap();
            let id_node = node(Op::MatMulId, vec![x, experts, ids], vec![out]);
            if dtype == DType::F32 {
                // Sums of 256 products in another order (results O(5):
                // an absolute floor of 1).
                compare(&id_node, &mem, 1e-5, 1.0, "matmul_id");
                continue;
            }
            // Quantized weights: the kernel quantizes the activations as
            // llama.cpp does, so it must give exactly what the CPU matmul
            // gives on each selected expert's matrix.
            let id_values: Vec<i32> = mem.to_i32(&ids);
            for threads in [1, 3] {
                let got = run_cpu(&id_node, &mem, threads).to_f32(&out).unwrap();
                for (pair, &ex) in id_values.iter().enumerate() {
                    let xr = if per_slot { pair } else { pair / k };
                    let w_e = Tensor::new(
                        experts.buffer,
                        experts.offset + (ex as usize * m_out * row) as u64,
                        dtype,
                        weft_ops::Shape::new(&[m_out, k_in]),
                    )
                    .unwrap();
                    let o1 = mem.zeros(DType::F32, &[1, m_out]).unwrap();
                    let mm = node(Op::MatMul, vec![x.rows_view(xr, 1).unwrap(), w_e], vec![o1]);
                    let want = run_cpu(&mm, &mem, 1).to_f32(&o1).unwrap();
                    let have = &got[pair * m_out..(pair + 1) * m_out];
                    for (a, b) in have.iter().zip(&want) {
                        assert!(
                            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                            "matmul_id {dtype}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}

/// `attention+quantize` (made by the fusion pass for GPUs, run whole on
/// the CPU) equals attention then quantize, bit for bit.
#[test]
fn attention_quantize_equals_its_chain() {
    let mut rng = Rng::new(41);
    for act in [DType::Q8_0, DType::Q8_1] {
        for (n, q_position) in [(1usize, 0u32), (1, 37), (5, 3)] {
            let mut mem = HostMemory::default();
            let (heads, kv_heads, d) = (6, 2, 64);
            let rows = q_position as usize + n;
            let q = mem
                .f32_tensor(&[n, heads * d], &rng.vec(n * heads * d, 1.0))
                .unwrap();
            let k = mem.zeros(DType::F16, &[rows, kv_heads * d]).unwrap();
            let v = mem.zeros(DType::F16, &[rows, kv_heads * d]).unwrap();
            mem.set_f32(&k, &rng.vec(rows * kv_heads * d, 1.0)).unwrap();
            mem.set_f32(&v, &rng.vec(rows * kv_heads * d, 1.0)).unwrap();
            let h = mem.zeros(DType::F32, &[n, heads * d]).unwrap();
            let fused_out = mem.zeros(act, &[n, heads * d]).unwrap();
            let chain_out = mem.zeros(act, &[n, heads * d]).unwrap();
            let params = AttentionParams {
                heads,
                kv_heads,
                head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
                q_position,
                window: None,
                ring: None,
                softcap: 0.0,
                kv_capacity: 0,
                flash: true,
            };
            let fused = node(
                Op::AttentionQuantize(params),
                vec![q, k, v],
                vec![fused_out],
            );
            assert!(cpu::supports(&fused).is_err(), "the CPU must not fuse it");
            let got = run_cpu(&fused, &mem, 3);
            let mid = run_cpu(
                &node(Op::Attention(params), vec![q, k, v], vec![h]),
                &mem,
                3,
            );
            let want = run_cpu(&node(Op::QuantizeRows, vec![h], vec![chain_out]), &mid, 3);
            assert_eq!(
                got.bytes(&fused_out),
                want.bytes(&chain_out),
                "attention+quantize -> {act}, n = {n}, at {q_position}"
            );
        }
    }
}

/// `matmul+rope+set_rows` and its shorter forms (made by the fusion pass
/// for GPUs, run whole on the CPU) equal their chains, bit for bit.
#[test]
fn matmul_rows_equals_its_chain() {
    let mut rng = Rng::new(43);
    let (m, k) = (128, 256);
    let rope = RopeParams::plain(RopeMode::Normal, 64, 64, 10000.0);
    for (with_rope, cache) in [(true, false), (false, true), (true, true)] {
        let mut mem = HostMemory::default();
        let w = mem.f32_tensor(&[m, k], &rng.vec(m * k, 1.0)).unwrap();
        let x = mem.f32_tensor(&[1, k], &rng.vec(k, 1.0)).unwrap();
        let pos = mem
            .tensor(DType::I32, &[1], bytemuck::cast_slice(&[5i32]))
            .unwrap();
        let h = mem.zeros(DType::F32, &[1, m]).unwrap();
        let r = mem.zeros(DType::F32, &[1, m]).unwrap();
        let dims: &[usize] = if cache { &[8, m] } else { &[1, m] };
        let dt = if cache { DType::F16 } else { DType::F32 };
        let fused_out = mem.zeros(dt, dims).unwrap();
        let chain_out = mem.zeros(dt, dims).unwrap();
        let write = cache.then_some(weft_ops::RowsWrite {
            start: 3,
            ring: None,
        });
        let mut inputs = vec![x, w];
        if with_rope {
            inputs.push(pos);
        }
        let fused = node(
            Op::MatMulRows {
                rope: with_rope.then_some(rope),
                write,
            },
            inputs,
            vec![fused_out],
        );
        assert!(cpu::supports(&fused).is_err(), "the CPU must not fuse it");
        let got = run_cpu(&fused, &mem, 3);
        let mut m1 = run_cpu(&node(Op::MatMul, vec![x, w], vec![h]), &mem, 3);
        let mut last = h;
        if with_rope {
            let dst = if cache { r } else { chain_out };
            m1 = run_cpu(&node(Op::Rope(rope), vec![h, pos], vec![dst]), &m1, 3);
            last = dst;
        }
        if cache {
            let set = Op::SetRows {
                start: 3,
                ring: None,
            };
            m1 = run_cpu(&node(set, vec![last], vec![chain_out]), &m1, 3);
        }
        assert_eq!(
            got.bytes(&fused_out),
            m1.bytes(&chain_out),
            "{}",
            fused.op.name()
        );
    }
}

/// The feed-forward's middle fused (gate projection, optionally the up
/// projection, silu_mul, quantize), run whole on the CPU, equals its chain.
#[test]
fn matmul_silu_quantize_equals_its_chain() {
    let mut rng = Rng::new(47);
    let (m, k) = (64, 128);
    for up in [true, false] {
        let mut mem = HostMemory::default();
        let x = mem.f32_tensor(&[1, k], &rng.vec(k, 1.0)).unwrap();
        let wg = mem.f32_tensor(&[m, k], &rng.vec(m * k, 1.0)).unwrap();
        let wu = mem.f32_tensor(&[m, k], &rng.vec(m * k, 1.0)).unwrap();
        let g = mem.zeros(DType::F32, &[1, m]).unwrap();
        let u = mem.zeros(DType::F32, &[1, m]).unwrap();
        let fused_out = mem.zeros(DType::Q8_1, &[1, m]).unwrap();
        let chain_out = mem.zeros(DType::Q8_1, &[1, m]).unwrap();
        let mem = run_cpu(&node(Op::MatMul, vec![x, wu], vec![u]), &mem, 3);
        let third = if up { wu } else { u };
        let fused = node(
            Op::MatMulSiluQuantize { up },
            vec![x, wg, third],
            vec![fused_out],
        );
        assert!(cpu::supports(&fused).is_err(), "the CPU must not fuse it");
        let got = run_cpu(&fused, &mem, 3);
        let m1 = run_cpu(&node(Op::MatMul, vec![x, wg], vec![g]), &mem, 3);
        let m2 = run_cpu(
            &node(Op::SiluMulQuantize, vec![g, u], vec![chain_out]),
            &m1,
            3,
        );
        assert_eq!(
            got.bytes(&fused_out),
            m2.bytes(&chain_out),
            "{}",
            fused.op.name()
        );
    }
}

/// Fast attention against the f64 reference: decode (cells split into
/// chunks, combined by log-sum-exp) at lengths from one chunk to many, and
/// prefill (blocks of 64 rows, a KV head's query heads together), with
/// windows, rings and soft-caps: within 1e-4 relative (floor 1e-2) for f32
/// and f16 caches alike, since both compute in f32 from the cached values;
/// the same bits whatever the thread count and item order.
#[test]
fn fast_attention_matches_reference() {
    let mut rng = Rng::new(41);
    // Head sizes that take the vector kernels whole (64, 256), partly (80:
    // a 16-lane tail) and not at all (40); query heads per KV head from 1
    // to 7 (passes of 4 and 3).
    let shapes = [(6, 2, 64), (4, 1, 256), (8, 8, 80), (14, 2, 64), (2, 1, 40)];
    for (shape, kv_dtype) in shapes
        .iter()
        .flat_map(|s| [(*s, DType::F32), (*s, DType::F16)])
    {
        for (n, q_position, window, ring, softcap) in [
            (1, 0, None, None, 0.0),
            (1, 9, None, None, 0.0),
            (1, 700, None, None, 0.0),
            (2, 3000, None, None, 0.0),
            (1, 1100, Some(300), None, 0.0),
            (3, 900, Some(128), Some(256), 0.0),
            (4, 2500, None, None, 30.0),
            (5, 0, None, None, 0.0),
            (64, 0, None, None, 0.0),
            (100, 37, None, None, 0.0),
            (300, 200, Some(96), None, 0.0),
            (130, 400, Some(128), Some(256), 0.0),
            (200, 1000, None, None, 50.0),
        ]
        .into_iter()
        .enumerate()
        .filter(|(i, _)| shape == shapes[0] || i % 2 == 0 || *i == 5)
        .map(|(_, c)| c)
        {
            let mut mem = HostMemory::default();
            let (heads, kv_heads, d) = shape;
            let rows = ring.map_or(q_position as usize + n, |r| r as usize);
            let q = mem
                .f32_tensor(&[n, heads * d], &rng.vec(n * heads * d, 1.0))
                .unwrap();
            let k = mem.zeros(kv_dtype, &[rows, kv_heads * d]).unwrap();
            let v = mem.zeros(kv_dtype, &[rows, kv_heads * d]).unwrap();
            mem.set_f32(&k, &rng.vec(rows * kv_heads * d, 1.0)).unwrap();
            mem.set_f32(&v, &rng.vec(rows * kv_heads * d, 1.0)).unwrap();
            let o = mem.zeros(DType::F32, &[n, heads * d]).unwrap();
            let params = AttentionParams {
                heads,
                kv_heads,
                head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
                q_position,
                window,
                ring,
                softcap,
                kv_capacity: 0,
                // Fast numerics keeps neither of llama.cpp's two orders.
                flash: q_position % 2 == 0,
            };
            let node = node(Op::Attention(params), vec![q, k, v], vec![o]);
            let want = run_ref(&node, &mem).to_f32(&o).unwrap();
            let first = run_cpu_in(&node, &mem, 1, Numerics::Fast)
                .to_f32(&o)
                .unwrap();
            let mut worst = 0f32;
            for (a, b) in first.iter().zip(&want) {
                let e = (a - b).abs() / (b.abs() + 1e-2);
                assert!(e.is_finite(), "non-finite result {a} vs {b}");
                worst = worst.max(e);
            }
            let what = format!(
                "{kv_dtype} {shape:?} n={n} at {q_position} window {window:?} ring {ring:?}"
            );
            assert!(worst <= 1e-4, "fast attention {what}: worst {worst}");
            for threads in [2, 7] {
                let again = run_cpu_in(&node, &mem, threads, Numerics::Fast)
                    .to_f32(&o)
                    .unwrap();
                assert!(
                    again
                        .iter()
                        .zip(&first)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "fast attention {what}: bits differ with {threads} threads"
                );
            }
        }
    }
}
