//! Shape and dtype rules of the family-module ops (parameters in
//! [`crate::family`]).

use super::{all_f32, dtype, same_shape};
use crate::dtype::DType;
use crate::family::MoeSelect;
use crate::op::{Op, OpNode};
use crate::tensor::Tensor;
use crate::OpError;

/// Checks a family-module op (arity already in `ins`/`outs` lengths).
pub(super) fn validate(node: &OpNode) -> Result<(), OpError> {
    let name = node.op.name();
    let (ins, outs) = (&node.inputs, &node.outputs);
    let arity = |i: &[usize], o: usize| -> Result<(), OpError> {
        if !i.contains(&ins.len()) || outs.len() != o {
            return Err(OpError::Param {
                op: name,
                message: format!(
                    "takes {i:?} inputs and {o} outputs, got {} and {}",
                    ins.len(),
                    outs.len()
                ),
            });
        }
        Ok(())
    };
    let bad = |m: String| Err(OpError::Shape(format!("`{name}`: {m}")));
    let elems = |t: &Tensor| t.shape.elements();
    match &node.op {
        Op::TailRope(p) => {
            arity(&[2], 1)?;
            all_f32(name, &[&ins[0], &outs[0]])?;
            dtype(name, &ins[1], &[DType::I32])?;
            same_shape(name, &ins[0], &outs[0])?;
            if p.head_dim == 0
                || ins[0].cols() % p.head_dim != 0
                || p.n_dims > p.head_dim
                || p.n_dims % 2 != 0
                || elems(&ins[1]) != ins[0].rows()
            {
                return bad(format!(
                    "rows of {} with head_dim {} and n_dims {}, {} positions for {} rows",
                    ins[0].cols(),
                    p.head_dim,
                    p.n_dims,
                    elems(&ins[1]),
                    ins[0].rows()
                ));
            }
        }
        Op::HcMix(p) => {
            arity(&[if p.norm_eps.is_some() { 4 } else { 3 }], 1)?;
            all_f32(name, &[&ins[0], &ins[1], &ins[2], &outs[0]])?;
            if let Some(x) = ins.get(3) {
                dtype(name, x, &[DType::F32])?;
                if x.rows() != ins[0].rows() || x.cols() % p.hc.max(1) != 0 {
                    return bad(format!(
                        "streams {:?} for mixer outputs {:?}",
                        x.shape, ins[0].shape
                    ));
                }
            }
            same_shape(name, &ins[0], &outs[0])?;
            let mix = ins[0].cols();
            let full = (2 + p.hc) * p.hc;
            let scales = if mix == full { 3 } else { 1 };
            if p.hc == 0 || (mix != full && mix != p.hc) || p.iters == 0 {
                return bad(format!(
                    "{mix} mixer outputs for {} streams (expects {full} or {}), {} iterations",
                    p.hc, p.hc, p.iters
                ));
            }
            if elems(&ins[1]) != scales || elems(&ins[2]) != mix {
                return bad(format!(
                    "scale of {} and base of {} for {mix} mixer outputs (expects {scales} and {mix})",
                    elems(&ins[1]),
                    elems(&ins[2])
                ));
            }
        }
        Op::HcCollapse { hc, norm_eps } => {
            arity(&[if norm_eps.is_some() { 3 } else { 2 }], 1)?;
            all_f32(name, &[&ins[0], &ins[1], &outs[0]])?;
            let (x, co, y) = (&ins[0], &ins[1], &outs[0]);
            if let Some(w) = ins.get(2) {
                dtype(name, w, &[DType::F32])?;
                if elems(w) != y.cols() {
                    return bad(format!(
                        "norm weight {:?} for rows of {}",
                        w.shape,
                        y.cols()
                    ));
                }
            }
            if *hc == 0
                || x.cols() != hc * y.cols()
                || co.cols() < *hc
                || co.rows() != x.rows()
                || y.rows() != x.rows()
            {
                return bad(format!(
                    "{hc} streams of {:?} with coefficients {:?} into {:?}",
                    x.shape, co.shape, y.shape
                ));
            }
        }
        Op::HcExpand { hc } => {
            arity(&[3], 1)?;
            all_f32(name, &[&ins[0], &ins[1], &ins[2], &outs[0]])?;
            let (x, f, co) = (&ins[0], &ins[1], &ins[2]);
            same_shape(name, x, &outs[0])?;
            if *hc == 0
                || x.cols() != hc * f.cols()
                || f.rows() != x.rows()
                || co.rows() != x.rows()
                || co.cols() != (2 + hc) * hc
            {
                return bad(format!(
                    "{hc} streams {:?}, sublayer output {:?}, coefficients {:?}",
                    x.shape, f.shape, co.shape
                ));
            }
        }
        Op::Compress(p) => {
            arity(&[4], 1)?;
            all_f32(name, &[&ins[0], &ins[1], &ins[2], &ins[3], &outs[0]])?;
            let (kv, gate, ape, out) = (&ins[0], &ins[1], &ins[2], &outs[0]);
            same_shape(name, kv, gate)?;
            let width = kv.cols();
            let dc = if p.overlap { width / 2 } else { width };
            if p.ratio == 0
                || (p.overlap && width % 2 != 0)
                || out.cols() != dc
                || p.rows == 0
                || (p.first_row as usize + p.rows as usize) > out.rows()
                || ape.cols() != width
                || ape.rows() != p.ratio as usize
                || kv.rows() != p.ring as usize
                || p.ring == 0
                || elems(&ins[3]) != dc
                || p.rope.head_dim != dc
                || p.rope.n_dims > dc
                || p.rope.n_dims % 2 != 0
            {
                return bad(format!(
                    "ratio {} (overlap {}) over rings {:?} with ape {:?}: rows {}..{} of {:?} (ring {})",
                    p.ratio, p.overlap, kv.shape, ape.shape, p.first_row, p.first_row as u64 + p.rows as u64, out.shape, p.ring
                ));
            }
            // Every position a pooled row reads must still be in its slot:
            // the ring holds a whole window, or (a context shorter than the
            // ring's window) no position read has wrapped yet.
            let window = p.ratio as u64 * (1 + p.overlap as u64);
            let end = (p.first_row as u64 + p.rows as u64) * p.ratio as u64;
            if (p.ring as u64) < window && end > p.ring as u64 {
                return bad(format!(
                    "a ring of {} slots cannot hold a window of {window} tokens (rows {}..{} read positions up to {end})",
                    p.ring,
                    p.first_row,
                    p.first_row as u64 + p.rows as u64
                ));
            }
        }
        Op::IndexerTopK(p) => {
            arity(&[3], 1)?;
            all_f32(name, &[&ins[0], &ins[1], &ins[2]])?;
            dtype(name, &outs[0], &[DType::I32])?;
            let (q, w, k, o) = (&ins[0], &ins[1], &ins[2], &outs[0]);
            let n = q.rows();
            if q.cols() != p.heads * p.head_dim
                || w.rows() != n
                || w.cols() != p.heads
                || k.cols() != p.head_dim
                || o.rows() != n
                || o.cols() != p.top_k
                || p.top_k == 0
                || p.ratio == 0
            {
                return bad(format!(
                    "{} heads of {}, top-{} (ratio {}): q {:?}, weights {:?}, keys {:?}, out {:?}",
                    p.heads, p.head_dim, p.top_k, p.ratio, q.shape, w.shape, k.shape, o.shape
                ));
            }
        }
        Op::SinkAttention(p) => {
            arity(&[4, 5], 1)?;
            let (q, win, rows, sinks, o) = (&ins[0], &ins[1], &ins[2], &ins[3], &outs[0]);
            all_f32(name, &[q, sinks, o])?;
            dtype(name, win, &[DType::F32, DType::F16])?;
            dtype(name, rows, &[DType::F32, DType::F16])?;
            same_shape(name, q, o)?;
            let has_selection = ins.len() == 5;
            if q.cols() != p.heads * p.head_dim
                || win.cols() != p.head_dim
                || rows.cols() != p.head_dim
                || elems(sinks) != p.heads
                || win.rows() != p.ring as usize
                || p.window == 0
                || p.window > p.ring
                || has_selection != (p.top_k > 0)
                || p.out_rope
                    .is_some_and(|r| r.head_dim != p.head_dim || r.n_dims > p.head_dim)
            {
                return bad(format!(
                    "{} heads of {}, window {} in a ring of {}, top-{}: q {:?}, window {:?}, rows {:?}, sinks {:?}, {} inputs",
                    p.heads, p.head_dim, p.window, p.ring, p.top_k, q.shape, win.shape, rows.shape, sinks.shape, ins.len()
                ));
            }
            if has_selection {
                let sel = &ins[4];
                dtype(name, sel, &[DType::I32])?;
                if sel.rows() != q.rows() || sel.cols() != p.top_k || p.ratio == 0 {
                    return bad(format!(
                        "selection {:?} for {} queries of top-{} (ratio {})",
                        sel.shape,
                        q.rows(),
                        p.top_k,
                        p.ratio
                    ));
                }
            }
        }
        Op::MatMulId => {
            arity(&[3], 1)?;
            let (x, w, ids, y) = (&ins[0], &ins[1], &ins[2], &outs[0]);
            dtype(name, x, &[DType::F32])?;
            dtype(name, ids, &[DType::I32])?;
            dtype(name, y, &[DType::F32])?;
            let dims = w.shape.dims();
            let (n, slots) = (ids.rows(), ids.cols());
            if dims.len() != 3
                || x.cols() != w.cols()
                || (x.rows() != n && x.rows() != n * slots)
                || y.rows() != n
                || y.cols() != slots * dims[1]
            {
                return bad(format!(
                    "x {:?}, experts {:?}, ids {:?} cannot give {:?}",
                    x.shape, w.shape, ids.shape, y.shape
                ));
            }
        }
        Op::MoeRoute(p) => {
            let inputs = match p.select {
                MoeSelect::TopK => 2,
                MoeSelect::Hash => 3,
            };
            arity(&[inputs], 1)?;
            dtype(name, &ins[0], &[DType::F32])?;
            dtype(name, &outs[0], &[DType::I32])?;
            let (logits, out) = (&ins[0], &outs[0]);
            if out.rows() != logits.rows() || out.cols() != p.k || p.k == 0 || p.k > logits.cols() {
                return bad(format!(
                    "top-{} of logits {:?} into {:?}",
                    p.k, logits.shape, out.shape
                ));
            }
            match p.select {
                MoeSelect::TopK => {
                    dtype(name, &ins[1], &[DType::F32])?;
                    if elems(&ins[1]) != logits.cols() {
                        return bad(format!(
                            "bias {:?} for {} experts",
                            ins[1].shape,
                            logits.cols()
                        ));
                    }
                }
                MoeSelect::Hash => {
                    dtype(name, &ins[1], &[DType::I32])?;
                    dtype(name, &ins[2], &[DType::I32])?;
                    if ins[1].cols() != p.k || elems(&ins[2]) != logits.rows() {
                        return bad(format!(
                            "hash table {:?} and {} tokens for top-{} of {} rows",
                            ins[1].shape,
                            elems(&ins[2]),
                            p.k,
                            logits.rows()
                        ));
                    }
                }
            }
        }
        Op::MoeWeights(_) => {
            arity(&[2], 1)?;
            dtype(name, &ins[0], &[DType::F32])?;
            dtype(name, &ins[1], &[DType::I32])?;
            dtype(name, &outs[0], &[DType::F32])?;
            if ins[1].rows() != ins[0].rows() || outs[0].shape != ins[1].shape {
                return bad(format!(
                    "logits {:?}, ids {:?}, weights {:?}",
                    ins[0].shape, ins[1].shape, outs[0].shape
                ));
            }
        }
        Op::SwigluClamp { limit } => {
            arity(&[2], 1)?;
            all_f32(name, &[&ins[0], &ins[1], &outs[0]])?;
            same_shape(name, &ins[0], &ins[1])?;
            same_shape(name, &ins[0], &outs[0])?;
            if limit.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
                return Err(OpError::Param {
                    op: name,
                    message: format!("the clamp limit must be positive, got {limit}"),
                });
            }
        }
        Op::MoeCombine => {
            arity(&[2, 3], 1)?;
            all_f32(name, &[&ins[0], &ins[1], &outs[0]])?;
            let (y, w, o) = (&ins[0], &ins[1], &outs[0]);
            if let Some(shared) = ins.get(2) {
                dtype(name, shared, &[DType::F32])?;
                same_shape(name, shared, o)?;
            }
            if w.rows() != y.rows() || o.rows() != y.rows() || y.cols() != w.cols() * o.cols() {
                return bad(format!(
                    "expert outputs {:?} with weights {:?} into {:?}",
                    y.shape, w.shape, o.shape
                ));
            }
        }
        other => {
            return Err(OpError::Unsupported {
                op: other.name(),
                what: "validation as a family-module op".into(),
            })
        }
    }
    Ok(())
}
