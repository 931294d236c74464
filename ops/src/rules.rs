//! Shape and dtype rules of every op, in one place.

use crate::dtype::DType;
use crate::op::{is_float, Op, OpNode};
use crate::tensor::Tensor;
use crate::OpError;

mod family;

/// Checks `node` against its op's rules.
pub fn validate(node: &OpNode) -> Result<(), OpError> {
    let name = node.op.name();
    let (ins, outs) = (&node.inputs, &node.outputs);
    let arity = |i: usize, o: usize| -> Result<(), OpError> {
        if ins.len() != i || outs.len() != o {
            return Err(OpError::Param {
                op: name,
                message: format!(
                    "takes {i} inputs and {o} outputs, got {} and {}",
                    ins.len(),
                    outs.len()
                ),
            });
        }
        Ok(())
    };
    let shape_err = |m: String| Err(OpError::Shape(format!("`{name}`: {m}")));
    match &node.op {
        Op::GetRows => {
            arity(2, 1)?;
            dtype(name, &ins[1], &[DType::I32])?;
            dtype(name, &outs[0], &[DType::F32])?;
            if outs[0].rows() != ins[1].shape.elements() || outs[0].cols() != ins[0].cols() {
                return shape_err(format!(
                    "{} ids of a table with {} columns cannot fill {:?}",
                    ins[1].shape.elements(),
                    ins[0].cols(),
                    outs[0].shape
                ));
            }
        }
        Op::QuantizeRows => {
            arity(1, 1)?;
            dtype(name, &ins[0], &[DType::F32])?;
            same_elements(name, &ins[0], &outs[0])?;
        }
        Op::MatMul => {
            arity(2, 1)?;
            let (x, w, y) = (&ins[0], &ins[1], &outs[0]);
            dtype(name, y, &[DType::F32])?;
            let act = crate::quant::vec_dot_type(w.dtype);
            if x.dtype != DType::F32 && x.dtype != act {
                return shape_err(format!(
                    "activations are {} but {} weights take f32 or {act}",
                    x.dtype, w.dtype
                ));
            }
            if x.cols() != w.cols() || y.rows() != x.rows() || y.cols() != w.rows() {
                return shape_err(format!(
                    "x {:?} @ w {:?}^T cannot give {:?}",
                    x.shape, w.shape, y.shape
                ));
            }
        }
        Op::RmsNorm { .. } => {
            arity(2, 1)?;
            all_f32(name, &[&ins[0], &ins[1], &outs[0]])?;
            same_shape(name, &ins[0], &outs[0])?;
            if ins[1].shape.elements() != ins[0].cols() {
                return shape_err(format!(
                    "weight of {} elements for rows of {}",
                    ins[1].shape.elements(),
                    ins[0].cols()
                ));
            }
        }
        Op::Add | Op::Mul => {
            arity(2, 1)?;
            all_f32(name, &[&ins[0], &ins[1], &outs[0]])?;
            same_shape(name, &ins[0], &outs[0])?;
            let b = &ins[1];
            let broadcast =
                b.cols() == ins[0].cols() && (b.rows() == 1 || b.rows() == ins[0].rows());
            if !broadcast {
                return shape_err(format!(
                    "cannot broadcast {:?} over {:?}",
                    b.shape, ins[0].shape
                ));
            }
        }
        Op::Scale { .. } | Op::Softmax { .. } => {
            arity(1, 1)?;
            all_f32(name, &[&ins[0], &outs[0]])?;
            same_shape(name, &ins[0], &outs[0])?;
        }
        Op::MoeTopK { k } => {
            arity(1, 1)?;
            all_f32(name, &[&ins[0]])?;
            dtype(name, &outs[0], &[DType::I32])?;
            if outs[0].rows() != ins[0].rows()
                || outs[0].cols() != *k
                || *k == 0
                || *k > ins[0].cols()
            {
                return shape_err(format!(
                    "top-{k} of {:?} into {:?}",
                    ins[0].shape, outs[0].shape
                ));
            }
        }
        Op::MoeGather { .. } => {
            arity(2, 1)?;
            all_f32(name, &[&ins[0], &outs[0]])?;
            dtype(name, &ins[1], &[DType::I32])?;
            if ins[1].rows() != ins[0].rows() || outs[0].shape != ins[1].shape {
                return shape_err(format!(
                    "probabilities {:?}, ids {:?}, weights {:?}",
                    ins[0].shape, ins[1].shape, outs[0].shape
                ));
            }
        }
        Op::Rope(p) | Op::RopeFactors(p) => {
            let factors = matches!(node.op, Op::RopeFactors(_));
            arity(if factors { 3 } else { 2 }, 1)?;
            if factors {
                all_f32(name, &[&ins[2]])?;
                if ins[2].shape.elements() != p.n_dims / 2 {
                    return shape_err(format!(
                        "{} frequency factors for {} rotated pairs",
                        ins[2].shape.elements(),
                        p.n_dims / 2
                    ));
                }
            }
            all_f32(name, &[&ins[0], &outs[0]])?;
            dtype(name, &ins[1], &[DType::I32])?;
            same_shape(name, &ins[0], &outs[0])?;
            if p.head_dim == 0
                || ins[0].cols() % p.head_dim != 0
                || p.n_dims > p.head_dim
                || p.n_dims % 2 != 0
            {
                return shape_err(format!(
                    "rows of {} with head_dim {} and n_dims {}",
                    ins[0].cols(),
                    p.head_dim,
                    p.n_dims
                ));
            }
            if ins[1].shape.elements() != ins[0].rows() {
                return shape_err(format!(
                    "{} positions for {} rows",
                    ins[1].shape.elements(),
                    ins[0].rows()
                ));
            }
        }
        Op::Attention(p) => {
            arity(3, 1)?;
            let (q, k, v, o) = (&ins[0], &ins[1], &ins[2], &outs[0]);
            all_f32(name, &[q, o])?;
            dtype(name, k, &[DType::F16, DType::F32])?;
            dtype(name, v, &[DType::F16, DType::F32])?;
            same_shape(name, q, o)?;
            if p.kv_heads == 0 || p.heads % p.kv_heads != 0 || q.cols() != p.heads * p.head_dim {
                return shape_err(format!(
                    "{} heads over {} kv heads of {} for q rows of {}",
                    p.heads,
                    p.kv_heads,
                    p.head_dim,
                    q.cols()
                ));
            }
            if k.cols() != p.kv_heads * p.head_dim || v.shape != k.shape {
                return shape_err(format!(
                    "k {:?} / v {:?} for {} kv heads of {}",
                    k.shape, v.shape, p.kv_heads, p.head_dim
                ));
            }
            let needed = match p.ring {
                Some(r) => r as usize,
                None => p.q_position as usize + q.rows(),
            };
            if k.rows() < needed {
                return shape_err(format!("cache view of {} rows, need {needed}", k.rows()));
            }
        }
        Op::Gelu => {
            arity(1, 1)?;
            all_f32(name, &[&ins[0], &outs[0]])?;
            same_shape(name, &ins[0], &outs[0])?;
        }
        Op::LayerNorm { eps } => {
            arity(3, 1)?;
            all_f32(name, &[&ins[0], &ins[1], &ins[2], &outs[0]])?;
            same_shape(name, &ins[0], &outs[0])?;
            for (what, t) in [("weight", &ins[1]), ("bias", &ins[2])] {
                if t.shape.elements() != ins[0].cols() {
                    return shape_err(format!(
                        "{what} of {} elements for rows of {}",
                        t.shape.elements(),
                        ins[0].cols()
                    ));
                }
            }
            if eps.is_nan() || *eps < 0.0 {
                return Err(OpError::Param {
                    op: name,
                    message: format!("eps must be a non-negative number, got {eps}"),
                });
            }
        }
        Op::SiluMul | Op::GeluMul => {
            arity(2, 1)?;
            all_f32(name, &[&ins[0], &ins[1], &outs[0]])?;
            same_shape(name, &ins[0], &ins[1])?;
            same_shape(name, &ins[0], &outs[0])?;
        }
        Op::SetRows { start, ring } => {
            arity(1, 1)?;
            let (src, dst) = (&ins[0], &outs[0]);
            dtype(name, src, &[DType::F32])?;
            dtype(name, dst, &[DType::F32, DType::F16, DType::BF16])?;
            let end = match ring {
                Some(r) => *r as usize,
                None => *start as usize + src.rows(),
            };
            if src.cols() != dst.cols() || end > dst.rows() || ring == &Some(0) {
                return shape_err(format!(
                    "{} rows of {} at {start} into {:?}",
                    src.rows(),
                    src.cols(),
                    dst.shape
                ));
            }
        }
        Op::Argmax => {
            arity(1, 1)?;
            dtype(name, &ins[0], &[DType::F32])?;
            dtype(name, &outs[0], &[DType::I32])?;
            if outs[0].shape.elements() != ins[0].rows() {
                return shape_err(format!(
                    "{} outputs for {} rows",
                    outs[0].shape.elements(),
                    ins[0].rows()
                ));
            }
        }
        Op::Copy => {
            arity(1, 1)?;
            if !is_float(ins[0].dtype) || !is_float(outs[0].dtype) {
                return shape_err(format!(
                    "copies float types, not {} -> {}",
                    ins[0].dtype, outs[0].dtype
                ));
            }
            same_elements(name, &ins[0], &outs[0])?;
        }
        Op::RmsNormQuantize { .. }
        | Op::SiluMulQuantize
        | Op::RopeSetRows { .. }
        | Op::AddRmsNormQuantize { .. }
        | Op::NormAddRmsNormQuantize { .. }
        | Op::AttentionQuantize(_)
        | Op::ProjAttention(_)
        | Op::MatMulRows { .. }
        | Op::MatMulSiluQuantize { .. } => {
            // Valid when every op of the chain it stands for is.
            let mut next = u32::MAX;
            let parts = crate::fused::decompose(node, |dtype, dims| {
                next -= 1;
                Tensor::new(
                    weft_graph::BufferId(next),
                    0,
                    dtype,
                    crate::tensor::Shape::new(dims),
                )
            })?;
            for part in parts.into_iter().flatten() {
                validate(&part)?;
            }
        }
        crate::family_ops!() => family::validate(node)?,
        Op::Write { data } => {
            arity(0, 1)?;
            if data.len() as u64 != outs[0].bytes() {
                return shape_err(format!(
                    "{} bytes for a tensor of {}",
                    data.len(),
                    outs[0].bytes()
                ));
            }
        }
    }
    Ok(())
}

fn dtype(op: &'static str, t: &Tensor, allowed: &[DType]) -> Result<(), OpError> {
    if allowed.contains(&t.dtype) {
        return Ok(());
    }
    Err(OpError::Unsupported {
        op,
        what: format!("{} tensors here (accepts {:?})", t.dtype, allowed),
    })
}

fn all_f32(op: &'static str, ts: &[&Tensor]) -> Result<(), OpError> {
    ts.iter().try_for_each(|t| dtype(op, t, &[DType::F32]))
}

fn same_shape(op: &'static str, a: &Tensor, b: &Tensor) -> Result<(), OpError> {
    if a.shape.rows() == b.shape.rows() && a.cols() == b.cols() {
        return Ok(());
    }
    Err(OpError::Shape(format!(
        "`{op}`: {:?} and {:?} differ",
        a.shape, b.shape
    )))
}

fn same_elements(op: &'static str, a: &Tensor, b: &Tensor) -> Result<(), OpError> {
    if a.shape.elements() == b.shape.elements() && a.cols() == b.cols() {
        return Ok(());
    }
    Err(OpError::Shape(format!(
        "`{op}`: {:?} and {:?} differ",
        a.shape, b.shape
    )))
}
