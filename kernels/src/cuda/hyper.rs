//! Hyper-connections on CUDA (see hyper.cu): the mixing coefficients
//! (`hc_mix`: pre, post, Sinkhorn comb), the collapse of the streams and
//! the post-mix. The collapse and the post-mix give the CPU's bits; the mix
//! too, except for f64 `exp` (CUDA's, glibc's on the CPU, both within an
//! ulp), so it is checked against a tolerance: 2^-20 relative per value
//! (a differing f64 exp moves an f32 result by an ulp at most, and only
//! next to a rounding midpoint). The f64 sums of squares are reproduced
//! like rms_norm's (the bounded method of common.cu): the CPU's sequential
//! sum exactly.
//!
//! Decode shapes (a few rows) are latency bound, so they get more threads
//! per row: on sm_90 a cluster of eight blocks per row (the `_cl` kernels,
//! for hc <= 5 mixes with streams and hc = 4 collapses of up to 4096 columns),
//! else one block of 1024 threads; many rows
//! get a block of 256 threads each.

use super::launch::{
    bad_call, check_aligned, check_arity, launch as enqueue, row_stage, unsupported, Arg,
    F64_SUM_BOUNDED,
};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::HcMixParams;
use weft_ops::{DType, Op, OpError, OpNode};

pub(super) const KERNELS: &[&str] = &[
    "hc_mix_f32",
    "hc_mix_cl_f32",
    "hc_collapse_f32",
    "hc_collapse_cl_f32",
    "hc_expand_f32",
];

/// Threads per row of hc_mix and hc_collapse when there are many rows.
const BLOCK: u32 = 256;
/// Threads per row when there are few (at most [`WIDE_ROWS`]).
const WIDE_BLOCK: u32 = 1024;
/// Rows up to which a row gets [`WIDE_BLOCK`] threads (or a cluster).
/// H200, hc 4 x 4096: at 128 rows 1024 threads take hc_mix 12.4 us and
/// hc_collapse 6.2 (256: 14.8 and 8.7); at 512 rows 256 threads win
/// (17.5 and 13.6 against 38.9 and 17.9).
const WIDE_ROWS: usize = 128;
/// Rows up to which the cluster kernels run (sm_90). H200, hc 4 x 4096,
/// Nsight Compute: one row 9.5 us (hc_mix) and 3.6 (hc_collapse) against
/// 10.1 and 4.4 with one block of 1024 threads (the kernels before took
/// 27.4 and 19.2); 37 rows 10.9 and 4.4; at 128 rows the wide block wins.
const CLUSTER_ROWS: usize = 64;
/// Blocks per row of the cluster kernels (`HC_CLUSTER` in hyper.cu).
const CLUSTER: u32 = 8;
/// Threads per block of the cluster kernels (`HC_CL_BLOCK` in hyper.cu).
const CLUSTER_BLOCK: u32 = 128;
/// Streams hc_mix handles: one thread per comb entry (`HC_MAX` in hyper.cu).
const MIX_MAX_STREAMS: usize = 16;
/// Streams up to which hc_mix's Sinkhorn runs in one warp (`HC_WARP_STREAMS`).
const MIX_WARP_STREAMS: usize = 5;
/// Columns up to which hc_collapse_cl_f32 takes a row (one float4 group
/// per thread of the cluster).
const COLLAPSE_CLUSTER_COLS: usize = 4 * (CLUSTER * CLUSTER_BLOCK) as usize;
/// Threads per block of hc_expand.
const EXPAND_BLOCK: u32 = 128;

pub(super) fn supports(node: &OpNode) -> Result<(), OpError> {
    let op = node.op.name();
    if let Some(t) = node
        .inputs
        .iter()
        .chain(&node.outputs)
        .find(|t| t.dtype != DType::F32)
    {
        return Err(unsupported(op, format!("{} tensors", t.dtype)));
    }
    let cols_ok = |t: &weft_ops::Tensor| t.cols() <= i32::MAX as usize;
    if !node.inputs.iter().chain(&node.outputs).all(cols_ok) {
        return Err(unsupported(op, "rows of more than 2^31 - 1 values".into()));
    }
    match &node.op {
        Op::HcMix(p) if p.hc > MIX_MAX_STREAMS => Err(unsupported(
            op,
            format!("{} streams (at most {MIX_MAX_STREAMS})", p.hc),
        )),
        Op::HcMix(p) if p.iters > i32::MAX as usize => {
            Err(unsupported(op, format!("{} Sinkhorn iterations", p.iters)))
        }
        Op::HcMix(_) | Op::HcCollapse { .. } | Op::HcExpand { .. } => Ok(()),
        other => Err(bad_call(other.name(), "not a hyper-connection node".into())),
    }
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
    supports(node)?;
    for t in ins.iter().chain(outs) {
        check_aligned(op, t, 4)?;
    }
    match &node.op {
        Op::HcMix(p) => mix(k, s, p, ins, outs),
        Op::HcCollapse { hc, norm_eps } => collapse(k, s, *hc, *norm_eps, ins, outs),
        Op::HcExpand { hc } => expand(k, s, *hc, ins, outs),
        other => Err(bad_call(other.name(), "not a hyper-connection node".into())),
    }
}

unsafe fn mix(
    k: &CudaKernels,
    s: &CudaStream,
    p: &HcMixParams,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    const OP: &str = "hc_mix";
    let norm = p.norm_eps.is_some();
    check_arity(OP, ins, outs, if norm { 4 } else { 3 })?;
    let (m, out) = (&ins[0], &outs[0]);
    let (rows, mix) = (m.tensor.rows(), m.tensor.cols());
    if mix != p.hc && mix != (2 + p.hc) * p.hc {
        return Err(bad_call(
            OP,
            format!("{mix} mixer outputs for {} streams", p.hc),
        ));
    }
    if rows == 0 {
        return Ok(());
    }
    let (x, xc) = match (norm, ins.get(3)) {
        (true, Some(x)) => (x.ptr, x.tensor.cols()),
        _ => (0, 0),
    };
    let method = F64_SUM_BOUNDED;
    let hc = p.hc;
    let warp = hc <= MIX_WARP_STREAMS;
    // The tail needs a thread per mixer output, two warps (Sinkhorn, pre
    // and post) or a thread per comb entry.
    let need = if warp { mix.max(64) } else { mix.max(hc * hc) }.next_multiple_of(32) as u32;
    let (name, grid, block) = if x != 0 && warp && rows <= CLUSTER_ROWS && has_clusters(k) {
        ("hc_mix_cl_f32", rows as u32 * CLUSTER, CLUSTER_BLOCK)
    } else if x == 0 {
        ("hc_mix_f32", rows as u32, need)
    } else if rows <= WIDE_ROWS {
        ("hc_mix_f32", rows as u32, WIDE_BLOCK)
    } else {
        ("hc_mix_f32", rows as u32, BLOCK.max(need))
    };
    enqueue(
        s,
        k.fns.get(OP, name)?,
        (grid, 1, 1),
        block,
        0,
        &[
            Arg::Ptr(m.ptr),
            Arg::Ptr(ins[1].ptr),
            Arg::Ptr(ins[2].ptr),
            Arg::Ptr(x),
            Arg::Ptr(out.ptr),
            Arg::I32(mix as i32),
            Arg::I32(hc as i32),
            Arg::I32(p.iters as i32),
            Arg::F32(p.eps),
            Arg::F32(p.norm_eps.unwrap_or(0.0)),
            Arg::I32(xc as i32),
            Arg::I32(method),
        ],
        OP,
    )
}

/// Whether `k`'s device has thread block clusters (sm_90 and later; the
/// capability read when the kernels were loaded).
fn has_clusters(k: &CudaKernels) -> bool {
    k.fns.major >= 9
}

unsafe fn collapse(
    k: &CudaKernels,
    s: &CudaStream,
    hc: usize,
    norm_eps: Option<f32>,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    const OP: &str = "hc_collapse";
    check_arity(OP, ins, outs, if norm_eps.is_some() { 3 } else { 2 })?;
    let (x, co, out) = (&ins[0], &ins[1], &outs[0]);
    let (rows, d) = (out.tensor.rows(), out.tensor.cols());
    if hc == 0 || x.tensor.cols() != hc * d || co.tensor.cols() < hc {
        return Err(bad_call(
            OP,
            format!(
                "{hc} streams of {:?}, coefficients {:?}, output {:?}",
                x.tensor.shape, co.tensor.shape, out.tensor.shape
            ),
        ));
    }
    if rows == 0 || d == 0 {
        return Ok(());
    }
    let w = match (norm_eps, ins.get(2)) {
        (Some(_), Some(w)) => w.ptr,
        _ => 0,
    };
    let method = F64_SUM_BOUNDED;
    let eps = norm_eps.unwrap_or(0.0);
    let cc = co.tensor.cols() as i32;
    if w != 0
        && hc == 4
        && d % 4 == 0
        && d <= COLLAPSE_CLUSTER_COLS
        && [x.ptr, out.ptr, w].iter().all(|p| p % 16 == 0)
        && rows <= CLUSTER_ROWS
        && has_clusters(k)
    {
        return enqueue(
            s,
            k.fns.get(OP, "hc_collapse_cl_f32")?,
            (rows as u32 * CLUSTER, 1, 1),
            CLUSTER_BLOCK,
            0,
            &[
                Arg::Ptr(x.ptr),
                Arg::Ptr(co.ptr),
                Arg::Ptr(w),
                Arg::Ptr(out.ptr),
                Arg::I32(d as i32),
                Arg::I32(cc),
                Arg::F32(eps),
            ],
            OP,
        );
    }
    // Few rows: a thread per float4 column group (one pass keeps y and the
    // weights in registers), up to 1024.
    let block = if rows <= WIDE_ROWS {
        (d.div_ceil(4).next_multiple_of(32) as u32).clamp(128, WIDE_BLOCK)
    } else {
        BLOCK
    };
    let (stage_bytes, staged) = if w != 0 { row_stage(d) } else { (0, 0) };
    enqueue(
        s,
        k.fns.get(OP, "hc_collapse_f32")?,
        (rows as u32, 1, 1),
        block,
        stage_bytes,
        &[
            Arg::Ptr(x.ptr),
            Arg::Ptr(co.ptr),
            Arg::Ptr(w),
            Arg::Ptr(out.ptr),
            Arg::I32(hc as i32),
            Arg::I32(d as i32),
            Arg::I32(cc),
            Arg::F32(eps),
            Arg::I32(staged),
            Arg::I32(method),
        ],
        OP,
    )
}

unsafe fn expand(
    k: &CudaKernels,
    s: &CudaStream,
    hc: usize,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    const OP: &str = "hc_expand";
    check_arity(OP, ins, outs, 3)?;
    let (x, f, co, out) = (&ins[0], &ins[1], &ins[2], &outs[0]);
    let (rows, d) = (f.tensor.rows(), f.tensor.cols());
    if hc == 0 || x.tensor.cols() != hc * d || co.tensor.cols() != (2 + hc) * hc {
        return Err(bad_call(
            OP,
            format!(
                "{hc} streams {:?}, sublayer output {:?}, coefficients {:?}",
                x.tensor.shape, f.tensor.shape, co.tensor.shape
            ),
        ));
    }
    if rows == 0 || d == 0 {
        return Ok(());
    }
    let blocks = d.div_ceil(EXPAND_BLOCK as usize).min(65_535) as u32;
    enqueue(
        s,
        k.fns.get(OP, "hc_expand_f32")?,
        (rows as u32, blocks, 1),
        EXPAND_BLOCK,
        0,
        &[
            Arg::Ptr(x.ptr),
            Arg::Ptr(f.ptr),
            Arg::Ptr(co.ptr),
            Arg::Ptr(out.ptr),
            Arg::I32(hc as i32),
            Arg::I32(d as i32),
        ],
        OP,
    )
}
