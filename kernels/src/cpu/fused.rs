//! Fused ops on the CPU: each work item runs the fused op's chain (see
//! `weft_ops::fused`) over its rows, with the intermediates in per-thread
//! scratch, through the same kernels the unfused ops use. Same bits as the
//! chain, without writing the intermediate to memory or a barrier between.

use super::{run_item, HostTensor, WorkSplit};
use std::cell::RefCell;
use std::ops::Range;
use weft_graph::BufferId;
use weft_ops::{OpError, OpNode, Shape, Tensor};

thread_local! {
    static SCRATCH: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// Buffer ids standing for scratch intermediates inside one work item.
const SCRATCH_BASE: u32 = u32::MAX - 64;

/// Buffer ids of [`run_whole`]'s intermediates (below [`SCRATCH_BASE`]: a
/// part may itself be a row-split fused op with scratch of its own).
const WHOLE_SCRATCH_BASE: u32 = SCRATCH_BASE - 64;

/// `t` restricted to `rows` when it is row-aligned with the chain's input
/// (`total` rows, or one element per row); broadcast tensors (a norm
/// weight) stay whole.
fn view(t: &HostTensor, rows: &Range<usize>, total: usize) -> Result<HostTensor, OpError> {
    if total > 1 && t.tensor.shape.rank() == 1 && t.tensor.cols() == total {
        let size = t.tensor.dtype.row_bytes(1).unwrap_or(0);
        let tensor = Tensor::new(
            t.tensor.buffer,
            t.tensor.offset + (rows.start * size) as u64,
            t.tensor.dtype,
            Shape::new(&[rows.len()]),
        )?;
        // SAFETY: the elements lie inside the tensor.
        return Ok(HostTensor {
            ptr: unsafe { t.ptr.add(rows.start * size) },
            tensor,
        });
    }
    if t.tensor.rows() != total || total == 1 {
        return Ok(*t);
    }
    let tensor = t.tensor.rows_view(rows.start, rows.len())?;
    let moved = tensor.offset - t.tensor.offset;
    Ok(HostTensor {
        // SAFETY: the view lies inside the tensor (rows_view checked it).
        ptr: unsafe { t.ptr.add(moved as usize) },
        tensor,
    })
}

/// Runs fused `node` on `rows`. `Ok(false)`: `node` is not a fused op.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn run(
    node: &OpNode,
    ins: &[HostTensor],
    outs: &[HostTensor],
    rows: Range<usize>,
) -> Result<bool, OpError> {
    let total = ins[0].tensor.rows();
    let n = rows.len();
    let mut scratch_shapes = Vec::new();
    let parts = weft_ops::fused::decompose(node, |dtype, dims| {
        let mut d = dims.to_vec();
        d[0] = n;
        if dims.len() > 1 {
            // Rows of the scratch are the item's rows only.
            let cols: usize = dims[1..].iter().product();
            d = vec![n, cols];
        }
        let t = Tensor::new(
            BufferId(SCRATCH_BASE + scratch_shapes.len() as u32),
            0,
            dtype,
            Shape::new(&d),
        )?;
        scratch_shapes.push(t);
        Ok(t)
    })?;
    let Some(parts) = parts else { return Ok(false) };
    SCRATCH.with(|cell| -> Result<(), OpError> {
        let mut bufs = cell.borrow_mut();
        while bufs.len() < scratch_shapes.len() {
            bufs.push(Vec::new());
        }
        for (buf, t) in bufs.iter_mut().zip(&scratch_shapes) {
            buf.resize(t.bytes() as usize, 0);
        }
        let host = |t: &Tensor, bufs: &mut Vec<Vec<u8>>| -> Result<HostTensor, OpError> {
            if t.buffer.0 >= SCRATCH_BASE {
                let b = &mut bufs[(t.buffer.0 - SCRATCH_BASE) as usize];
                return Ok(HostTensor {
                    ptr: b.as_mut_ptr(),
                    tensor: *t,
                });
            }
            let i = ins
                .iter()
                .chain(outs)
                .position(|x| x.tensor == *t)
                .ok_or_else(|| {
                    OpError::Record(format!(
                        "`{}`: a component names an unknown tensor",
                        node.op.name()
                    ))
                })?;
            let whole = if i < ins.len() {
                ins[i]
            } else {
                outs[i - ins.len()]
            };
            // A cache written by set_rows is addressed by position, never viewed.
            if matches!(node.op, weft_ops::Op::RopeSetRows { .. }) && i >= ins.len() {
                return Ok(whole);
            }
            view(&whole, &rows, total)
        };
        for part in &parts {
            let pi = part
                .inputs
                .iter()
                .map(|t| host(t, &mut bufs))
                .collect::<Result<Vec<_>, _>>()?;
            let po = part
                .outputs
                .iter()
                .map(|t| host(t, &mut bufs))
                .collect::<Result<Vec<_>, _>>()?;
            let local = WorkSplit::new(n, n);
            // The views start at the item's first row: set_rows needs the
            // true first position, which the view shifts.
            let shifted = shift_start(part, rows.start as u32);
            run_item(&shifted, &pi, &po, &local, 0)?;
        }
        Ok(())
    })?;
    Ok(true)
}

/// Runs fused `node` whole, each part of its chain over all of its work
/// in turn (intermediates in scratch): for chains whose parts split their
/// work differently (attention by heads, quantize by rows). One work item.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn run_whole(
    node: &OpNode,
    ins: &[HostTensor],
    outs: &[HostTensor],
) -> Result<(), OpError> {
    let mut scratch: Vec<(Tensor, Vec<u8>)> = Vec::new();
    // Scratch ids no tensor of the node uses: a part may be a fused op run
    // whole itself, whose node then names this level's scratch.
    let taken = |id: u32| ins.iter().chain(outs).any(|t| t.tensor.buffer.0 == id);
    let mut next = WHOLE_SCRATCH_BASE;
    let parts = weft_ops::fused::decompose(node, |dtype, dims| {
        while taken(next) {
            next += 1;
        }
        let t = Tensor::new(BufferId(next), 0, dtype, Shape::new(dims))?;
        next += 1;
        scratch.push((t, vec![0u8; t.bytes() as usize]));
        Ok(t)
    })?
    .ok_or_else(|| OpError::Record(format!("`{}` is not a fused op", node.op.name())))?;
    for part in &parts {
        let mut host = |t: &Tensor| -> Result<HostTensor, OpError> {
            if let Some((_, buf)) = scratch.iter_mut().find(|(s, _)| s == t) {
                return Ok(HostTensor {
                    ptr: buf.as_mut_ptr(),
                    tensor: *t,
                });
            }
            ins.iter()
                .chain(outs)
                .find(|x| x.tensor == *t)
                .copied()
                .ok_or_else(|| {
                    OpError::Record(format!(
                        "`{}`: a component names an unknown tensor",
                        node.op.name()
                    ))
                })
        };
        let pi = part
            .inputs
            .iter()
            .map(&mut host)
            .collect::<Result<Vec<_>, _>>()?;
        let po = part
            .outputs
            .iter()
            .map(&mut host)
            .collect::<Result<Vec<_>, _>>()?;
        let split = super::work_split(part, 1);
        for item in 0..split.items {
            run_item(part, &pi, &po, &split, item)?;
        }
    }
    Ok(())
}

/// `set_rows` inside a fused op works on a view starting `by` rows in: its
/// first position moves with it.
fn shift_start(part: &OpNode, by: u32) -> OpNode {
    match &part.op {
        weft_ops::Op::SetRows { start, ring } => OpNode::new(
            weft_ops::Op::SetRows {
                start: start + by,
                ring: *ring,
            },
            part.inputs.clone(),
            part.outputs.clone(),
        ),
        _ => part.clone(),
    }
}
