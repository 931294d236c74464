//! Each fused op against the chain of ops it replaces.

use super::*;

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
    for (with_rope, cache, bias) in [
        (true, false, false),
        (false, true, false),
        (true, true, false),
        (false, false, true),
        (true, false, true),
        (false, true, true),
        (true, true, true),
    ] {
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
        let b = mem.f32_tensor(&[m], &rng.vec(m, 1.0)).unwrap();
        let mut inputs = vec![x, w];
        if with_rope {
            inputs.push(pos);
        }
        if bias {
            inputs.push(b);
        }
        let fused = node(
            Op::MatMulRows {
                rope: with_rope.then_some(rope),
                write,
                bias,
            },
            inputs,
            vec![fused_out],
        );
        assert!(cpu::supports(&fused).is_err(), "the CPU must not fuse it");
        let got = run_cpu(&fused, &mem, 3);
        let plain = !with_rope && !cache;
        let product = if plain { chain_out } else { h };
        let mut m1 = run_cpu(&node(Op::MatMul, vec![x, w], vec![product]), &mem, 3);
        if bias {
            m1 = run_cpu(&node(Op::Add, vec![product, b], vec![product]), &m1, 3);
        }
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

/// Gemma's post-norm, residual add, next norm and quantize, run by the CPU's
/// threads by rows, equals its chain bit for bit; a post-normed input of
/// another shape than the residual's is refused, not broadcast.
#[test]
fn norm_add_norm_quantize_equals_its_chain() {
    let mut rng = Rng::new(53);
    let (rows, cols) = (5, 640);
    let mut mem = HostMemory::default();
    let x0 = rng.vec(rows * cols, 1.0);
    let x = mem.f32_tensor(&[rows, cols], &x0).unwrap();
    let xc = mem.f32_tensor(&[rows, cols], &x0).unwrap();
    let o = mem
        .f32_tensor(&[rows, cols], &rng.vec(rows * cols, 3.0))
        .unwrap();
    let wp = mem.f32_tensor(&[cols], &rng.vec(cols, 2.0)).unwrap();
    let w = mem.f32_tensor(&[cols], &rng.vec(cols, 1.0)).unwrap();
    let (hp, h) = (
        mem.zeros(DType::F32, &[rows, cols]).unwrap(),
        mem.zeros(DType::F32, &[rows, cols]).unwrap(),
    );
    let (q, qc) = (
        mem.zeros(DType::Q8_0, &[rows, cols]).unwrap(),
        mem.zeros(DType::Q8_0, &[rows, cols]).unwrap(),
    );
    let op = Op::NormAddRmsNormQuantize {
        eps_b: 1e-6,
        eps: 1e-5,
    };
    let fused = node(op.clone(), vec![x, o, wp, w], vec![x, q]);
    fused.validate().unwrap();
    let got = run_cpu(&fused, &mem, 3);
    let mut m = run_cpu(
        &node(Op::RmsNorm { eps: 1e-6 }, vec![o, wp], vec![hp]),
        &mem,
        3,
    );
    m = run_cpu(&node(Op::Add, vec![xc, hp], vec![xc]), &m, 3);
    m = run_cpu(
        &node(Op::RmsNorm { eps: 1e-5 }, vec![xc, w], vec![h]),
        &m,
        3,
    );
    m = run_cpu(&node(Op::QuantizeRows, vec![h], vec![qc]), &m, 3);
    assert_eq!(got.bytes(&x), m.bytes(&xc), "the sum");
    assert_eq!(got.bytes(&q), m.bytes(&qc), "the quantized rows");
    let one = mem.f32_tensor(&[1, cols], &rng.vec(cols, 1.0)).unwrap();
    let err = OpNode::new(op, vec![x, one, wp, w], vec![x, q])
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("post-normed"), "{err}");
}
