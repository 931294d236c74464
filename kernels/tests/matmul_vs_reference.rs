//! Matmul, embedding lookup and activation quantization through the CPU
//! backend's work split (`work_split` + `run_item`), for every weight format,
//! against the reference semantics on fresh random inputs.

use weft_ops::reference::HostMemory;
use weft_ops::{DType, Op, OpNode, Tensor};
use weft_testkit::host::{encoded_tensor, run_cpu};
use weft_testkit::Rng;

/// A weight tensor of `dtype` holding quantized random values.
fn weights(mem: &mut HostMemory, rng: &mut Rng, dtype: DType, rows: usize, k: usize) -> Tensor {
    let values = rng.vec(rows * k, 1.0);
    encoded_tensor(mem, dtype, &[rows, k], &values)
}

#[test]
fn matmul_matches_the_reference_for_every_weight_format() {
    let mut rng = Rng::new(7);
    let formats = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
    ];
    for dtype in formats {
        let k = if dtype.block_len() == 256 { 512 } else { 96 };
        for (n, m) in [(1usize, 37usize), (5, 64)] {
            let mut mem = HostMemory::default();
            let w = weights(&mut mem, &mut rng, dtype, m, k);
            let xv = rng.vec(n * k, 1.0);
            let x = mem.f32_tensor(&[n, k], &xv).expect("x");
            // Activations quantized by the backend exactly as the builder records it.
            let act = weft_ops::quant::vec_dot_type(dtype);
            let xq = if act == DType::F32 {
                x
            } else {
                let q = mem.zeros(act, &[n, k]).expect("xq");
                let node = OpNode::new(Op::QuantizeRows, vec![x], vec![q]);
                let cpu_mem = run_cpu(&node, &mem, 2);
                let mut reference = mem.clone();
                weft_ops::reference::run(&node, &mut reference).expect("reference quantize");
                // The backend's quantizer is bit-identical to the reference's.
                assert_eq!(
                    cpu_mem.bytes(&q),
                    reference.bytes(&q),
                    "{dtype}: quantized activations"
                );
                mem = cpu_mem;
                q
            };
            let y = mem.zeros(DType::F32, &[n, m]).expect("y");
            let node = OpNode::new(Op::MatMul, vec![xq, w], vec![y]);
            node.validate().expect("valid");
            let got = run_cpu(&node, &mem, 3).to_f32(&y).expect("got");
            let mut reference = mem.clone();
            weft_ops::reference::run(&node, &mut reference).expect("reference");
            let want = reference.to_f32(&y).expect("want");
            // Integer block sums are exact; only the order of the f32 sum of
            // scaled blocks differs from the reference: relative 1e-4 of the
            // output's scale.
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs())).max(1e-3);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * scale + 1e-5,
                    "{dtype} n={n}: y[{i}] = {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn embedding_rows_match_the_reference_for_every_table_format() {
    let mut rng = Rng::new(11);
    for dtype in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
    ] {
        let k = if dtype.block_len() == 256 { 256 } else { 64 };
        let mut mem = HostMemory::default();
        let table = weights(&mut mem, &mut rng, dtype, 20, k);
        let ids: Vec<i32> = vec![3, 0, 19, 3, 7];
        let idt = mem
            .tensor(DType::I32, &[5], bytemuck::cast_slice(&ids))
            .expect("ids");
        let out = mem.zeros(DType::F32, &[5, k]).expect("out");
        let node = OpNode::new(Op::GetRows, vec![table, idt], vec![out]);
        let got = run_cpu(&node, &mem, 2).to_f32(&out).expect("got");
        let mut reference = mem.clone();
        weft_ops::reference::run(&node, &mut reference).expect("reference");
        // Dequantization is exact arithmetic on both sides.
        assert_eq!(got, reference.to_f32(&out).expect("want"), "{dtype}");
    }
}
