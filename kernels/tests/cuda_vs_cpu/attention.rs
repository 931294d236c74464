//! Attention against the CPU: the three variants, the fused quantize, decode
//! over the whole cache, soft-capping, the projected qkv form, and the
//! exponential ports the kernels share with glibc and the CPU.

use super::*;

/// An attention case: `n` query rows at `q_position`, a cache view of
/// `kv_rows` rows (filled with random values everywhere).
#[allow(clippy::too_many_arguments)]
fn attention_case(
    rng: &mut Rng,
    mem: &mut HostMemory,
    kv: DType,
    heads: usize,
    kv_heads: usize,
    d: usize,
    n: usize,
    q_position: u32,
    kv_rows: usize,
    window: Option<u32>,
    ring: Option<u32>,
    softcap: f32,
) -> weft_ops::OpNode {
    let q = mem
        .f32_tensor(&[n, heads * d], &rng.vec(n * heads * d, 1.5))
        .unwrap();
    let k = mem.zeros(kv, &[kv_rows, kv_heads * d]).unwrap();
    let v = mem.zeros(kv, &[kv_rows, kv_heads * d]).unwrap();
    mem.set_f32(&k, &rng.vec(kv_rows * kv_heads * d, 1.5))
        .unwrap();
    mem.set_f32(&v, &rng.vec(kv_rows * kv_heads * d, 1.0))
        .unwrap();
    let o = mem.zeros(DType::F32, &[n, heads * d]).unwrap();
    let p = AttentionParams {
        heads,
        kv_heads,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        q_position,
        window,
        ring,
        softcap,
        kv_capacity: 0,
        flash: true,
    };
    node(Op::Attention(p), vec![q, k, v], vec![o])
}

#[test]
fn attention_bit_exact_in_all_three_variants() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(11);
    let mut failures = Vec::new();
    // (kv, heads, kv_heads, d, n, q_position, window, ring)
    let mut cases = Vec::new();
    for kv in [DType::F16, DType::F32] {
        // decode: one chunk (n_kv < 512) and split KV (n_kv >= 512); the
        // one-pass path's groups of 8 cells (whole, odd and empty tails)
        for qp in [0u32, 7, 9, 15, 16, 23, 63, 255, 256, 300, 511, 700, 1023] {
            cases.push((kv, 9, 3, 64, 1, qp, None, None));
        }
        // one-pass decode: wider heads, a window, a ring (the slot this
        // step wrote in the middle of the cells)
        cases.push((kv, 4, 1, 256, 1, 40, None, None));
        cases.push((kv, 8, 2, 128, 1, 100, None, None));
        cases.push((kv, 6, 2, 64, 1, 200, Some(50), None));
        cases.push((kv, 6, 2, 64, 1, 20, Some(8), Some(12)));
        // short prefill (one chunk), tiled, tiled + one-chunk remainder
        for (n, qp) in [
            (5, 0),
            (37, 20),
            (64, 0),
            (100, 30),
            (130, 0),
            (520, 0),
            (600, 7),
        ] {
            cases.push((kv, 9, 3, 64, n, qp, None, None));
        }
        // windows and rings
        cases.push((kv, 6, 2, 64, 4, 20, Some(8), Some(12)));
        cases.push((kv, 6, 2, 64, 3, 5, Some(4), None));
        cases.push((kv, 6, 2, 64, 100, 40, Some(50), None));
        cases.push((kv, 6, 2, 64, 1, 900, Some(512), Some(512)));
        cases.push((kv, 4, 4, 64, 70, 100, Some(64), Some(96)));
        // wider heads (Gemma 3: 4 heads over 1, head size 256)
        cases.push((kv, 4, 1, 256, 1, 600, None, None));
        cases.push((kv, 4, 1, 256, 9, 3, None, None));
        cases.push((kv, 4, 1, 256, 80, 0, Some(512), None));
        cases.push((kv, 8, 2, 128, 66, 10, None, None));
        // head sizes that are not multiples of 64 (partly idle threads)
        cases.push((kv, 4, 2, 96, 70, 5, None, None));
        cases.push((kv, 4, 2, 32, 64, 0, None, None));
        cases.push((kv, 2, 1, 192, 65, 0, Some(40), None));
    }
    for (kv, heads, kvh, d, n, qp, window, ring) in cases {
        let mut mem = HostMemory::default();
        let rows = ring.map_or(qp as usize + n, |r| r as usize);
        let nd = attention_case(
            &mut rng, &mut mem, kv, heads, kvh, d, n, qp, rows, window, ring, 0.0,
        );
        let what = format!(
            "attention {kv} h{heads}/{kvh} d{d} n={n} pos={qp} window={window:?} ring={ring:?}"
        );
        poison_outputs(&nd, &mut mem);
        let want = run_cpu(&nd, &mem);
        let got = run_gpu(g, &nd, &mem);
        if let Err(e) =
            std::panic::catch_unwind(|| assert_same(&what, DType::F32, &got[0], &want[0]))
        {
            eprintln!(
                "{}",
                e.downcast_ref::<String>().cloned().unwrap_or_default()
            );
            failures.push(what);
        }
    }
    assert!(failures.is_empty(), "attention mismatches: {failures:?}");
}

/// Attention fused with quantize (the one-chunk kernel writes Q8_0 / Q8_1
/// blocks): the CPU's attention then quantize, bit for bit.
#[test]
fn attention_quantize_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(23);
    for kv in [DType::F16, DType::F32] {
        for act in [DType::Q8_1, DType::Q8_0] {
            for (heads, kvh, d, n, qp) in [
                (9, 3, 64, 1, 0u32),
                (9, 3, 64, 1, 200),
                (9, 3, 64, 1, 700),
                (4, 1, 256, 1, 40),
                (9, 3, 64, 7, 40),
                (4, 1, 256, 1, 300),
            ] {
                let mut mem = HostMemory::default();
                let rows = qp as usize + n;
                let a = attention_case(
                    &mut rng, &mut mem, kv, heads, kvh, d, n, qp, rows, None, None, 0.0,
                );
                let Op::Attention(p) = a.op else {
                    unreachable!()
                };
                let out = mem.zeros(act, &[n, heads * d]).unwrap();
                let nd = node(Op::AttentionQuantize(p), a.inputs.clone(), vec![out]);
                let what =
                    format!("attention+quantize {kv} -> {act} h{heads}/{kvh} d{d} n={n} pos={qp}");
                check_exact(g, &what, &nd, &mut mem);
            }
        }
    }
}

#[test]
fn attention_decode_over_the_whole_cache_with_step_scalars() {
    // A decode replay passes the whole cache as the K/V views and the real
    // extent in the step scalars; the result must equal the node recorded
    // with the natural view.
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(12);
    let capacity = 1024;
    for kv in [DType::F16, DType::F32] {
        for qp in [3u32, 255, 256, 511, 777] {
            let mut mem = HostMemory::default();
            let whole = attention_case(
                &mut rng, &mut mem, kv, 9, 3, 64, 1, qp, capacity, None, None, 0.0,
            );
            let (q, k, v, o) = (
                whole.inputs[0],
                whole.inputs[1],
                whole.inputs[2],
                whole.outputs[0],
            );
            let natural_rows = qp as usize + 1;
            let kn = k.rows_view(0, natural_rows).unwrap();
            let vn = v.rows_view(0, natural_rows).unwrap();
            let Op::Attention(p) = whole.op else {
                unreachable!()
            };
            let natural = node(Op::Attention(p), vec![q, kn, vn], vec![o]);
            poison_outputs(&natural, &mut mem);
            let want = run_cpu(&natural, &mem);
            let scalars = g.kernels.step_scalars(&natural);
            let got = run_gpu_with(Some(g), &whole, &mem, Some(scalars));
            assert_same(
                &format!("attention {kv} whole-cache decode at {qp}"),
                DType::F32,
                &got[0],
                &want[0],
            );
        }
    }
}

#[test]
fn attention_softcap_within_tolerance() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(13);
    for (n, qp) in [(1, 40), (7, 0), (70, 3)] {
        let mut mem = HostMemory::default();
        let nd = attention_case(
            &mut rng,
            &mut mem,
            DType::F16,
            4,
            2,
            64,
            n,
            qp,
            qp as usize + n,
            None,
            None,
            30.0,
        );
        let want = run_cpu(&nd, &mem);
        let got = run_gpu(g, &nd, &mem);
        let e = max_rel(&got[0], &want[0], 1e-2);
        println!("attention softcap n={n}: max rel error {e:e}");
        assert!(e < 2e-2, "softcap attention error {e}");
    }
}

/// glibc 2.36's `expf` (x86-64 `__expf_fma`), the reference llama.cpp ran
/// with; equal to that glibc's `expf` on all 2^32 inputs (checked on the
/// development machine).
fn glibc_236_expf(x: f32) -> f32 {
    const TAB: [u64; 32] = [
        0x3ff0000000000000,
        0x3fefd9b0d3158574,
        0x3fefb5586cf9890f,
        0x3fef9301d0125b51,
        0x3fef72b83c7d517b,
        0x3fef54873168b9aa,
        0x3fef387a6e756238,
        0x3fef1e9df51fdee1,
        0x3fef06fe0a31b715,
        0x3feef1a7373aa9cb,
        0x3feedea64c123422,
        0x3feece086061892d,
        0x3feebfdad5362a27,
        0x3feeb42b569d4f82,
        0x3feeab07dd485429,
        0x3feea47eb03a5585,
        0x3feea09e667f3bcd,
        0x3fee9f75e8ec5f74,
        0x3feea11473eb0187,
        0x3feea589994cce13,
        0x3feeace5422aa0db,
        0x3feeb737b0cdc5e5,
        0x3feec49182a3f090,
        0x3feed503b23e255d,
        0x3feee89f995ad3ad,
        0x3feeff76f2fb5e47,
        0x3fef199bdd85529c,
        0x3fef3720dcef9069,
        0x3fef5818dcfba487,
        0x3fef7c97337b9b5f,
        0x3fefa4afa2a490da,
        0x3fefd0765b6e4540,
    ];
    let n = 32.0f64;
    let invln2n = f64::from_bits(0x3ff71547652b82fe) * n;
    let shift = f64::from_bits(0x4338000000000000);
    let c0 = f64::from_bits(0x3fac6af84b912394) / n / n / n;
    let c1 = f64::from_bits(0x3fcebfce50fac4f3) / n / n;
    let c2 = f64::from_bits(0x3fe62e42ff0c52d6) / n;
    let ux = x.to_bits();
    let abstop = (ux >> 20) & 0x7ff;
    if abstop >= 0x42b {
        if ux == 0xff800000 {
            return 0.0;
        }
        if abstop >= 0x7f8 {
            return x + x;
        }
        if x > f32::from_bits(0x42b17217) {
            return f32::INFINITY;
        }
        if x < f32::from_bits(0xc2cff1b4) {
            return 0.0;
        }
    }
    let xd = x as f64;
    let kd0 = invln2n.mul_add(xd, shift);
    let ki = kd0.to_bits();
    let kd = kd0 - shift;
    let r = invln2n.mul_add(xd, -kd);
    let s = f64::from_bits(TAB[(ki % 32) as usize].wrapping_add(ki << 47));
    let z = c0.mul_add(r, c1);
    let r2 = r * r;
    let y = c2.mul_add(r, 1.0);
    let y = z.mul_add(r2, y);
    (y * s) as f32
}

#[test]
fn glibc_expf_port_matches_glibc() {
    let Some(g) = gpu() else { return };
    let stream = g.stream();
    let mut rng = Rng::new(14);
    let mut batch: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        88.0,
        88.72,
        88.7228,
        89.0,
        -87.0,
        -103.0,
        -103.97,
        -104.0,
        -150.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        1e-30,
        -1e-30,
    ];
    batch.extend((0..1_000_000).map(|_| rng.val(110.0)));
    let (mut checked, mut port_bad, mut host_bad) = (0usize, 0usize, 0usize);
    let (mut first_port, mut first_host) = (None, None);
    while checked < 100_000_000 {
        let got = weft_kernels::cuda::testing::glibc_expf(&g.kernels, &stream, &batch).unwrap();
        for (x, y) in batch.iter().zip(&got) {
            let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            let port = glibc_236_expf(*x);
            if !same(port, *y) {
                port_bad += 1;
                first_port.get_or_insert((*x, *y, port));
            }
            if !same(x.exp(), port) {
                host_bad += 1;
                first_host.get_or_insert((*x, x.exp(), port));
            }
        }
        checked += batch.len();
        batch = (0..9_900_000)
            .map(|i| {
                if i % 2 == 0 {
                    f32::from_bits(rng.next() as u32)
                } else {
                    -rng.unit() * 40.0
                }
            })
            .collect();
    }
    println!("glibc expf: {checked} inputs; device vs glibc-2.36 port: {port_bad} differ (first {first_port:?})");
    if host_bad > 0 {
        println!(
            "NOTE: this machine's libm expf differs from glibc 2.36's on {host_bad} inputs (first {first_host:?}): \
             CPU-vs-CUDA comparisons of attention and softmax here inherit that difference"
        );
    } else {
        println!("this machine's libm expf equals glibc 2.36's on every input checked");
    }
    assert_eq!(port_bad, 0, "expf port: first difference {first_port:?}");
}

#[test]
fn v_expf_port_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    let stream = g.stream();
    let mut rng = Rng::new(15);
    let mut xs: Vec<f32> = (0..4_000_000)
        .map(|_| f32::from_bits(rng.next() as u32))
        .collect();
    xs.extend((0..4_000_000).map(|_| rng.val(120.0)));
    xs.extend([
        0.0,
        -0.0,
        192.0,
        -192.0,
        1e-40,
        -87.5,
        88.9,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]);
    let got = weft_kernels::cuda::testing::v_expf(&g.kernels, &stream, &xs).unwrap();
    let mut bad = 0;
    for (x, y) in xs.iter().zip(&got) {
        let want = weft_kernels::cpu::simd::v_expf(*x);
        if want.to_bits() != y.to_bits() && !(want.is_nan() && y.is_nan()) {
            bad += 1;
            if bad < 5 {
                eprintln!("v_expf({x:e}): gpu {y:e} cpu {want:e}");
            }
        }
    }
    assert_eq!(bad, 0, "{bad} v_expf mismatches");
}

/// Decode attention with its q/k/v projections in one node (what the
/// fusion pass makes of a layer's `matmul+rope`, `matmul+rope+set_rows`,
/// `matmul+set_rows` and `attention+quantize`): the CPU's chain bit for
/// bit, with the key and value projections absorbed or not, in the
/// one-pass decode body (short contexts) and the general one (700 cells),
/// over the natural cache views and over the whole cache with the step
/// scalars (as a replayed decode graph runs it).
#[test]
fn qkv_attention_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(53);
    let (heads, kvh, d, k, capacity) = (9usize, 3usize, 64usize, 576usize, 1024usize);
    for wdtype in [DType::Q4_1, DType::Q8_0, DType::Q4_0, DType::Q5_0] {
        for act in [DType::Q8_1, DType::Q8_0] {
            for (qp, absorb) in [(0u32, 2), (40, 2), (200, 1), (511, 2), (700, 2), (63, 0)] {
                let mut mem = HostMemory::default();
                let adtype = vec_dot_type(wdtype);
                let x = mem
                    .tensor(adtype, &[1, k], &quantized(adtype, &rng.rows(1, k)))
                    .unwrap();
                let pos = mem
                    .tensor(DType::I32, &[1], bytemuck::cast_slice(&[qp as i32]))
                    .unwrap();
                let mut cache = |mem: &mut HostMemory| {
                    let c = mem.zeros(DType::F16, &[capacity, kvh * d]).unwrap();
                    mem.set_f32(&c, &rng.vec(capacity * kvh * d, 1.0)).unwrap();
                    c
                };
                let (kc, vc) = (cache(&mut mem), cache(&mut mem));
                let wq = weights(&mut rng, &mut mem, wdtype, heads * d, k);
                let wk = weights(&mut rng, &mut mem, wdtype, kvh * d, k);
                let wv = weights(&mut rng, &mut mem, wdtype, kvh * d, k);
                let q = mem.zeros(DType::F32, &[1, heads * d]).unwrap();
                let out = mem.zeros(act, &[1, heads * d]).unwrap();
                let rope = RopeParams::plain(RopeMode::Normal, d, d, 10000.0);
                let write = Some(weft_ops::RowsWrite {
                    start: qp,
                    ring: None,
                });
                let rows = |rope, write, ins, out| {
                    let bias = false;
                    node(Op::MatMulRows { rope, write, bias }, ins, vec![out])
                };
                let qn = rows(Some(rope), None, vec![x, wq, pos], q);
                let kn = rows(Some(rope), write, vec![x, wk, pos], kc);
                let vn = rows(None, write, vec![x, wv], vc);
                let natural = qp as usize + 1;
                for (view_rows, whole) in [(natural, false), (capacity, true)] {
                    let p = decode_params(heads, kvh, d, qp, capacity);
                    let (kview, vview) = (
                        kc.rows_view(0, view_rows).unwrap(),
                        vc.rows_view(0, view_rows).unwrap(),
                    );
                    let an = node(Op::AttentionQuantize(p), vec![q, kview, vview], vec![out]);
                    let mut fused = weft_ops::fused::fuse_pair(&qn, &an, false).expect("q fuses");
                    for part in [&kn, &vn].into_iter().take(absorb) {
                        fused = weft_ops::fused::fuse_pair(part, &fused, true).expect("k/v fuse");
                    }
                    fused.validate().expect("valid fused node");
                    let what = format!(
                        "qkv+attention {wdtype} -> {act} pos={qp} absorbed={absorb} whole={whole}"
                    );
                    if !whole {
                        // The CPU runs the fused node as the recorded chain.
                        poison_outputs(&fused, &mut mem);
                        let got = run_cpu(&fused, &mem);
                        let mut chain = mem.clone();
                        let absorbed = [&kn, &vn].into_iter().take(absorb);
                        for part in [&qn].into_iter().chain(absorbed).chain([&an]) {
                            let outs = run_cpu(part, &chain);
                            for (t, b) in part.outputs.iter().zip(outs) {
                                chain.bytes_mut(t).copy_from_slice(&b);
                            }
                        }
                        for (i, t) in fused.outputs.iter().enumerate() {
                            let what = format!("{what}: the chain's output {i}");
                            assert_same(&what, t.dtype, &got[i], chain.bytes(t));
                        }
                    }
                    if !whole {
                        check_exact(g, &what, &fused, &mut mem);
                        continue;
                    }
                    // The whole cache as the views, the extent in the step
                    // scalars: the natural node's results.
                    let mut nat = fused.clone();
                    nat.inputs[1] = kc.rows_view(0, natural).unwrap();
                    nat.inputs[2] = vc.rows_view(0, natural).unwrap();
                    poison_outputs(&nat, &mut mem);
                    let want = run_cpu(&nat, &mem);
                    let got = match g {
                        Some(g) => {
                            let scalars = g.kernels.step_scalars(&nat);
                            run_gpu_with(Some(g), &fused, &mem, Some(scalars))
                        }
                        None => want.clone(),
                    };
                    for (i, t) in nat.outputs.iter().enumerate() {
                        assert_same(&format!("{what} (output {i})"), t.dtype, &got[i], &want[i]);
                    }
                }
            }
        }
    }
}
