//! Random expert weights and routings for the `MatMulId` tests: blocks of
//! every expert format, activation-like rows through the reference
//! quantizer, routings shaped as top-k gives them and as a skewed router
//! does.

use weft_ops::quant::{f32_to_f16, quantize_row};
use weft_ops::reference::HostMemory;
use weft_ops::{DType, Op, OpNode, Shape, Tensor};
use weft_testkit::host::node;
use weft_testkit::Rng;

/// A small positive f16 scale.
fn scale16(rng: &mut Rng) -> [u8; 2] {
    f32_to_f16(0.001 + 0.009 * rng.unit())
}

/// One random block of `dtype`: random codes and scale bytes, small finite
/// f16 scales (an MXFP4 exponent near 2^0).
pub fn random_block(rng: &mut Rng, dtype: DType, out: &mut Vec<u8>) {
    let bytes = |rng: &mut Rng, out: &mut Vec<u8>, count: usize| {
        for _ in 0..count {
            out.push(rng.next() as u8);
        }
    };
    match dtype {
        DType::Q8_0 => {
            out.extend(scale16(rng));
            bytes(rng, out, 32);
        }
        DType::Q4_K => {
            out.extend(scale16(rng));
            out.extend(scale16(rng));
            bytes(rng, out, 140);
        }
        DType::Q2_K => {
            bytes(rng, out, 80);
            out.extend(scale16(rng));
            out.extend(scale16(rng));
        }
        DType::IQ2_XXS => {
            out.extend(scale16(rng));
            bytes(rng, out, 64);
        }
        DType::MXFP4 => {
            out.push(118 + rng.below(13) as u8);
            bytes(rng, out, 16);
        }
        other => panic!("no random blocks for {other}"),
    }
}

/// `experts x m x k` weights of `dtype` at byte `offset` of a fresh buffer:
/// random activation-like rows quantized with the reference quantizer, or
/// (`raw`, and IQ2_XXS, which has no quantizer) random blocks.
pub fn expert_weights(
    rng: &mut Rng,
    mem: &mut HostMemory,
    dtype: DType,
    [experts, m, k]: [usize; 3],
    offset: usize,
    raw: bool,
) -> Tensor {
    let row_bytes = dtype.row_bytes(k).expect("whole blocks");
    let mut bytes = Vec::with_capacity(experts * m * row_bytes);
    for _ in 0..experts * m {
        if raw || dtype == DType::IQ2_XXS {
            for _ in 0..k / dtype.block_len() {
                random_block(rng, dtype, &mut bytes);
            }
        } else {
            let row = rng.rows(1, k);
            let start = bytes.len();
            bytes.resize(start + row_bytes, 0);
            quantize_row(dtype, &row, &mut bytes[start..]).expect("quantize");
        }
    }
    let id = mem.alloc(offset + bytes.len());
    let t = Tensor::new(id, offset as u64, dtype, Shape::new(&[experts, m, k])).unwrap();
    mem.bytes_mut(&t).copy_from_slice(&bytes);
    t
}

/// How the pairs are routed.
#[derive(Clone, Copy, Debug)]
pub enum Route {
    /// Distinct experts per token (top-k).
    Distinct,
    /// Random, with slot 1 repeating slot 0 and slot 4 repeating slot 2.
    Repeats,
    /// Uniform over the experts.
    Uniform,
    /// Most pairs on experts 0..3 (large groups, sizes not multiples of 4).
    Concentrated,
}

pub fn route(rng: &mut Rng, how: Route, n: usize, slots: usize, experts: usize) -> Vec<i32> {
    let mut ids = Vec::with_capacity(n * slots);
    for _ in 0..n {
        let start = ids.len();
        for s in 0..slots {
            let e = match how {
                Route::Distinct => loop {
                    let e = rng.below(experts);
                    if !ids[start..].contains(&(e as i32)) || experts < slots {
                        break e;
                    }
                },
                Route::Repeats if s == 1 || s == 4 => ids[start + s - 1] as usize,
                Route::Concentrated if rng.below(8) != 0 => rng.below(3.min(experts)),
                _ => rng.below(experts),
            };
            ids.push(e as i32);
        }
    }
    ids
}

/// A MatMulId node over `w` for `n` tokens routed as `ids`; x as `[n, k]`
/// or (`per_pair`) `[n * slots, k]`.
pub fn matmul_id_node(
    rng: &mut Rng,
    mem: &mut HostMemory,
    w: Tensor,
    ids: &[i32],
    n: usize,
    per_pair: bool,
) -> OpNode {
    let dims = w.shape.dims();
    let (m, k) = (dims[1], dims[2]);
    let slots = ids.len() / n;
    let rows = if per_pair { n * slots } else { n };
    let x = mem.f32_tensor(&[rows, k], &rng.rows(rows, k)).unwrap();
    let idt = mem
        .tensor(DType::I32, &[n, slots], bytemuck::cast_slice(ids))
        .unwrap();
    let out = mem.zeros(DType::F32, &[n, slots * m]).unwrap();
    node(Op::MatMulId, vec![x, w, idt], vec![out])
}
