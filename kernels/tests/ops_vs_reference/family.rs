//! The family-module ops (`weft_ops::family`) against their references:
//! tail rope, hyper connections, the compressor, the indexer and sink
//! attention, and the expert-routing ops.

use super::*;

fn i32_tensor(mem: &mut HostMemory, dims: &[usize], values: &[i32]) -> Tensor {
    mem.tensor(DType::I32, dims, bytemuck::cast_slice(values))
        .unwrap()
}

#[test]
fn tail_rope_matches_reference() {
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
fn hyper_connections_match_reference() {
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
fn compress_matches_reference() {
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
fn indexer_and_sink_attention_match_reference() {
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
fn moe_ops_match_reference() {
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
