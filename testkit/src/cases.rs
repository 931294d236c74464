//! Op cases shared by the backend harnesses: one list per op family, the
//! same nodes on the same inputs for every backend. A harness runs each
//! case on its backend and compares with what it is checked against (the
//! CPU kernels with the reference semantics, a GPU with the reference or
//! with the CPU), at the tolerance it states for the case's op.

use crate::host::node;
use crate::Rng;
use weft_ops::reference::HostMemory;
use weft_ops::{AttentionParams, DType, Op, OpNode, RopeMode, RopeParams};

/// One node and the memory holding its inputs (outputs zeroed).
#[derive(Clone, Debug)]
pub struct OpCase {
    /// What the case is, for failure messages (op and shape).
    pub name: String,
    pub node: OpNode,
    pub mem: HostMemory,
}

/// Element-wise ops, norms and softmax over f32 rows: `add` and `mul` (full
/// and one broadcast row), `scale`, `silu_mul`, `gelu`, `gelu_mul`,
/// `rms_norm`, `layer_norm`, `softmax` (scale 1 and 0.7), at 1x576, 7x64
/// and 3x1001 (a length no SIMD width divides).
pub fn elementwise(rng: &mut Rng) -> Vec<OpCase> {
    let mut cases = Vec::new();
    for (rows, cols) in [(1, 576), (7, 64), (3, 1001)] {
        let mut mem = HostMemory::default();
        let mut f32s = |mem: &mut HostMemory, dims: &[usize], scale: f32| {
            let n = dims.iter().product();
            mem.f32_tensor(dims, &rng.vec(n, scale)).expect("tensor")
        };
        let a = f32s(&mut mem, &[rows, cols], 3.0);
        let b = f32s(&mut mem, &[rows, cols], 3.0);
        let b1 = f32s(&mut mem, &[1, cols], 3.0);
        let w = f32s(&mut mem, &[cols], 1.0);
        let bias = f32s(&mut mem, &[cols], 1.0);
        let o = mem.zeros(DType::F32, &[rows, cols]).expect("output");
        let nodes = [
            ("add", Op::Add, vec![a, b]),
            ("add row", Op::Add, vec![a, b1]),
            ("mul", Op::Mul, vec![a, b]),
            ("mul row", Op::Mul, vec![a, b1]),
            ("scale", Op::Scale { factor: 0.37 }, vec![a]),
            ("silu_mul", Op::SiluMul, vec![a, b]),
            ("gelu", Op::Gelu, vec![a]),
            ("gelu_mul", Op::GeluMul, vec![a, b]),
            ("rms_norm", Op::RmsNorm { eps: 1e-5 }, vec![a, w]),
            ("layer_norm", Op::LayerNorm { eps: 1e-5 }, vec![a, w, bias]),
            ("softmax", Op::Softmax { scale: 1.0 }, vec![a]),
            ("softmax scaled", Op::Softmax { scale: 0.7 }, vec![a]),
        ];
        for (what, op, inputs) in nodes {
            cases.push(OpCase {
                name: format!("{what} {rows}x{cols}"),
                node: node(op, inputs, vec![o]),
                mem: mem.clone(),
            });
        }
    }
    cases
}

/// RoPE over 6 rows of 3 heads of 64 at scattered positions: normal and
/// NeoX, all 64 dims and the first 32, plain and with YaRN scaling.
pub fn rope(rng: &mut Rng) -> Vec<OpCase> {
    let mut mem = HostMemory::default();
    let (rows, heads, d) = (6, 3, 64);
    let x = mem
        .f32_tensor(&[rows, heads * d], &rng.vec(rows * heads * d, 2.0))
        .expect("x");
    let pos: Vec<i32> = (0..rows as i32).map(|i| i * 37 + 5).collect();
    let p = mem
        .tensor(DType::I32, &[rows], bytemuck::cast_slice(&pos))
        .expect("positions");
    let o = mem.zeros(DType::F32, &[rows, heads * d]).expect("output");
    let mut cases = Vec::new();
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for n_dims in [64, 32] {
            let plain = RopeParams::plain(mode, d, n_dims, 10000.0);
            let mut yarn = plain;
            yarn.ext_factor = 1.0;
            yarn.freq_scale = 0.25;
            yarn.orig_ctx = 4096;
            yarn.base = 100000.0;
            for (what, params) in [("rope", plain), ("rope yarn", yarn)] {
                cases.push(OpCase {
                    name: format!("{what} {mode:?} n_dims {n_dims}"),
                    node: node(Op::Rope(params), vec![x, p], vec![o]),
                    mem: mem.clone(),
                });
            }
        }
    }
    cases
}

/// Flash attention of 6 query heads over 2 KV heads of 64, f32 and f16
/// caches: decode, a prompt at 0, a ring with a window, a window alone and
/// a soft-capped decode.
pub fn attention(rng: &mut Rng) -> Vec<OpCase> {
    let mut cases = Vec::new();
    for kv_dtype in [DType::F32, DType::F16] {
        for (n, q_position, window, ring, softcap) in [
            (1, 9, None, None, 0.0),
            (5, 0, None, None, 0.0),
            (4, 20, Some(8), Some(12), 0.0),
            (3, 5, Some(4), None, 0.0),
            (2, 30, None, None, 30.0),
        ] {
            let mut mem = HostMemory::default();
            let (heads, kv_heads, d) = (6, 2, 64);
            let rows = ring.map_or(q_position as usize + n, |r| r as usize);
            let q = mem
                .f32_tensor(&[n, heads * d], &rng.vec(n * heads * d, 1.0))
                .expect("q");
            let k = mem.zeros(kv_dtype, &[rows, kv_heads * d]).expect("k");
            let v = mem.zeros(kv_dtype, &[rows, kv_heads * d]).expect("v");
            mem.set_f32(&k, &rng.vec(rows * kv_heads * d, 1.0))
                .expect("k values");
            mem.set_f32(&v, &rng.vec(rows * kv_heads * d, 1.0))
                .expect("v values");
            let o = mem.zeros(DType::F32, &[n, heads * d]).expect("output");
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
                flash: true,
            };
            cases.push(OpCase {
                name: format!(
                    "attention {kv_dtype} cache, {n} rows at {q_position}, window {window:?}, \
                     ring {ring:?}, softcap {softcap}"
                ),
                node: node(Op::Attention(params), vec![q, k, v], vec![o]),
                mem,
            });
        }
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_is_valid_and_named_once() {
        let mut rng = Rng::new(1);
        let cases: Vec<OpCase> = [elementwise(&mut rng), rope(&mut rng), attention(&mut rng)]
            .into_iter()
            .flatten()
            .collect();
        let names: std::collections::HashSet<&str> =
            cases.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names.len(), cases.len(), "case names repeat");
        for c in &cases {
            c.node.validate().expect("valid node");
        }
    }
}
