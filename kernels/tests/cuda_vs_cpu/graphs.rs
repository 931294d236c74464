//! Captured CUDA graphs replayed with new step scalars, and the fused ops
//! against the CPU.

use super::*;

#[test]
fn captured_graph_replays_with_new_step_scalars() {
    // Capture a decode step's kernels (set_rows into the cache, attention
    // over the whole cache, rms_norm, a Q4_1 matvec) once, then replay it
    // for several positions, changing only the step buffers; compare each
    // replay with the CPU.
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(16);
    let capacity = 1024usize;
    let (heads, kvh, d) = (9, 3, 64);
    let mut mem = HostMemory::default();
    let q = mem
        .f32_tensor(&[1, heads * d], &rng.vec(heads * d, 1.0))
        .unwrap();
    let knew = mem
        .f32_tensor(&[1, kvh * d], &rng.vec(kvh * d, 1.0))
        .unwrap();
    let kc = mem.zeros(DType::F16, &[capacity, kvh * d]).unwrap();
    let vc = mem.zeros(DType::F16, &[capacity, kvh * d]).unwrap();
    mem.set_f32(&kc, &rng.vec(capacity * kvh * d, 1.0)).unwrap();
    mem.set_f32(&vc, &rng.vec(capacity * kvh * d, 1.0)).unwrap();
    let att = mem.zeros(DType::F32, &[1, heads * d]).unwrap();
    let w = mem
        .f32_tensor(&[heads * d], &rng.vec(heads * d, 1.0))
        .unwrap();
    let normed = mem.zeros(DType::F32, &[1, heads * d]).unwrap();
    let wq = weights(&mut rng, &mut mem, DType::Q4_1, 576, heads * d);
    let proj = mem.zeros(DType::F32, &[1, 576]).unwrap();
    let make = |qp: u32, view_rows: usize| {
        let p = decode_params(heads, kvh, d, qp, capacity);
        vec![
            node(
                Op::SetRows {
                    start: qp,
                    ring: None,
                },
                vec![knew],
                vec![kc],
            ),
            node(
                Op::Attention(p),
                vec![
                    q,
                    kc.rows_view(0, view_rows).unwrap(),
                    vc.rows_view(0, view_rows).unwrap(),
                ],
                vec![att],
            ),
            node(Op::RmsNorm { eps: 1e-5 }, vec![att, w], vec![normed]),
            node(Op::MatMul, vec![normed, wq], vec![proj]),
        ]
    };
    let stream = g.stream();
    let all = [q, knew, kc, vc, att, w, normed, wq, proj];
    let dev = DevMem::upload(&stream, &mem, &all);
    let captured = make(0, capacity);
    let scratch: Vec<_> = captured
        .iter()
        .map(|n| device_u8(&stream, g.kernels.scratch_bytes(n)))
        .collect();
    let mut steps: Vec<_> = captured.iter().map(|_| device_u8(&stream, 16)).collect();
    stream.synchronize().unwrap();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    for (i, n) in captured.iter().enumerate() {
        let ins: Vec<DeviceTensor> = n.inputs.iter().map(|t| dev.tensor(&stream, t)).collect();
        let outs: Vec<DeviceTensor> = n.outputs.iter().map(|t| dev.tensor(&stream, t)).collect();
        // SAFETY: all tensors are inside the uploaded buffers.
        unsafe {
            g.kernels
                .launch(
                    &stream,
                    n,
                    &ins,
                    &outs,
                    ptr_of(&stream, &scratch[i]),
                    ptr_of(&stream, &steps[i]),
                )
                .unwrap();
        }
    }
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a graph");
    let mut cpu_mem = mem.clone();
    for qp in [0u32, 1, 2, 100, 255, 256, 257, 600] {
        let nodes = make(qp, qp as usize + 1);
        for (i, n) in nodes.iter().enumerate() {
            let mut s = g.kernels.step_scalars(n);
            s.resize(4, 0);
            let bytes: &[u8] = bytemuck::cast_slice(&s);
            stream.memcpy_htod(bytes, &mut steps[i]).unwrap();
        }
        graph.launch().unwrap();
        stream.synchronize().unwrap();
        for n in &nodes {
            let outs = run_cpu(n, &cpu_mem);
            cpu_mem.bytes_mut(&n.outputs[0]).copy_from_slice(&outs[0]);
        }
        for t in [kc, att, normed, proj] {
            assert_same(
                &format!("replay at {qp}: {t:?}"),
                t.dtype,
                &dev.read(&stream, &t),
                cpu_mem.bytes(&t),
            );
        }
    }
}

#[test]
fn fused_ops_bit_exact() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(17);
    for act in [
        DType::Q8_1,
        DType::Q8_0,
        DType::Q8_K,
        DType::F16,
        DType::BF16,
    ] {
        // Up to 1024 values, Q8_0 / Q8_1 rows take the warp-per-block norm.
        for (rows, cols) in [
            (1, 1536),
            (5, 768),
            (33, 512),
            (2, 5120),
            (1, 576),
            (3, 640),
            (1, 1024),
            (2, 32),
        ] {
            if act == DType::Q8_K && cols % 256 != 0 {
                continue; // Q8_K rows are whole 256-element blocks
            }
            let mut mem = HostMemory::default();
            let x = mem
                .f32_tensor(&[rows, cols], &rng.rows(rows, cols))
                .unwrap();
            let u = mem
                .f32_tensor(&[rows, cols], &rng.rows(rows, cols))
                .unwrap();
            let b = mem
                .f32_tensor(&[rows, cols], &rng.rows(rows, cols))
                .unwrap();
            let b1 = mem.f32_tensor(&[1, cols], &rng.vec(cols, 1.0)).unwrap();
            let w = mem.f32_tensor(&[cols], &rng.vec(cols, 1.5)).unwrap();
            let q = mem.zeros(act, &[rows, cols]).unwrap();
            let what = |op: &str| format!("{op} -> {act} {rows}x{cols}");
            let n = node(Op::RmsNormQuantize { eps: 1e-5 }, vec![x, w], vec![q]);
            check_exact(g, &what("rms_norm_quantize"), &n, &mut mem);
            let n = node(Op::SiluMulQuantize, vec![x, u], vec![q]);
            check_exact(g, &what("silu_mul_quantize"), &n, &mut mem);
            let wb = mem.f32_tensor(&[cols], &rng.vec(cols, 2.0)).unwrap();
            for bb in [b, b1] {
                let n = node(
                    Op::AddRmsNormQuantize { eps: 1e-5 },
                    vec![x, bb, w],
                    vec![x, q],
                );
                check_exact(g, &what("add_rms_norm_quantize (in place)"), &n, &mut mem);
                // Gemma's post-norm, residual add and next pre-norm (the
                // CUDA kernel takes the warp-per-block shapes only; the
                // post-normed input has the residual's shape).
                if bb != b {
                    continue;
                }
                let n = node(
                    Op::NormAddRmsNormQuantize {
                        eps_b: 1e-6,
                        eps: 1e-5,
                    },
                    vec![x, bb, wb, w],
                    vec![x, q],
                );
                if matches!(act, DType::Q8_0 | DType::Q8_1) && cols <= 1024 {
                    check_exact(g, &what("norm_add_norm_quantize (in place)"), &n, &mut mem);
                }
            }
        }
    }
    for dst in [DType::F16, DType::F32, DType::BF16] {
        for (start, ring) in [(5u32, None), (60, Some(16u32))] {
            for mode in [RopeMode::Normal, RopeMode::Neox] {
                let mut mem = HostMemory::default();
                let (n, heads, d) = (3, 3, 64);
                let x = mem
                    .f32_tensor(&[n, heads * d], &rng.rows(n, heads * d))
                    .unwrap();
                let pos: Vec<i32> = (0..n as i32).map(|i| start as i32 + i).collect();
                let pt = mem
                    .tensor(DType::I32, &[n], bytemuck::cast_slice(&pos))
                    .unwrap();
                let cache = mem.zeros(dst, &[80, heads * d]).unwrap();
                mem.set_f32(&cache, &rng.vec(80 * heads * d, 1.0)).unwrap();
                let rope = RopeParams::plain(
                    mode,
                    d,
                    if mode == RopeMode::Neox { 32 } else { 64 },
                    100000.0,
                );
                let nd = node(
                    Op::RopeSetRows { rope, start, ring },
                    vec![x, pt],
                    vec![cache],
                );
                check_exact(
                    g,
                    &format!("rope_set_rows {dst} {mode:?} start {start} ring {ring:?}"),
                    &nd,
                    &mut mem,
                );
                if g.is_none() {
                    continue;
                }
                let other = node(
                    Op::RopeSetRows {
                        rope,
                        start: start + 7,
                        ring,
                    },
                    vec![x, pt],
                    vec![cache],
                );
                let want = run_cpu(&other, &mem);
                let got = run_gpu_with(g, &nd, &mem, Some(vec![start + 7]));
                assert_same(
                    &format!("rope_set_rows {dst} via step"),
                    dst,
                    &got[0],
                    &want[0],
                );
            }
        }
    }
}
