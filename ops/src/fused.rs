//! Fused ops: what they are made of.
//!
//! The fusion pass (weft-runtime) turns a chain of nodes into one node when
//! the intermediate has no other reader. A fused op is defined by the
//! chain it replaces: [`decompose`] gives the component nodes, with the
//! intermediates placed wherever the caller wants them (scratch). Rules,
//! reference semantics and the CPU kernels all go through it, so a fused op
//! computes exactly what its chain computes, bit for bit.

use crate::dtype::DType;
use crate::op::{Op, OpNode};
use crate::tensor::Tensor;
use crate::OpError;

/// The chain `node` stands for, with intermediates from `scratch(dtype,
/// dims)`, or `None` when `node` is not a fused op.
pub fn decompose(
    node: &OpNode,
    mut scratch: impl FnMut(DType, &[usize]) -> Result<Tensor, OpError>,
) -> Result<Option<Vec<OpNode>>, OpError> {
    let (ins, outs) = (&node.inputs, &node.outputs);
    let arity = |i: usize, o: usize| -> Result<(), OpError> {
        if ins.len() != i || outs.len() != o {
            return Err(OpError::Param {
                op: node.op.name(),
                message: format!(
                    "takes {i} inputs and {o} outputs, got {} and {}",
                    ins.len(),
                    outs.len()
                ),
            });
        }
        Ok(())
    };
    let parts = match &node.op {
        Op::RmsNormQuantize { eps } => {
            arity(2, 1)?;
            let h = scratch(DType::F32, ins[0].shape.dims())?;
            vec![
                OpNode::new(Op::RmsNorm { eps: *eps }, vec![ins[0], ins[1]], vec![h]),
                OpNode::new(Op::QuantizeRows, vec![h], vec![outs[0]]),
            ]
        }
        Op::SiluMulQuantize => {
            arity(2, 1)?;
            let m = scratch(DType::F32, ins[0].shape.dims())?;
            vec![
                OpNode::new(Op::SiluMul, vec![ins[0], ins[1]], vec![m]),
                OpNode::new(Op::QuantizeRows, vec![m], vec![outs[0]]),
            ]
        }
        Op::RopeSetRows { rope, start, ring } => {
            arity(2, 1)?;
            let r = scratch(DType::F32, ins[0].shape.dims())?;
            vec![
                OpNode::new(Op::Rope(*rope), vec![ins[0], ins[1]], vec![r]),
                OpNode::new(
                    Op::SetRows {
                        start: *start,
                        ring: *ring,
                    },
                    vec![r],
                    vec![outs[0]],
                ),
            ]
        }
        Op::AddRmsNormQuantize { eps } => {
            arity(3, 2)?;
            let h = scratch(DType::F32, ins[0].shape.dims())?;
            vec![
                OpNode::new(Op::Add, vec![ins[0], ins[1]], vec![outs[0]]),
                OpNode::new(Op::RmsNorm { eps: *eps }, vec![outs[0], ins[2]], vec![h]),
                OpNode::new(Op::QuantizeRows, vec![h], vec![outs[1]]),
            ]
        }
        Op::NormAddRmsNormQuantize { eps_b, eps } => {
            arity(4, 2)?;
            if ins[1].shape.dims() != ins[0].shape.dims() {
                return Err(OpError::Param {
                    op: node.op.name(),
                    message: format!(
                        "the post-normed input is {:?}, the residual {:?} (the same shape)",
                        ins[1].shape.dims(),
                        ins[0].shape.dims()
                    ),
                });
            }
            let hb = scratch(DType::F32, ins[1].shape.dims())?;
            let h = scratch(DType::F32, ins[0].shape.dims())?;
            vec![
                OpNode::new(Op::RmsNorm { eps: *eps_b }, vec![ins[1], ins[2]], vec![hb]),
                OpNode::new(Op::Add, vec![ins[0], hb], vec![outs[0]]),
                OpNode::new(Op::RmsNorm { eps: *eps }, vec![outs[0], ins[3]], vec![h]),
                OpNode::new(Op::QuantizeRows, vec![h], vec![outs[1]]),
            ]
        }
        Op::MatMulRows { rope, write, bias } => {
            let with_rope = rope.is_some() as usize;
            arity(2 + with_rope + *bias as usize, 1)?;
            let (x, w) = (ins[0], ins[1]);
            let rows = vec![x.rows(), w.rows()];
            let mut parts = Vec::new();
            let mut cur = if rope.is_none() && write.is_none() {
                outs[0]
            } else {
                scratch(DType::F32, &rows)?
            };
            parts.push(OpNode::new(Op::MatMul, vec![x, w], vec![cur]));
            if *bias {
                parts.push(OpNode::new(
                    Op::Add,
                    vec![cur, ins[2 + with_rope]],
                    vec![cur],
                ));
            }
            if let Some(r) = rope {
                let next = if write.is_some() {
                    scratch(DType::F32, &rows)?
                } else {
                    outs[0]
                };
                parts.push(OpNode::new(Op::Rope(*r), vec![cur, ins[2]], vec![next]));
                cur = next;
            }
            if let Some(wr) = write {
                parts.push(OpNode::new(
                    Op::SetRows {
                        start: wr.start,
                        ring: wr.ring,
                    },
                    vec![cur],
                    vec![outs[0]],
                ));
            }
            parts
        }
        Op::MatMulSiluQuantize { up } => {
            arity(3, 1)?;
            let (x, wg) = (ins[0], ins[1]);
            let g = scratch(DType::F32, &[x.rows(), wg.rows()])?;
            let mut parts = Vec::new();
            let u = if *up {
                let u = scratch(DType::F32, &[x.rows(), ins[2].rows()])?;
                parts.push(OpNode::new(Op::MatMul, vec![x, ins[2]], vec![u]));
                u
            } else {
                ins[2]
            };
            parts.push(OpNode::new(Op::MatMul, vec![x, wg], vec![g]));
            parts.push(OpNode::new(Op::SiluMulQuantize, vec![g, u], vec![outs[0]]));
            parts
        }
        Op::AttentionQuantize(p) => {
            arity(3, 1)?;
            let h = scratch(DType::F32, ins[0].shape.dims())?;
            vec![
                OpNode::new(Op::Attention(*p), vec![ins[0], ins[1], ins[2]], vec![h]),
                OpNode::new(Op::QuantizeRows, vec![h], vec![outs[0]]),
            ]
        }
        Op::ProjAttention(p) => {
            let count = p.k.is_some() as usize + p.v.is_some() as usize;
            arity(5 + count, 1 + count)?;
            let (x, pos) = (ins[0], ins[4]);
            let q = scratch(DType::F32, &[x.rows(), ins[3].rows()])?;
            let mut parts = vec![OpNode::new(
                Op::MatMulRows {
                    rope: Some(p.q_rope),
                    write: None,
                    bias: false,
                },
                vec![x, ins[3], pos],
                vec![q],
            )];
            for (pw, (w, cache)) in [p.k, p.v].into_iter().flatten().zip(absorbed(node)) {
                let mut inputs = vec![x, w];
                if pw.rope.is_some() {
                    inputs.push(pos);
                }
                parts.push(OpNode::new(
                    Op::MatMulRows {
                        rope: pw.rope,
                        write: Some(pw.write),
                        bias: false,
                    },
                    inputs,
                    vec![cache],
                ));
            }
            parts.push(OpNode::new(
                Op::AttentionQuantize(p.attn),
                vec![q, ins[1], ins[2]],
                vec![outs[0]],
            ));
            parts
        }
        _ => return Ok(None),
    };
    Ok(Some(parts))
}

/// Can a node of op `op` be the first of a pair [`fuse_pair`] merges? (A
/// cheap filter for the fusion pass; keep it in step with `fuse_pair`.)
pub fn starts_pair(op: &Op) -> bool {
    matches!(
        op,
        Op::RmsNorm { .. }
            | Op::SiluMul
            | Op::Rope(_)
            | Op::Add
            | Op::Attention(_)
            | Op::MatMul
            | Op::MatMulRows { .. }
    )
}

/// `([x, w], bias)` of a product with nothing fused after it: a plain
/// `matmul`, or a `matmul+bias`.
fn plain_product(node: &OpNode) -> Option<([Tensor; 2], Option<Tensor>)> {
    let xw = [*node.inputs.first()?, *node.inputs.get(1)?];
    match node.op {
        Op::MatMul => Some((xw, None)),
        Op::MatMulRows {
            rope: None,
            write: None,
            bias: true,
        } => Some((xw, Some(*node.inputs.get(2)?))),
        _ => None,
    }
}

/// `(weights, cache)` of the projections an [`Op::ProjAttention`] node
/// absorbed: the key's, then the value's.
fn absorbed(node: &OpNode) -> Vec<(Tensor, Tensor)> {
    let weights = node.inputs.iter().skip(5).copied();
    weights.zip(node.outputs.iter().skip(1).copied()).collect()
}

/// A decode projection `first` (a `matmul_rows` writing a cache, reading
/// the node's activation row) absorbed into `second`'s key (`slot` 1) or
/// value (`slot` 2) side, when it writes the cache that side reads.
fn absorb_projection(first: &OpNode, second: &OpNode, slot: usize) -> Option<OpNode> {
    let Op::ProjAttention(p) = &second.op else {
        return None;
    };
    let Op::MatMulRows {
        rope,
        write: Some(write),
        bias: false,
    } = first.op
    else {
        return None;
    };
    let (cache, view) = (first.outputs[0], second.inputs[slot]);
    let reads_cache = cache.buffer == view.buffer && cache.offset == view.offset;
    let same_row = first.inputs[0] == second.inputs[0];
    let same_positions = rope.is_none() || first.inputs.get(2) == Some(&second.inputs[4]);
    // The row goes where the attention reads this step's cell.
    let this_cell = write.start == p.attn.q_position && write.ring == p.attn.ring;
    let taken = if slot == 1 { p.k } else { p.v };
    if !reads_cache || !same_row || !same_positions || !this_cell || taken.is_some() {
        return None;
    }
    let mut params = **p;
    let pw = crate::op::ProjWrite { rope, write };
    if slot == 1 {
        params.k = Some(pw);
    } else {
        params.v = Some(pw);
    }
    // Canonical order: the key projection's weights and cache first.
    let mut parts = absorbed(second);
    let at = if slot == 1 { 0 } else { parts.len() };
    parts.insert(at, (first.inputs[1], cache));
    let mut inputs = second.inputs[..5].to_vec();
    inputs.extend(parts.iter().map(|(w, _)| *w));
    let mut outputs = vec![second.outputs[0]];
    outputs.extend(parts.iter().map(|(_, c)| *c));
    Some(OpNode::new(
        Op::ProjAttention(Box::new(params)),
        inputs,
        outputs,
    ))
}

/// The fused node for `first` followed by `second`, when weft has a fused
/// op for that pair and `second` reads exactly `first`'s output.
/// `keep_intermediate`: `first`'s output is read later, so the fused node
/// must still write it (only the add of `AddRmsNormQuantize` does).
pub fn fuse_pair(first: &OpNode, second: &OpNode, keep_intermediate: bool) -> Option<OpNode> {
    let out = *first.outputs.first()?;
    let reads_out = |i: usize| second.inputs.get(i) == Some(&out);
    match (&first.op, &second.op) {
        (Op::RmsNorm { eps }, Op::QuantizeRows) if reads_out(0) && !keep_intermediate => {
            Some(OpNode::new(
                Op::RmsNormQuantize { eps: *eps },
                first.inputs.clone(),
                second.outputs.clone(),
            ))
        }
        (Op::SiluMul, Op::QuantizeRows) if reads_out(0) && !keep_intermediate => Some(OpNode::new(
            Op::SiluMulQuantize,
            first.inputs.clone(),
            second.outputs.clone(),
        )),
        (Op::Rope(rope), Op::SetRows { start, ring }) if reads_out(0) && !keep_intermediate => {
            Some(OpNode::new(
                Op::RopeSetRows {
                    rope: *rope,
                    start: *start,
                    ring: *ring,
                },
                first.inputs.clone(),
                second.outputs.clone(),
            ))
        }
        // A decode product's bias row, added in place.
        (Op::MatMul, Op::Add)
            if reads_out(0)
                && second.outputs.first() == Some(&out)
                && second.inputs[1] != out
                && first.inputs[0].rows() == 1
                && second.inputs[1].rows() == 1 =>
        {
            Some(OpNode::new(
                Op::MatMulRows {
                    rope: None,
                    write: None,
                    bias: true,
                },
                vec![first.inputs[0], first.inputs[1], second.inputs[1]],
                second.outputs.clone(),
            ))
        }
        // A product (with its bias or not) read only by its rotation and/or
        // its cache write.
        (_, Op::Rope(r)) if reads_out(0) && !keep_intermediate => {
            let (xw, bias) = plain_product(first)?;
            Some(OpNode::new(
                Op::MatMulRows {
                    rope: Some(*r),
                    write: None,
                    bias: bias.is_some(),
                },
                [&xw[..], &[second.inputs[1]], bias.as_slice()].concat(),
                second.outputs.clone(),
            ))
        }
        (_, Op::SetRows { start, ring }) if reads_out(0) && !keep_intermediate => {
            let write = Some(crate::op::RowsWrite {
                start: *start,
                ring: *ring,
            });
            if let Op::MatMulRows {
                rope: Some(r),
                write: None,
                bias,
            } = &first.op
            {
                return Some(OpNode::new(
                    Op::MatMulRows {
                        rope: Some(*r),
                        write,
                        bias: *bias,
                    },
                    first.inputs.clone(),
                    second.outputs.clone(),
                ));
            }
            let (xw, bias) = plain_product(first)?;
            Some(OpNode::new(
                Op::MatMulRows {
                    rope: None,
                    write,
                    bias: bias.is_some(),
                },
                [&xw[..], bias.as_slice()].concat(),
                second.outputs.clone(),
            ))
        }
        (_, Op::RopeSetRows { rope, start, ring }) if reads_out(0) && !keep_intermediate => {
            let (xw, bias) = plain_product(first)?;
            Some(OpNode::new(
                Op::MatMulRows {
                    rope: Some(*rope),
                    write: Some(crate::op::RowsWrite {
                        start: *start,
                        ring: *ring,
                    }),
                    bias: bias.is_some(),
                },
                [&xw[..], &[second.inputs[1]], bias.as_slice()].concat(),
                second.outputs.clone(),
            ))
        }
        // The gate projection into silu_mul + quantize; then the up
        // projection (same activations) into that.
        (Op::MatMul, Op::SiluMulQuantize)
            if reads_out(0) && !keep_intermediate && second.inputs[1] != out =>
        {
            Some(OpNode::new(
                Op::MatMulSiluQuantize { up: false },
                vec![first.inputs[0], first.inputs[1], second.inputs[1]],
                second.outputs.clone(),
            ))
        }
        (Op::MatMul, Op::MatMulSiluQuantize { up: false })
            if reads_out(2) && !keep_intermediate && first.inputs[0] == second.inputs[0] =>
        {
            Some(OpNode::new(
                Op::MatMulSiluQuantize { up: true },
                vec![first.inputs[0], second.inputs[1], first.inputs[1]],
                second.outputs.clone(),
            ))
        }
        (Op::Attention(p), Op::QuantizeRows) if reads_out(0) && !keep_intermediate => {
            Some(OpNode::new(
                Op::AttentionQuantize(*p),
                first.inputs.clone(),
                second.outputs.clone(),
            ))
        }
        // The query projection into attention: the projections it reads
        // go into one node (the key and value ones below), so a decode
        // step's attention needs no level of its own for them.
        (
            Op::MatMulRows {
                rope: Some(r),
                write: None,
                bias: false,
            },
            Op::AttentionQuantize(p),
        ) if reads_out(0) && !keep_intermediate && first.inputs[0].rows() == 1 => {
            Some(OpNode::new(
                Op::ProjAttention(Box::new(crate::op::ProjAttentionParams {
                    attn: *p,
                    q_rope: *r,
                    k: None,
                    v: None,
                })),
                vec![
                    first.inputs[0],
                    second.inputs[1],
                    second.inputs[2],
                    first.inputs[1],
                    first.inputs[2],
                ],
                second.outputs.clone(),
            ))
        }
        // A cache-writing projection of the same row into that node (the
        // cache is read later: the node still writes it).
        (Op::MatMulRows { write: Some(_), .. }, Op::ProjAttention(_)) => {
            absorb_projection(first, second, 1).or_else(|| absorb_projection(first, second, 2))
        }
        // A post-norm added into the residual, then the next norm.
        (Op::RmsNorm { eps: eps_b }, Op::AddRmsNormQuantize { eps })
            if second.inputs[1] == out
                && second.inputs[0] != out
                && second.inputs[0].shape == out.shape
                && !keep_intermediate =>
        {
            Some(OpNode::new(
                Op::NormAddRmsNormQuantize {
                    eps_b: *eps_b,
                    eps: *eps,
                },
                vec![
                    second.inputs[0],
                    first.inputs[0],
                    first.inputs[1],
                    second.inputs[2],
                ],
                second.outputs.clone(),
            ))
        }
        // In-place residual add, then the next norm: the sum stays written.
        (Op::Add, Op::RmsNormQuantize { eps }) if reads_out(0) && first.inputs[0] == out => {
            Some(OpNode::new(
                Op::AddRmsNormQuantize { eps: *eps },
                vec![first.inputs[0], first.inputs[1], second.inputs[1]],
                vec![out, second.outputs[0]],
            ))
        }
        _ => None,
    }
}
