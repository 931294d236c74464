//! DeepSeek-V4 mixture-of-experts ops on CUDA (all but the expert matmul,
//! which is `matmul_id`): routing, expert weights, clamped SwiGLU and the
//! weighted combination, following `cpu/moe.rs` operation by operation
//! (kernels in moe.cu).
//!
//! Numerics: `swiglu_clamp` (glibc's expf ported), `moe_combine` (f32 in
//! slot order, as the CPU) and hash routing are bit-exact. The router score
//! `sqrt(softplus(x))` is f64 with CUDA's `exp` and `log1p` (no port of
//! glibc's f64 functions here), within a few f64 ulp of the CPU's: top-k
//! routing picks the same experts unless two biased scores lie within that
//! distance (exact ties, equal logits and biases, are broken towards the
//! lower id on both), and `moe_weights` are within 2 f32 ulp (in practice
//! the same bits).
//!
//! Errors the CPU reports from device data cannot be returned by a kernel:
//! a hash-routed token outside the table routes to `-1` in each of its slots,
//! and an expert id outside `0..experts` gets a NaN weight (NaN for the whole
//! token when normalizing). Everything known on the host (arity, dtypes,
//! shapes, sizes) is checked in `supports` and again at launch.

use super::launch::{bad_call, check_aligned, launch as enqueue, unsupported, Arg, BLOCK};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::MoeSelect;
use weft_ops::{DType, Op, OpError, OpNode, Tensor};

pub(super) const KERNELS: &[&str] = &[
    "moe_route_topk",
    "moe_route_hash",
    "moe_weights_f32",
    "moe_swiglu_clamp_f32",
    "moe_combine_f32",
];

/// Experts per top-k routing launch: their f64 keys sit in shared memory
/// (8 bytes each, under the default 48 KiB).
pub(super) const MAX_ROUTE_EXPERTS: usize = 4096;
/// Selected experts per token of `moe_weights` (f64 scores in shared memory).
pub(super) const MAX_WEIGHT_SLOTS: usize = 4096;
/// Threads per block of the top-k routing.
const ROUTE_THREADS: usize = 256;
/// Largest grid x dimension.
const MAX_GRID_X: u64 = i32::MAX as u64;

/// One launch, as the checks of a node found it.
#[derive(Clone, Copy, Debug)]
enum Plan {
    RouteTopK {
        rows: usize,
        experts: usize,
        k: usize,
    },
    RouteHash {
        count: u64,
        k: usize,
        table_rows: u64,
    },
    Weights {
        rows: usize,
        experts: usize,
        k: usize,
        normalize: bool,
        scale: f32,
    },
    Swiglu {
        count: u64,
        limit: f32,
    },
    Combine {
        count: u64,
        k: usize,
        d: usize,
        shared: bool,
    },
}

/// Checks a node of this family (arity, dtypes, shapes the kernels rely on,
/// size limits) and says how to launch it.
fn plan(op: &Op, ins: &[&Tensor], outs: &[&Tensor]) -> Result<Plan, OpError> {
    let name = op.name();
    let arity = |want: &[usize]| -> Result<(), OpError> {
        if !want.contains(&ins.len()) || outs.len() != 1 {
            return Err(bad_call(
                name,
                format!(
                    "expected {want:?} inputs and 1 output, got {} and {}",
                    ins.len(),
                    outs.len()
                ),
            ));
        }
        Ok(())
    };
    let dtype = |t: &Tensor, want: DType| -> Result<(), OpError> {
        if t.dtype != want {
            return Err(bad_call(
                name,
                format!("expected a {want} tensor, got {t:?}"),
            ));
        }
        Ok(())
    };
    let shapes = |ok: bool| -> Result<(), OpError> {
        if !ok {
            let ins: Vec<_> = ins.iter().map(|t| t.shape).collect();
            return Err(bad_call(
                name,
                format!("inputs {ins:?} do not fit output {:?}", outs[0].shape),
            ));
        }
        Ok(())
    };
    let fits_i32 = |what: &str, v: usize| -> Result<(), OpError> {
        if v > i32::MAX as usize {
            return Err(unsupported(name, format!("{what} = {v} (over i32)")));
        }
        Ok(())
    };
    let grid = |what: &str, blocks: u64| -> Result<(), OpError> {
        if blocks > MAX_GRID_X {
            return Err(unsupported(name, format!("{blocks} blocks of {what}")));
        }
        Ok(())
    };
    let elems = |t: &Tensor| t.shape.elements();
    match op {
        Op::MoeRoute(p) => {
            arity(&[match p.select {
                MoeSelect::TopK => 2,
                MoeSelect::Hash => 3,
            }])?;
            let (logits, out) = (ins[0], outs[0]);
            dtype(logits, DType::F32)?;
            dtype(out, DType::I32)?;
            let (rows, experts, k) = (logits.rows(), logits.cols(), p.k);
            shapes((1..=experts).contains(&k) && out.cols() == k && out.rows() == rows)?;
            match p.select {
                MoeSelect::TopK => {
                    dtype(ins[1], DType::F32)?;
                    shapes(elems(ins[1]) == experts)?;
                    if experts > MAX_ROUTE_EXPERTS {
                        return Err(unsupported(
                            name,
                            format!("top-k over {experts} experts (at most {MAX_ROUTE_EXPERTS})"),
                        ));
                    }
                    grid("routed tokens", rows as u64)?;
                    Ok(Plan::RouteTopK { rows, experts, k })
                }
                MoeSelect::Hash => {
                    let (table, tokens) = (ins[1], ins[2]);
                    dtype(table, DType::I32)?;
                    dtype(tokens, DType::I32)?;
                    shapes(table.cols() == k && elems(tokens) == rows)?;
                    fits_i32("k", k)?;
                    let count = (rows * k) as u64;
                    grid("hash-routed ids", count.div_ceil(BLOCK as u64))?;
                    Ok(Plan::RouteHash {
                        count,
                        k,
                        table_rows: table.rows() as u64,
                    })
                }
            }
        }
        Op::MoeWeights(p) => {
            arity(&[2])?;
            let (logits, ids, out) = (ins[0], ins[1], outs[0]);
            dtype(logits, DType::F32)?;
            dtype(ids, DType::I32)?;
            dtype(out, DType::F32)?;
            let (rows, experts, k) = (logits.rows(), logits.cols(), ids.cols());
            shapes(ids.rows() == rows && out.shape == ids.shape)?;
            if k > MAX_WEIGHT_SLOTS {
                return Err(unsupported(
                    name,
                    format!("{k} experts per token (at most {MAX_WEIGHT_SLOTS})"),
                ));
            }
            fits_i32("experts", experts)?;
            grid("tokens", rows as u64)?;
            Ok(Plan::Weights {
                rows,
                experts,
                k,
                normalize: p.normalize,
                scale: p.scale,
            })
        }
        Op::SwigluClamp { limit } => {
            arity(&[2])?;
            for t in [ins[0], ins[1], outs[0]] {
                dtype(t, DType::F32)?;
            }
            let count = elems(ins[0]);
            shapes(elems(ins[1]) == count && elems(outs[0]) == count)?;
            if limit.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
                return Err(bad_call(
                    name,
                    format!("the clamp limit must be positive, got {limit}"),
                ));
            }
            let count = count as u64;
            grid("elements", count.div_ceil(BLOCK as u64))?;
            Ok(Plan::Swiglu {
                count,
                limit: *limit,
            })
        }
        Op::MoeCombine => {
            arity(&[2, 3])?;
            for t in ins.iter().chain(outs) {
                dtype(t, DType::F32)?;
            }
            let (y, w, out) = (ins[0], ins[1], outs[0]);
            let (rows, k, d) = (out.rows(), w.cols(), out.cols());
            shapes(
                y.rows() == rows
                    && w.rows() == rows
                    && y.cols() == k * d
                    && ins.get(2).is_none_or(|s| elems(s) == rows * d),
            )?;
            fits_i32("k", k)?;
            fits_i32("d", d)?;
            let count = (rows * d) as u64;
            grid("elements", count.div_ceil(BLOCK as u64))?;
            Ok(Plan::Combine {
                count,
                k,
                d,
                shared: ins.len() == 3,
            })
        }
        other => Err(unsupported(other.name(), "the MoE family".into())),
    }
}

pub(super) fn supports(node: &OpNode) -> Result<(), OpError> {
    let ins: Vec<&Tensor> = node.inputs.iter().collect();
    let outs: Vec<&Tensor> = node.outputs.iter().collect();
    plan(&node.op, &ins, &outs).map(|_| ())
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch(
    k: &CudaKernels,
    s: &CudaStream,
    node: &OpNode,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    let op = node.op.name();
    let in_tensors: Vec<&Tensor> = ins.iter().map(|t| &t.tensor).collect();
    let out_tensors: Vec<&Tensor> = outs.iter().map(|t| &t.tensor).collect();
    let plan = plan(&node.op, &in_tensors, &out_tensors)?;
    for t in ins.iter().chain(outs) {
        check_aligned(op, t, 4)?;
    }
    let blocks = |count: u64| count.div_ceil(BLOCK as u64) as u32;
    let (name, grid, block, shared, args) = match plan {
        Plan::RouteTopK {
            rows,
            experts,
            k: slots,
        } => {
            let threads = experts.next_multiple_of(32).min(ROUTE_THREADS) as u32;
            (
                "moe_route_topk",
                rows as u32,
                threads,
                (experts * 8) as u32,
                vec![
                    Arg::Ptr(ins[0].ptr),
                    Arg::Ptr(ins[1].ptr),
                    Arg::Ptr(outs[0].ptr),
                    Arg::I32(experts as i32),
                    Arg::I32(slots as i32),
                ],
            )
        }
        Plan::RouteHash {
            count,
            k: slots,
            table_rows,
        } => (
            "moe_route_hash",
            blocks(count),
            BLOCK,
            0,
            vec![
                Arg::Ptr(ins[1].ptr),
                Arg::Ptr(ins[2].ptr),
                Arg::Ptr(outs[0].ptr),
                Arg::U64(count),
                Arg::I32(slots as i32),
                Arg::U64(table_rows),
            ],
        ),
        Plan::Weights {
            rows,
            experts,
            k: slots,
            normalize,
            scale,
        } => (
            "moe_weights_f32",
            rows as u32,
            32,
            (slots * 8) as u32,
            vec![
                Arg::Ptr(ins[0].ptr),
                Arg::Ptr(ins[1].ptr),
                Arg::Ptr(outs[0].ptr),
                Arg::I32(experts as i32),
                Arg::I32(slots as i32),
                Arg::I32(normalize as i32),
                Arg::F32(scale),
            ],
        ),
        Plan::Swiglu { count, limit } => (
            "moe_swiglu_clamp_f32",
            blocks(count),
            BLOCK,
            0,
            vec![
                Arg::Ptr(ins[0].ptr),
                Arg::Ptr(ins[1].ptr),
                Arg::Ptr(outs[0].ptr),
                Arg::U64(count),
                Arg::F32(limit),
            ],
        ),
        Plan::Combine {
            count,
            k: slots,
            d,
            shared,
        } => (
            "moe_combine_f32",
            blocks(count),
            BLOCK,
            0,
            vec![
                Arg::Ptr(ins[0].ptr),
                Arg::Ptr(ins[1].ptr),
                Arg::Ptr(if shared { ins[2].ptr } else { 0 }),
                Arg::Ptr(outs[0].ptr),
                Arg::U64(count),
                Arg::I32(slots as i32),
                Arg::I32(d as i32),
            ],
        ),
    };
    if grid == 0 {
        return Ok(());
    }
    enqueue(
        s,
        k.fns.get(op, name)?,
        (grid, 1, 1),
        block,
        shared,
        &args,
        op,
    )
}
