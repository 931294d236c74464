//! Quantization and the matmul family against the CPU: every weight format,
//! the output matvec, row-wise matmuls with their rope and cache writes,
//! grouped decode matvecs and the fused matmul-SiLU-quantize.

use super::*;

#[test]
fn quantize_rows_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(1);
    for dtype in [
        DType::Q8_0,
        DType::Q8_1,
        DType::Q8_K,
        DType::F16,
        DType::BF16,
    ] {
        for (rows, cols) in [(1, 576), (7, 1536), (3, 2048), (64, 256)] {
            if dtype.row_bytes(cols).is_none() {
                continue;
            }
            let mut mem = HostMemory::default();
            let mut v = rng.rows(rows, cols);
            v[..32].fill(0.0); // one all-zero block: the amax == 0 path
            let x = mem.f32_tensor(&[rows, cols], &v).unwrap();
            let o = mem.zeros(dtype, &[rows, cols]).unwrap();
            let n = node(Op::QuantizeRows, vec![x], vec![o]);
            check_exact(g, &format!("quantize {dtype} {rows}x{cols}"), &n, &mut mem);
        }
    }
}

#[test]
fn matmul_bit_exact_every_format() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(2);
    let formats = [
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q4_K,
        DType::Q6_K,
        DType::F32,
        DType::F16,
        DType::BF16,
    ];
    let mut failures = Vec::new();
    for wdtype in formats {
        let k_list: &[usize] = match wdtype {
            // 4864: Qwen2.5's feed-forward rows (19 super-blocks; Q6_K rows
            // end inside a 16-byte piece).
            DType::Q4_K | DType::Q6_K => &[256, 1536, 4864],
            // 16420: DeepSeek-V4's mixer rows (16384) plus a tail.
            DType::F32 | DType::F16 | DType::BF16 => &[576, 100, 1536, 16420],
            _ => &[576, 1536, 2400],
        };
        for &k in k_list {
            // (100, 1): a decode matvec whose last block of rows is partial.
            for (m, n) in [
                (576, 1),
                (192, 1),
                (100, 1),
                (100, 3),
                (576, 5),
                (64, 64),
                (132, 130),
            ] {
                for f32_input in [false, true] {
                    let mut mem = HostMemory::default();
                    let w = weights(&mut rng, &mut mem, wdtype, m, k);
                    let adtype = vec_dot_type(wdtype);
                    let act = rng.rows(n, k);
                    let x = if f32_input || adtype == DType::F32 {
                        mem.f32_tensor(&[n, k], &act).unwrap()
                    } else {
                        let bytes: Vec<u8> =
                            act.chunks(k).flat_map(|r| quantized(adtype, r)).collect();
                        mem.tensor(adtype, &[n, k], &bytes).unwrap()
                    };
                    let o = mem.zeros(DType::F32, &[n, m]).unwrap();
                    let nd = node(Op::MatMul, vec![x, w], vec![o]);
                    let what = format!("matmul {wdtype} m={m} k={k} n={n} x={}", x.dtype);
                    poison_outputs(&nd, &mut mem);
                    let want = run_cpu(&nd, &mem);
                    let got = run_gpu(g, &nd, &mem);
                    if let Err(e) = std::panic::catch_unwind(|| {
                        assert_same(&what, DType::F32, &got[0], &want[0])
                    }) {
                        let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
                        eprintln!("{msg}");
                        failures.push(what);
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "matmul mismatches: {failures:?}");
}

/// Tall Q8_0 matvecs (the tied output projection and others of 8192 rows
/// or more) take the staged kernel, alone and as a one-node group; a last
/// block of fewer than 32 rows, rows ending inside a 16-byte piece, and
/// long rows (more shared memory than the default limit).
#[test]
fn smollm2_output_matvec_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(3);
    for (m, k) in [(49152, 576), (8200, 64), (8223, 1344), (8224, 2048)] {
        let mut mem = HostMemory::default();
        let w = weights(&mut rng, &mut mem, DType::Q8_0, m, k);
        let x = mem.f32_tensor(&[1, k], &rng.rows(1, k)).unwrap();
        let o = mem.zeros(DType::F32, &[1, m]).unwrap();
        let n = node(Op::MatMul, vec![x, w], vec![o]);
        check_exact(g, &format!("matmul q8_0 {m}x{k}"), &n, &mut mem);
        let xq = mem
            .tensor(
                DType::Q8_0,
                &[1, k],
                &quantized(DType::Q8_0, &rng.rows(1, k)),
            )
            .unwrap();
        let n = node(Op::MatMul, vec![xq, w], vec![o]);
        poison_outputs(&n, &mut mem);
        let got = run_gpu_group(g, std::slice::from_ref(&n), &mem);
        let want = run_cpu(&n, &mem).remove(0);
        assert_same(
            &format!("matmul q8_0 {m}x{k} (group of one)"),
            DType::F32,
            &got[0],
            &want,
        );
    }
}

/// A decode matvec fused with its rows' consumer (rope, a cache write, or
/// both): the CPU's matmul, rope and set_rows, bit for bit; rotated heads of
/// 64 with all or half of their dimensions rotated, f32/f16/bf16 caches, a
/// ring, and short and long rows.
#[test]
fn matmul_rows_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(31);
    for wdtype in [DType::Q4_1, DType::Q8_0, DType::Q4_0, DType::Q5_0] {
        for (m, k) in [(192, 576), (576, 1536)] {
            let adtype = vec_dot_type(wdtype);
            for n_dims in [64, 32] {
                let rope = RopeParams::plain(RopeMode::Normal, 64, n_dims, 100000.0);
                for (cache, start, ring) in [
                    (None, 0u32, None),
                    (Some(DType::F16), 7, None),
                    (Some(DType::F32), 40, Some(16u32)),
                    (Some(DType::BF16), 3, None),
                ] {
                    for (with_rope, bias) in
                        [(true, false), (false, false), (true, true), (false, true)]
                    {
                        if !with_rope && cache.is_none() && !bias {
                            continue;
                        }
                        let mut mem = HostMemory::default();
                        let w = weights(&mut rng, &mut mem, wdtype, m, k);
                        let act = rng.rows(1, k);
                        let x = mem
                            .tensor(adtype, &[1, k], &quantized(adtype, &act))
                            .unwrap();
                        let pos = mem
                            .tensor(DType::I32, &[1], bytemuck::cast_slice(&[start as i32 + 3]))
                            .unwrap();
                        let out = match cache {
                            None => mem.zeros(DType::F32, &[1, m]).unwrap(),
                            Some(d) => {
                                let c = mem.zeros(d, &[48, m]).unwrap();
                                mem.set_f32(&c, &rng.vec(48 * m, 1.0)).unwrap();
                                c
                            }
                        };
                        let write = cache.map(|_| weft_ops::RowsWrite { start, ring });
                        let (mut inputs, rope_p) = if with_rope {
                            (vec![x, w, pos], Some(rope))
                        } else {
                            (vec![x, w], None)
                        };
                        if bias {
                            inputs.push(mem.f32_tensor(&[m], &rng.vec(m, 1.0)).unwrap());
                        }
                        let nd = node(
                            Op::MatMulRows {
                                rope: rope_p,
                                write,
                                bias,
                            },
                            inputs,
                            vec![out],
                        );
                        let what = format!(
                            "{} {wdtype} {m}x{k} rope dims {n_dims} cache {cache:?} at {start} ring {ring:?}",
                            nd.op.name()
                        );
                        check_exact(g, &what, &nd, &mut mem);
                    }
                }
            }
        }
    }
}

/// Decode matvecs of one activation row in one launch (a layer's q, k and
/// v): every node's output bit for bit the CPU's, for rope-only, rope and
/// cache write, cache write only (a ring) and plain nodes, groups of two and
/// three, short and long rows.
#[test]
fn grouped_decode_matvecs_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(41);
    for wdtype in [DType::Q4_1, DType::Q8_0, DType::Q4_0, DType::Q5_0] {
        for k in [576, 1536] {
            let adtype = vec_dot_type(wdtype);
            let mut mem = HostMemory::default();
            let act = rng.rows(1, k);
            let x = mem
                .tensor(adtype, &[1, k], &quantized(adtype, &act))
                .unwrap();
            let pos = mem
                .tensor(DType::I32, &[1], bytemuck::cast_slice(&[21i32]))
                .unwrap();
            let rope = RopeParams::plain(RopeMode::Normal, 64, 64, 100000.0);
            let mut cache = |mem: &mut HostMemory, d: DType, m: usize| {
                let c = mem.zeros(d, &[24, m]).unwrap();
                mem.set_f32(&c, &rng.vec(24 * m, 1.0)).unwrap();
                c
            };
            let (kc, vc) = (
                cache(&mut mem, DType::F16, 192),
                cache(&mut mem, DType::BF16, 192),
            );
            let wq = weights(&mut rng, &mut mem, wdtype, 576, k);
            let wk = weights(&mut rng, &mut mem, wdtype, 192, k);
            let wv = weights(&mut rng, &mut mem, wdtype, 192, k);
            let wp = weights(&mut rng, &mut mem, wdtype, 40, k);
            let q = mem.zeros(DType::F32, &[1, 576]).unwrap();
            let p = mem.zeros(DType::F32, &[1, 40]).unwrap();
            // Qwen's q, k and v carry biases: the query's and the value's
            // here (the key's is plain).
            let (bq, bv) = (
                mem.f32_tensor(&[576], &rng.vec(576, 1.0)).unwrap(),
                mem.f32_tensor(&[1, 192], &rng.vec(192, 1.0)).unwrap(),
            );
            let rows = |rope, write, bias, ins, out| {
                node(Op::MatMulRows { rope, write, bias }, ins, vec![out])
            };
            let write = |start, ring| Some(weft_ops::RowsWrite { start, ring });
            let qn = rows(Some(rope), None, true, vec![x, wq, pos, bq], q);
            let kn = rows(Some(rope), write(21, None), false, vec![x, wk, pos], kc);
            let vn = rows(None, write(30, Some(16)), true, vec![x, wv, bv], vc);
            let pn = node(Op::MatMul, vec![x, wp], vec![p]);
            for group in [
                vec![qn.clone(), kn.clone(), vn.clone()],
                vec![vn.clone(), pn.clone()],
                vec![pn, kn, qn],
            ] {
                for n in &group {
                    poison_outputs(n, &mut mem);
                }
                let got = run_gpu_group(g, &group, &mem);
                for (n, got) in group.iter().zip(&got) {
                    let want = run_cpu(n, &mem).remove(0);
                    let what = format!(
                        "{} {wdtype} k={k} in a group of {}",
                        n.op.name(),
                        group.len()
                    );
                    assert_same(&what, n.outputs[0].dtype, got, &want);
                }
            }
        }
    }
}

/// The feed-forward's middle fused: gate projection (and up projection),
/// silu_mul and quantize, bit for bit with the CPU's chain; short and long
/// rows (two rounds of weight loads).
#[test]
fn matmul_silu_quantize_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(37);
    for wdtype in [DType::Q4_1, DType::Q8_0, DType::Q4_0, DType::Q5_0] {
        // Gate/up rows staged in shared memory (a cluster of two 16-row blocks)
        // where they fit in 48 KiB: all shapes here but Q8_0 at 1536 columns.
        for (m, k) in [(1536, 576), (96, 1024), (32, 64), (64, 1536)] {
            for out_dtype in [DType::Q8_1, DType::Q8_0] {
                for up in [true, false] {
                    let mut mem = HostMemory::default();
                    let adtype = vec_dot_type(wdtype);
                    let wg = weights(&mut rng, &mut mem, wdtype, m, k);
                    let third = if up {
                        weights(&mut rng, &mut mem, wdtype, m, k)
                    } else {
                        mem.f32_tensor(&[1, m], &rng.vec(m, 2.0)).unwrap()
                    };
                    let act = rng.rows(1, k);
                    let x = mem
                        .tensor(adtype, &[1, k], &quantized(adtype, &act))
                        .unwrap();
                    let out = mem.zeros(out_dtype, &[1, m]).unwrap();
                    let nd = node(Op::MatMulSiluQuantize { up }, vec![x, wg, third], vec![out]);
                    let what = format!("{} {wdtype} {m}x{k} -> {out_dtype}", nd.op.name());
                    check_exact(g, &what, &nd, &mut mem);
                }
            }
        }
    }
}
