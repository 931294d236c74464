//! Decode attention with the q/k/v projections it reads in one launch
//! (`qkv+attention+quantize`, proj_attn.cu): a cluster of six blocks per
//! query head computes the head's query rows and its kv head's key and
//! value rows, then its first block attends. A decode step's attention
//! then needs no level of its own for the projections (one barrier per
//! layer fewer); the bits are the chain's.

use super::fast::attention::SplitShape;
use super::launch::{
    bad_call, check_aligned, launch as enqueue, natural_alignment, unsupported, Arg,
};
use super::matmul::{block32_name, decode_operands};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::quant::vec_dot_type;
use weft_ops::{DType, Op, OpError, OpNode, ProjAttentionParams, RopeMode, Tensor};

pub(super) const KERNELS: &[&str] = &[
    "proj_attn_q4_0_q8_0",
    "proj_attn_q4_0_q8_1",
    "proj_attn_q4_1_q8_0",
    "proj_attn_q4_1_q8_1",
    "proj_attn_q5_0_q8_0",
    "proj_attn_q5_0_q8_1",
    "proj_attn_q8_0_q8_0",
    "proj_attn_q8_0_q8_1",
];

/// The same launches for numerics `fast`: block 0 attends only where the
/// one-pass body fits, the split kernel launched after it elsewhere.
pub(super) const SPLIT_KERNELS: &[&str] = &[
    "proj_attn_split_q4_0_q8_0",
    "proj_attn_split_q4_0_q8_1",
    "proj_attn_split_q4_1_q8_0",
    "proj_attn_split_q4_1_q8_1",
    "proj_attn_split_q5_0_q8_0",
    "proj_attn_split_q5_0_q8_1",
    "proj_attn_split_q8_0_q8_0",
    "proj_attn_split_q8_0_q8_1",
];

const OP: &str = "qkv+attention+quantize";

/// Threads per block (the attention block's; the others use eight lanes
/// per row of their half of a head).
const THREADS: u32 = 512;
/// Blocks per matrix in a head's cluster (proj_attn.cu's `PROJ_PARTS`).
const PARTS: usize = 2;

/// proj_attn.cu's `ProjArgs`, field for field (matrix 0 the query, 1 the
/// key, 2 the value; a zero `w`: not absorbed).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ProjArgs {
    w: [u64; 3],
    cache: [u64; 3],
    cache_row: [u64; 3],
    start: [u32; 3],
    ring: [u32; 3],
    step_at: [i32; 3],
    rope: [i32; 3],
    act: u64,
    positions: u64,
    table: u64,
    ra: super::rope::RopeArgs,
    q: u64,
    nb: i32,
    pre: i32,
    smem: u32,
}
const _: () = assert!(std::mem::size_of::<ProjArgs>() == 216);

/// The node's tensors by role: `(weights, cache)` of each matrix (the
/// query's cache is its scratch row, none here).
fn matrices<'a, T>(
    p: &ProjAttentionParams,
    ins: &'a [T],
    outs: &'a [T],
) -> [Option<(&'a T, Option<&'a T>)>; 3] {
    let mut extra = ins.iter().skip(5).zip(outs.iter().skip(1));
    let q = ins.get(3).map(|w| (w, None));
    let k = p.k.and_then(|_| extra.next()).map(|(w, c)| (w, Some(c)));
    let v = p.v.and_then(|_| extra.next()).map(|(w, c)| (w, Some(c)));
    [q, k, v]
}

/// Dynamic shared memory: `(where the projections' part starts, total)`.
fn shared_layout(p: &ProjAttentionParams, k: &Tensor, w: &Tensor) -> Option<(usize, usize)> {
    let (_, attn) = super::attention::one_row_args(&p.attn, 0, k, 0);
    let start = attn.next_multiple_of(16);
    let weights = (p.attn.head_dim / PARTS * w.row_bytes()).next_multiple_of(16);
    let act = vec_dot_type(w.dtype).row_bytes(w.cols())?;
    Some((start, start + weights + act))
}

pub(super) fn supports(
    node: &OpNode,
    p: &ProjAttentionParams,
    limit: usize,
) -> Result<(), OpError> {
    if !p.attn.flash {
        return Err(unsupported(
            OP,
            "flash attention off (the CPU backend has that path)".to_string(),
        ));
    }
    let (ins, outs) = (&node.inputs, &node.outputs);
    let absorbed = p.k.is_some() as usize + p.v.is_some() as usize;
    if ins.len() != 5 + absorbed || outs.len() != 1 + absorbed {
        return Err(bad_call(OP, "a node without its operands".into()));
    }
    let attn = OpNode::new(
        Op::AttentionQuantize(p.attn),
        vec![ins[0], ins[1], ins[2]],
        vec![outs[0]],
    );
    super::attention::supports_quantized(&attn, &p.attn)?;
    let (x, kv) = (&ins[0], ins[1].dtype);
    if kv != DType::F16 || x.rows() != 1 {
        return Err(unsupported(
            OP,
            format!("{} rows over a {kv} cache (one row, f16)", x.rows()),
        ));
    }
    let d = p.attn.head_dim;
    if !super::launch::sm90() || !d.is_multiple_of(8 * PARTS) || 8 * d / PARTS > THREADS as usize {
        return Err(unsupported(
            OP,
            format!("heads of {d} (a multiple of 16 up to 128, thread block clusters)"),
        ));
    }
    let wq = &ins[3];
    for (i, m) in matrices(p, ins, outs).into_iter().enumerate() {
        let Some((w, cache)) = m else { continue };
        decode_operands(OP, x, w)?;
        let heads = if i == 0 {
            p.attn.heads
        } else {
            p.attn.kv_heads
        };
        if w.dtype != wq.dtype || w.rows() != heads * d {
            return Err(unsupported(
                OP,
                format!(
                    "{} weights of {} rows (q/k/v alike, a row per head value)",
                    w.dtype,
                    w.rows()
                ),
            ));
        }
        if let Some(c) = cache {
            let view = &ins[i]; // the cache view attention reads (inputs 1 and 2)
            let same =
                c.buffer == view.buffer && c.offset == view.offset && c.cols() == view.cols();
            if !same {
                return Err(bad_call(
                    OP,
                    "a cache that is not the one attention reads".into(),
                ));
            }
            if c.dtype != DType::F16 || c.cols() != heads * d {
                return Err(unsupported(
                    OP,
                    format!("a {} cache of {} columns", c.dtype, c.cols()),
                ));
            }
        }
    }
    let r = p.q_rope;
    let k_rope = p.k.and_then(|k| k.rope);
    if r.mode != RopeMode::Normal
        || r.head_dim != d
        || r.n_dims > d
        || !r.n_dims.is_multiple_of(2)
        || p.v.is_some_and(|v| v.rope.is_some())
        || k_rope.is_some_and(|k| k != r)
    {
        return Err(unsupported(
            OP,
            format!(
                "a {:?} rope of {} of {} dimensions (or another for the keys)",
                r.mode, r.n_dims, r.head_dim
            ),
        ));
    }
    match shared_layout(p, &ins[1], wq) {
        Some((_, total)) if total <= limit => Ok(()),
        _ => Err(unsupported(
            OP,
            format!(
                "heads of {d} over rows of {} {} values (shared memory)",
                wq.cols(),
                wq.dtype
            ),
        )),
    }
}

/// `[q_position, rows of the cache view]`, then the key's and the value's
/// cache row, as absorbed.
pub(super) fn step_scalars(node: &OpNode, p: &ProjAttentionParams) -> Vec<u32> {
    let mut v = vec![p.attn.q_position, node.inputs[1].rows() as u32];
    v.extend([p.k, p.v].into_iter().flatten().map(|pw| pw.write.start));
    v
}

/// The rotated query row.
pub(super) fn scratch_bytes(node: &OpNode) -> usize {
    node.inputs.get(3).map_or(0, |wq| wq.rows() * 4)
}

/// `split`: numerics `fast` (the split kernel's shape), whose scratch
/// follows the query row's.
///
/// # Safety
/// See [`CudaKernels::launch`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn launch(
    kernels: &CudaKernels,
    stream: &CudaStream,
    node: &OpNode,
    p: &ProjAttentionParams,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    scratch: u64,
    step: u64,
    split: Option<SplitShape>,
) -> Result<(), OpError> {
    supports(node, p, kernels.large_shared_limit)?;
    if scratch == 0 {
        return Err(bad_call(OP, "no scratch for the query row".into()));
    }
    let (x, k, v, wq, pos, out) = (&ins[0], &ins[1], &ins[2], &ins[3], &ins[4], &outs[0]);
    check_aligned(OP, x, natural_alignment(x.tensor.dtype))?;
    check_aligned(OP, k, 16)?;
    check_aligned(OP, v, 16)?;
    check_aligned(OP, pos, 4)?;
    check_aligned(OP, out, natural_alignment(out.tensor.dtype))?;
    // The recorded view's rows, as attention's own launch takes them (a
    // replay's are in the step scalars).
    let (attn, _) = super::attention::one_row_args(
        &p.attn,
        wq.tensor.rows(),
        &node.inputs[1],
        out.tensor.cols(),
    );
    let (smem, total) = shared_layout(p, &k.tensor, &wq.tensor)
        .ok_or_else(|| bad_call(OP, "weights of no whole blocks".into()))?;
    let (table, len) = kernels.rope_table(&p.q_rope).ok_or_else(|| {
        bad_call(
            OP,
            "the rope table is not prepared: call prepare() first".into(),
        )
    })?;
    let mut a = ProjArgs {
        act: x.ptr,
        positions: pos.ptr,
        table,
        ra: super::rope::rope_args(&p.q_rope, 1, wq.tensor.rows(), len),
        q: scratch,
        nb: (wq.tensor.cols() / 32) as i32,
        pre: 1,
        smem: smem as u32,
        ..ProjArgs::default()
    };
    let writes = [None, p.k, p.v];
    let mut step_at = 2;
    for (i, m) in matrices(p, ins, outs).into_iter().enumerate() {
        let Some((w, cache)) = m else { continue };
        check_aligned(OP, w, natural_alignment(w.tensor.dtype))?;
        a.w[i] = w.ptr;
        a.pre &= w.constant as i32;
        a.rope[i] = (i == 0 || writes[i].is_some_and(|pw| pw.rope.is_some())) as i32;
        if let (Some(c), Some(pw)) = (cache, writes[i]) {
            check_aligned(OP, c, 2)?;
            a.cache[i] = c.ptr;
            a.cache_row[i] = c.tensor.row_bytes() as u64;
            a.start[i] = pw.write.start;
            a.ring[i] = pw.write.ring.unwrap_or(u32::MAX);
            a.step_at[i] = step_at;
            step_at += 1;
        }
    }
    let suffix = match out.tensor.dtype {
        DType::Q8_0 => "q8_0",
        DType::Q8_1 => "q8_1",
        other => return Err(bad_call(OP, format!("a {other} output"))),
    };
    let fmt = block32_name(OP, wq.tensor.dtype)?;
    let kind = if split.is_some() { "split_" } else { "" };
    enqueue(
        stream,
        kernels
            .fns
            .get(OP, &format!("proj_attn_{kind}{fmt}_{suffix}"))?,
        (p.attn.heads as u32, 1, (3 * PARTS) as u32),
        THREADS,
        total as u32,
        &[
            Arg::Proj(a),
            Arg::Ptr(k.ptr),
            Arg::Ptr(v.ptr),
            Arg::Ptr(out.ptr),
            Arg::Attn(attn),
            Arg::Ptr(step),
        ],
        OP,
    )?;
    let Some(shape) = split else { return Ok(()) };
    let states = scratch + (wq.tensor.rows() * 4).next_multiple_of(256) as u64;
    super::fast::attention::launch(
        kernels, stream, OP, &p.attn, shape, attn, scratch, k, v, out, states, step, true,
    )
}
