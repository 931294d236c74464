//! `out = x @ w^T` on CUDA: quantized matvec / matmul in the CPU's lane
//! order (`matmul.cu`), f32 activations quantized into the node's scratch
//! first (as the CPU does per call).

use super::launch::{
    bad_call, check_aligned, check_arity, launch as enqueue, natural_alignment, unsupported, Arg,
};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::quant::vec_dot_type;
use weft_ops::{DType, OpError, OpNode, Tensor};

/// Decode matvecs of one activation row, each with its rows' consumer
/// fused or not (`mm_rows_group_*` in fused.cu): a rope, a cache write, both
/// (`matmul_rows` nodes) or neither (a plain decode matmul), up to
/// [`GROUP_MAX`] nodes in one launch, one kernel per 32-element weight
/// format. A layer's q, k and v projections read the same normed row: one
/// launch of their blocks replaces a fork into three branches and the join
/// after them.
pub(super) const GROUP_KERNELS: &[&str] = &[
    "mm_rows_group_q4_0",
    "mm_rows_group_q4_1",
    "mm_rows_group_q5_0",
    "mm_rows_group_q8_0",
    "mm_rows_group_q4_0_staged",
    "mm_rows_group_q4_1_staged",
    "mm_rows_group_q5_0_staged",
    "mm_rows_group_q8_0_staged",
];

/// Nodes one grouped launch takes at most (fused.cu's `s0`..`s2`).
pub const GROUP_MAX: usize = 3;

/// One node of a grouped launch (fused.cu's `RowsSeg`, field for field).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RowsSeg {
    w: u64,
    out: u64,
    positions: u64,
    table: u64,
    step: u64,
    dst_row: u64,
    ra: super::rope::RopeArgs,
    start: u32,
    ring: u32,
    m: i32,
    first_block: i32,
    mode: i32,
    pre: i32,
    /// The node's bias row (f32), or 0.
    bias: u64,
}
const _: () = assert!(std::mem::size_of::<RowsSeg>() == 128);

/// A node of a grouped launch: a `matmul_rows` node's rope, cache write and
/// bias (none of them for a plain decode matmul), its tensors and step
/// scalars.
pub struct GroupMember<'a> {
    pub rope: Option<&'a weft_ops::RopeParams>,
    pub write: Option<weft_ops::RowsWrite>,
    pub bias: bool,
    pub ins: &'a [DeviceTensor],
    pub outs: &'a [DeviceTensor],
    pub step: u64,
}

/// The feed-forward's middle fused (`matmul_silu_quant_body` in fused.cu):
/// the gate projection (and the up projection, `gate_up`), silu_mul and
/// quantize, per weight format and activation format.
pub(super) const SILU_KERNELS: &[&str] = &[
    "mm_silu_q4_0_q8_0",
    "mm_silu_q4_0_q8_1",
    "mm_silu_q4_1_q8_0",
    "mm_silu_q4_1_q8_1",
    "mm_silu_q5_0_q8_0",
    "mm_silu_q5_0_q8_1",
    "mm_silu_q8_0_q8_0",
    "mm_silu_q8_0_q8_1",
    "mm_gate_up_silu_q4_0_q8_0",
    "mm_gate_up_silu_q4_0_q8_1",
    "mm_gate_up_silu_q4_1_q8_0",
    "mm_gate_up_silu_q4_1_q8_1",
    "mm_gate_up_silu_q5_0_q8_0",
    "mm_gate_up_silu_q5_0_q8_1",
    "mm_gate_up_silu_q8_0_q8_0",
    "mm_gate_up_silu_q8_0_q8_1",
    "mm_gate_up_silu_q4_0_q8_0_pair",
    "mm_gate_up_silu_q4_0_q8_1_pair",
    "mm_gate_up_silu_q4_1_q8_0_pair",
    "mm_gate_up_silu_q4_1_q8_1_pair",
    "mm_gate_up_silu_q5_0_q8_0_pair",
    "mm_gate_up_silu_q5_0_q8_1_pair",
    "mm_gate_up_silu_q8_0_q8_0_pair",
    "mm_gate_up_silu_q8_0_q8_1_pair",
];

pub(super) const KERNELS: &[&str] = &[
    "mm_q4_0_t1",
    "mm_q4_0_t1_long",
    "mm_q4_0_t8",
    "mm_q4_1_t1",
    "mm_q4_1_t1_long",
    "mm_q4_1_t8",
    "mm_q5_0_t1",
    "mm_q5_0_t1_long",
    "mm_q5_0_t8",
    "mm_q8_0_t1",
    "mm_q8_0_t1_long",
    "mm_q8_0_t8",
    "mm_q8_0_t1_staged",
    "mm_q4_k_t1",
    "mm_q4_k_t4",
    "mm_q6_k_t1",
    "mm_q6_k_t4",
    "mm_q4_k_t1_staged",
    "mm_q6_k_t1_staged",
    "mm_f32_dot_t1",
    "mm_f32_dot64_t1",
    "mm_f16_dot64_t1",
    "mm_f32_dot_t4",
    "mm_f16_dot_t1",
    "mm_f16_dot_t4",
    "mm_bf16_dot_t1",
    "mm_bf16_dot_t4",
    "mm_f32_tiny_t4",
    "mm_f16_tiny_t4",
    "mm_bf16_tiny_t4",
];

/// Tokens per thread when a product has more than one token.
const TOKENS_PER_THREAD: usize = 4;

pub(super) fn supports(node: &OpNode) -> Result<(), OpError> {
    let (x, w) = (&node.inputs[0], &node.inputs[1]);
    match w.dtype {
        DType::F32
        | DType::F16
        | DType::BF16
        | DType::Q4_0
        | DType::Q4_1
        | DType::Q5_0
        | DType::Q8_0
        | DType::Q4_K
        | DType::Q6_K => {}
        other => return Err(unsupported("matmul", format!("{other} weights"))),
    }
    let act = vec_dot_type(w.dtype);
    if x.dtype != act && x.dtype != DType::F32 {
        return Err(unsupported(
            "matmul",
            format!("{} weights with {} activations", w.dtype, x.dtype),
        ));
    }
    Ok(())
}

pub(super) fn scratch_bytes(node: &OpNode) -> usize {
    let (x, w) = (&node.inputs[0], &node.inputs[1]);
    let act = vec_dot_type(w.dtype);
    if x.dtype == DType::F32 && act != DType::F32 {
        act.row_bytes(x.cols()).unwrap_or(0) * x.rows()
    } else {
        0
    }
}

/// A decode matmul fused with its rows' consumer (`matmul+rope`,
/// `matmul+set_rows`, `matmul+rope+set_rows`): one token whose activations
/// are already in the weights' dot type, a 32-element weight format, and a
/// rope in the normal mode (its pairs are adjacent rows, so one block holds
/// both).
pub(super) fn supports_rows(
    node: &OpNode,
    rope: Option<&weft_ops::RopeParams>,
    write: Option<weft_ops::RowsWrite>,
    bias: bool,
) -> Result<(), OpError> {
    const OP: &str = "matmul_rows";
    decode_operands(OP, &node.inputs[0], &node.inputs[1])?;
    if bias {
        let b = node.inputs.get(2 + rope.is_some() as usize);
        if !b.is_some_and(|b| b.dtype == DType::F32 && b.shape.elements() == node.inputs[1].rows())
        {
            return Err(unsupported(
                OP,
                "a bias that is not one f32 row of the product's width".into(),
            ));
        }
    }
    if let Some(r) = rope {
        if r.mode != weft_ops::RopeMode::Normal
            || r.head_dim == 0
            || !r.head_dim.is_multiple_of(2)
            || r.n_dims > r.head_dim
            || !r.n_dims.is_multiple_of(2)
        {
            return Err(unsupported(
                OP,
                format!(
                    "a {:?} rope of {} of {} dimensions",
                    r.mode, r.n_dims, r.head_dim
                ),
            ));
        }
    }
    if write.is_some() {
        super::rows::supports_set_rows(&node.outputs[0])?;
    }
    Ok(())
}

/// A decode kernel stages the activation row in shared memory: refuses rows
/// past the device's limit.
fn check_act_row(op: &'static str, limit: usize, act_row: usize, k: usize) -> Result<(), OpError> {
    if act_row > limit {
        return Err(bad_call(
            op,
            format!("rows of {k} need {act_row} bytes of shared memory per block"),
        ));
    }
    Ok(())
}

/// The operands the fused decode kernels take: one token of activations
/// already in the weights' dot type, a 32-element weight format.
pub(super) fn decode_operands(op: &'static str, x: &Tensor, w: &Tensor) -> Result<(), OpError> {
    block32_name(op, w.dtype)?;
    if x.rows() != 1 || x.dtype != vec_dot_type(w.dtype) {
        return Err(unsupported(
            op,
            format!(
                "{} rows of {} activations (one token, quantized)",
                x.rows(),
                x.dtype
            ),
        ));
    }
    Ok(())
}

/// The 32-element weight formats' kernel-name part.
pub(super) fn block32_name(op: &'static str, dtype: DType) -> Result<&'static str, OpError> {
    match dtype {
        DType::Q4_0 => Ok("q4_0"),
        DType::Q4_1 => Ok("q4_1"),
        DType::Q5_0 => Ok("q5_0"),
        DType::Q8_0 => Ok("q8_0"),
        other => Err(unsupported(op, format!("{other} weights"))),
    }
}

/// The gate projection (and the up projection, `up`) fused with silu_mul
/// and quantize: one token of quantized activations, 32-element weight
/// formats (gate and up alike), a Q8_0 / Q8_1 output of whole blocks.
pub(super) fn supports_silu(node: &OpNode, up: bool) -> Result<(), OpError> {
    const OP: &str = "matmul_silu_quantize";
    let (x, wg, third, out) = (
        &node.inputs[0],
        &node.inputs[1],
        &node.inputs[2],
        &node.outputs[0],
    );
    decode_operands(OP, x, wg)?;
    if up && third.dtype != wg.dtype {
        return Err(unsupported(
            OP,
            format!("{} gate and {} up weights", wg.dtype, third.dtype),
        ));
    }
    if !up && third.dtype != DType::F32 {
        return Err(unsupported(OP, format!("a {} up product", third.dtype)));
    }
    if !matches!(out.dtype, DType::Q8_0 | DType::Q8_1) || !wg.rows().is_multiple_of(32) {
        return Err(unsupported(
            OP,
            format!(
                "{} rows into {} (Q8_0 / Q8_1 blocks of 32 rows)",
                wg.rows(),
                out.dtype
            ),
        ));
    }
    Ok(())
}

/// Launches the fused feed-forward middle (`supports_silu`).
///
/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch_silu(
    kernels: &CudaKernels,
    stream: &CudaStream,
    up: bool,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    const OP: &str = "matmul_silu_quantize";
    let (x, wg, third, out) = (&ins[0], &ins[1], &ins[2], &outs[0]);
    let (k, m) = (wg.tensor.cols(), wg.tensor.rows());
    for t in [x, wg, out] {
        check_aligned(OP, t, natural_alignment(t.tensor.dtype))?;
    }
    check_aligned(OP, third, natural_alignment(third.tensor.dtype).max(4))?;
    let fmt = block32_name(OP, wg.tensor.dtype)?;
    let act = if out.tensor.dtype == DType::Q8_1 {
        "q8_1"
    } else {
        "q8_0"
    };
    let act_row = vec_dot_type(wg.tensor.dtype).row_bytes(k).unwrap_or(0);
    // These kernels keep the default limit (48 KiB with their 128 bytes of
    // static shared memory): 40,000-odd columns, far past any FFN input.
    const LIMIT: usize = 48 * 1024 - 128;
    check_act_row(OP, LIMIT, act_row, k)?;
    // Gate and up rows staged in shared memory (mv_rows32_staged), a cluster
    // of two 16-row blocks per quantized block (compute capability 9.0),
    // when both matrices' 16 rows fit beside the activation row.
    let staged_bytes = 2 * 16 * wg.tensor.row_bytes() + act_row;
    let staged = up
        && super::launch::sm90()
        && staged_bytes <= LIMIT
        && wg.ptr.is_multiple_of(16)
        && third.ptr.is_multiple_of(16);
    let (name, shared, blocks, threads) = match (up, staged) {
        (true, true) => (
            format!("mm_gate_up_silu_{fmt}_{act}_pair"),
            staged_bytes,
            m / 16,
            128,
        ),
        (true, false) => (format!("mm_gate_up_silu_{fmt}_{act}"), act_row, m / 32, 256),
        _ => (format!("mm_silu_{fmt}_{act}"), act_row, m / 32, 256),
    };
    enqueue(
        stream,
        kernels.fns.get(OP, &name)?,
        (blocks as u32, 1, 1),
        threads,
        shared as u32,
        &[
            Arg::Ptr(wg.ptr),
            Arg::Ptr(third.ptr),
            Arg::Ptr(x.ptr),
            Arg::Ptr(out.ptr),
            Arg::I32(m as i32),
            Arg::I32((k / 32) as i32),
            Arg::I32((wg.constant && (!up || third.constant)) as i32),
        ],
        OP,
    )
}

/// Whether [`launch_group`] takes `node` with others of its
/// [`OpNode::shared_launch_key`]: `matmul_rows` nodes, and decode matmuls
/// whose activation row is already in the weights' dot type (32-element
/// formats).
pub(super) fn groups(node: &OpNode) -> bool {
    let (Some(x), Some(w)) = (node.inputs.first(), node.inputs.get(1)) else {
        return false;
    };
    match node.op {
        weft_ops::Op::MatMulRows { .. } => true,
        weft_ops::Op::MatMul => decode_operands("matmul", x, w).is_ok(),
        _ => false,
    }
}

/// Launches up to [`GROUP_MAX`] decode matvecs of one activation row (one
/// [`OpNode::shared_launch_key`], every member [`groups`]) as one kernel:
/// each node's rows on its own blocks, computed as that node alone
/// computes them.
///
/// # Safety
/// See [`CudaKernels::launch`], for every member.
pub(super) unsafe fn launch_group(
    kernels: &CudaKernels,
    stream: &CudaStream,
    members: &[GroupMember],
) -> Result<(), OpError> {
    const OP: &str = "matmul_rows";
    if members.is_empty() || members.len() > GROUP_MAX {
        return Err(bad_call(
            OP,
            format!("{} nodes in one launch (1 to {GROUP_MAX})", members.len()),
        ));
    }
    let (x, w0) = (&members[0].ins[0], &members[0].ins[1]);
    let (k, wdtype) = (w0.tensor.cols(), w0.tensor.dtype);
    let fmt = block32_name(OP, wdtype)?;
    check_aligned(OP, x, natural_alignment(x.tensor.dtype))?;
    let act_row = vec_dot_type(wdtype).row_bytes(k).unwrap_or(0);
    check_act_row(OP, kernels.large_shared_limit, act_row, k)?;
    // Weight rows staged in shared memory (fused.cu's CH 0) when every
    // member's weights are 16-byte aligned and they fit, in blocks of
    // STAGED_ROWS_PER_BLOCK rows (MV_ROWS_PER_BLOCK unstaged).
    let staged_rows = STAGED_ROWS_PER_BLOCK;
    let staged_bytes = staged_rows * w0.tensor.row_bytes() + act_row;
    let staged = staged_bytes <= kernels.large_shared_limit
        && members.iter().all(|mb| mb.ins[1].ptr.is_multiple_of(16));
    let (block_rows, name, shared) = if staged {
        (
            staged_rows,
            format!("mm_rows_group_{fmt}_staged"),
            staged_bytes,
        )
    } else {
        (MV_ROWS_PER_BLOCK, format!("mm_rows_group_{fmt}"), act_row)
    };
    let mut segs = [RowsSeg::default(); GROUP_MAX];
    let mut blocks = 0usize;
    for (seg, mb) in segs.iter_mut().zip(members) {
        if mb.ins.len() < 2 || mb.outs.is_empty() {
            return Err(bad_call(OP, "a member without its operands".into()));
        }
        let (w, out) = (&mb.ins[1], &mb.outs[0]);
        if mb.ins[0].ptr != x.ptr || w.tensor.dtype != wdtype || w.tensor.cols() != k {
            return Err(bad_call(
                OP,
                "grouped nodes must share the activation row and the weights' format and columns"
                    .into(),
            ));
        }
        decode_operands(OP, &mb.ins[0].tensor, &w.tensor)?;
        check_aligned(OP, w, natural_alignment(wdtype))?;
        check_aligned(OP, out, natural_alignment(out.tensor.dtype))?;
        let m = w.tensor.rows();
        let bias = if mb.bias {
            let b = mb
                .ins
                .get(2 + mb.rope.is_some() as usize)
                .ok_or_else(|| bad_call(OP, "a bias needs its input".into()))?;
            if b.tensor.dtype != DType::F32 || b.tensor.shape.elements() != m {
                return Err(bad_call(
                    OP,
                    format!(
                        "a {} bias of {:?} for {m} rows",
                        b.tensor.dtype, b.tensor.shape
                    ),
                ));
            }
            check_aligned(OP, b, 4)?;
            b.ptr
        } else {
            0
        };
        let (positions, table, ra) = match mb.rope {
            Some(p) => {
                let (table, len) = kernels.rope_table(p).ok_or_else(|| {
                    bad_call(
                        OP,
                        "the rope table for these parameters is not prepared: call prepare() first"
                            .into(),
                    )
                })?;
                let pos = mb
                    .ins
                    .get(2)
                    .ok_or_else(|| bad_call(OP, "a rope needs its positions input".into()))?;
                (pos.ptr, table, super::rope::rope_args(p, 1, m, len))
            }
            None => (0, 0, super::rope::RopeArgs::default()),
        };
        // fused.cu's mode: 4 * rope + (D + 1), D = -1 for the f32 row itself.
        let d = match (mb.write, out.tensor.dtype) {
            (None, DType::F32) => 0,
            (None, other) => {
                return Err(bad_call(
                    OP,
                    format!("a {other} output without a cache write"),
                ))
            }
            (Some(_), DType::F32) => 1,
            (Some(_), DType::F16) => 2,
            (Some(_), _) => 3,
        };
        *seg = RowsSeg {
            w: w.ptr,
            out: out.ptr,
            positions,
            table,
            step: mb.step,
            dst_row: out.tensor.row_bytes() as u64,
            ra,
            start: mb.write.map_or(0, |w| w.start),
            ring: mb.write.and_then(|w| w.ring).unwrap_or(u32::MAX),
            m: m as i32,
            first_block: blocks as i32,
            mode: 4 * mb.rope.is_some() as i32 + d,
            pre: w.constant as i32,
            bias,
        };
        blocks += m.div_ceil(block_rows);
    }
    // A lone plain matvec of a tall Q8_0 matrix: the staged kernel.
    if let [mb] = members {
        if segs[0].mode == 0 && segs[0].bias == 0 {
            if let Some(plan) = staged_plan(kernels, &mb.ins[1]) {
                return launch_staged(
                    kernels,
                    stream,
                    &mb.ins[1],
                    x.ptr,
                    mb.outs[0].ptr,
                    &plan,
                    OP,
                );
            }
        }
    }
    enqueue(
        stream,
        kernels.fns.get(OP, &name)?,
        (blocks as u32, 1, 1),
        8 * block_rows as u32,
        shared as u32,
        &[
            Arg::Ptr(x.ptr),
            Arg::I32((k / 32) as i32),
            Arg::I32(members.len() as i32),
            Arg::Seg(segs[0]),
            Arg::Seg(segs[1]),
            Arg::Seg(segs[2]),
        ],
        OP,
    )
}

/// Kernels that stage activations in more than 48 KiB of shared memory for
/// long rows (their limit is raised at load).
pub(super) const LARGE_SHARED: &[&str] = &[
    "mm_q4_0_t1",
    "mm_q4_0_t1_long",
    "mm_q4_0_t8",
    "mm_q4_1_t1",
    "mm_q4_1_t1_long",
    "mm_q4_1_t8",
    "mm_q5_0_t1",
    "mm_q5_0_t1_long",
    "mm_q5_0_t8",
    "mm_q8_0_t1",
    "mm_q8_0_t1_long",
    "mm_q8_0_t8",
    "mm_q8_0_t1_staged",
    "mm_q4_k_t1_staged",
    "mm_q6_k_t1_staged",
];

/// Rows per block of the staged Q8_0 decode matvec (matmul.cu's
/// `mm_q8_0_t1_staged`).
const STAGED_ROWS: usize = 32;
/// Q8_0 decode matvecs of at least this many rows (an output projection
/// over the vocabulary) take the staged kernel: their 34-byte blocks are
/// only 2-byte aligned, so `mv_rows32` loads them in 2-byte pieces.
const STAGED_MIN_ROWS: usize = 8192;
/// Rows per block of the staged K-format decode matvecs
/// (`mm_q4_k_t1_staged`, `mm_q6_k_t1_staged`): as many blocks as
/// [`MV_ROWS_PER_BLOCK`] gives the 32-element formats, so a matrix of a few
/// hundred rows still spreads over the device.
const STAGED_KQUANT_ROWS: usize = 8;

/// A decode matvec whose weight rows are staged in shared memory.
struct Staged {
    kernel: &'static str,
    rows_per_block: usize,
    shared_bytes: usize,
}

/// The staged decode matvec for weights `w` (a block's rows, then the
/// activation row, in shared memory), when one serves them: tall Q8_0, or
/// Q4_K / Q6_K; 16-byte aligned, within the block's shared-memory limit.
fn staged_plan(kernels: &CudaKernels, w: &DeviceTensor) -> Option<Staged> {
    let (m, k) = (w.tensor.rows(), w.tensor.cols());
    let (kernel, rows_per_block) = match w.tensor.dtype {
        DType::Q8_0 if m >= STAGED_MIN_ROWS => ("mm_q8_0_t1_staged", STAGED_ROWS),
        DType::Q4_K => ("mm_q4_k_t1_staged", STAGED_KQUANT_ROWS),
        DType::Q6_K => ("mm_q6_k_t1_staged", STAGED_KQUANT_ROWS),
        _ => return None,
    };
    if !w.ptr.is_multiple_of(16) {
        return None;
    }
    let shared_bytes =
        rows_per_block * w.tensor.row_bytes() + vec_dot_type(w.tensor.dtype).row_bytes(k)?;
    (shared_bytes <= kernels.large_shared_limit).then_some(Staged {
        kernel,
        rows_per_block,
        shared_bytes,
    })
}

/// Launches a staged decode matvec: `out` = the product of `w` with the
/// quantized activation row at `act`.
///
/// # Safety
/// See [`CudaKernels::launch`].
unsafe fn launch_staged(
    kernels: &CudaKernels,
    stream: &CudaStream,
    w: &DeviceTensor,
    act: u64,
    out: u64,
    plan: &Staged,
    op: &'static str,
) -> Result<(), OpError> {
    let m = w.tensor.rows();
    enqueue(
        stream,
        kernels.fns.get(op, plan.kernel)?,
        (m.div_ceil(plan.rows_per_block) as u32, 1, 1),
        8 * plan.rows_per_block as u32,
        plan.shared_bytes as u32,
        &[
            Arg::Ptr(w.ptr),
            Arg::Ptr(act),
            Arg::Ptr(out),
            Arg::I32(m as i32),
            Arg::I32(1),
            Arg::I32((w.tensor.cols() / w.tensor.dtype.block_len()) as i32),
            Arg::I32(w.constant as i32),
        ],
        op,
    )
}

/// How one product is launched.
struct Plan {
    kernel: String,
    rows_per_block: usize,
    tokens_per_block: usize,
    shared_bytes: usize,
    threads: u32,
}

/// Blocks of a row a decode matvec thread loads in one round (`matmul.cu`'s
/// MV_CHUNK of the short kernel); longer rows take the `_long` kernel.
const MV_SHORT_BLOCKS: usize = 24;

/// Weight rows per block of a decode matvec that loads its weights directly
/// (eight threads each; staged grouped ones take [`STAGED_ROWS_PER_BLOCK`]).
/// Fewer rows per block spread a matrix over more SMs; eight measured best
/// on the H200 for SmolLM2's shapes (192 to 1536 rows: 2.7-5.0 µs, against
/// 3.1-5.8 µs at 32 rows per block).
const MV_ROWS_PER_BLOCK: usize = 8;
/// Weight rows per block of a grouped decode matvec whose rows are staged
/// in shared memory. SmolLM2 on an H200, tg128 device time per token:
/// 0.5262-0.5285 ms at 16, 0.5287-0.5295 at 8, 0.554 at 32. Staging the
/// rows with 16-byte copies (every global load moves whole lines) beat
/// lanes loading their 2- and 4-byte pieces directly: 0.546 against 0.583.
const STAGED_ROWS_PER_BLOCK: usize = 16;
/// Prefill grids of fewer 64-row blocks than this take 32-row blocks.
const SMALL_GRID_BLOCKS: usize = 1536;

fn plan(wdtype: DType, k: usize, m: usize, n: usize) -> Plan {
    let tt = if n == 1 { 1 } else { TOKENS_PER_THREAD };
    let simple = |kernel: String, rows_per_block: usize, tokens: usize| Plan {
        kernel,
        rows_per_block,
        tokens_per_block: tokens,
        shared_bytes: 0,
        threads: 256,
    };
    let block32 = |name: &str| {
        let act_row = vec_dot_type(wdtype).row_bytes(k).unwrap_or(0);
        if n == 1 {
            let long = if k / 32 > MV_SHORT_BLOCKS {
                "_long"
            } else {
                ""
            };
            let rows = MV_ROWS_PER_BLOCK;
            Plan {
                kernel: format!("mm_{name}_t1{long}"),
                rows_per_block: rows,
                tokens_per_block: 1,
                shared_bytes: act_row,
                threads: 8 * rows as u32,
            }
        } else {
            // 64 rows per block, or 32 when that leaves fewer than about four
            // blocks per SM slot of an H200 (a short last wave costs less).
            let rows = if m.div_ceil(64) * n.div_ceil(8) < SMALL_GRID_BLOCKS {
                32
            } else {
                64
            };
            Plan {
                kernel: format!("mm_{name}_t8"),
                rows_per_block: rows,
                tokens_per_block: 8,
                shared_bytes: 8 * act_row,
                threads: 4 * rows as u32,
            }
        }
    };
    match wdtype {
        DType::Q4_0 => block32("q4_0"),
        DType::Q4_1 => block32("q4_1"),
        DType::Q5_0 => block32("q5_0"),
        DType::Q8_0 => block32("q8_0"),
        DType::Q4_K => simple(format!("mm_q4_k_t{tt}"), 32, tt),
        DType::Q6_K => simple(format!("mm_q6_k_t{tt}"), 32, tt),
        _ => {
            let name = match wdtype {
                DType::F32 => "f32",
                DType::F16 => "f16",
                _ => "bf16",
            };
            let step = if wdtype == DType::BF16 { 32 } else { 16 };
            // ggml's tinyBLAS takes products of two or more tokens whose k and
            // weight rows fit its tiles; otherwise vec_dot.
            if n >= 2 && k.is_multiple_of(step) && m.is_multiple_of(4) {
                simple(
                    format!("mm_{name}_tiny_t{TOKENS_PER_THREAD}"),
                    16,
                    TOKENS_PER_THREAD,
                )
            } else if n == 1 && wdtype != DType::BF16 {
                // One thread per accumulator chain (64 per row).
                simple(format!("mm_{name}_dot64_t1"), 4, 1)
            } else {
                simple(format!("mm_{name}_dot_t{tt}"), 16, tt)
            }
        }
    }
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch(
    kernels: &CudaKernels,
    stream: &CudaStream,
    node: &OpNode,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    scratch: u64,
) -> Result<(), OpError> {
    const OP: &str = "matmul";
    check_arity(OP, ins, outs, 2)?;
    let (x, w, out) = (&ins[0], &ins[1], &outs[0]);
    let (n, k, m) = (x.tensor.rows(), w.tensor.cols(), w.tensor.rows());
    let act_dtype = vec_dot_type(w.tensor.dtype);
    check_aligned(OP, w, natural_alignment(w.tensor.dtype))?;
    check_aligned(OP, out, 4)?;
    let mut act = x.ptr;
    if x.tensor.dtype != act_dtype {
        if scratch == 0 {
            return Err(bad_call(
                OP,
                format!(
                    "f32 activations for {} weights need {} bytes of scratch (scratch_bytes)",
                    w.tensor.dtype,
                    scratch_bytes(node)
                ),
            ));
        }
        check_aligned(OP, x, 4)?;
        super::rows::quantize_into(kernels, stream, x.ptr, scratch, act_dtype, n, k)?;
        act = scratch;
    } else {
        check_aligned(OP, x, natural_alignment(act_dtype))?;
    }
    if act % natural_alignment(act_dtype) != 0 {
        return Err(bad_call(OP, format!("scratch at {act:#x} is misaligned")));
    }
    if kernels.numerics() == crate::Numerics::Fast {
        let p = super::fast::matmul::Product {
            act,
            out: out.ptr,
            m,
            n,
            k,
        };
        if super::fast::matmul::takes(w.tensor.dtype, n, k) {
            return super::fast::matmul::launch(kernels, stream, OP, w, &p);
        }
        if super::fast::matmul_half::takes(w, act, n, k, kernels.sms) {
            return super::fast::matmul_half::launch(kernels, stream, OP, w, &p);
        }
    }
    if n == 1 {
        if let Some(plan) = staged_plan(kernels, w) {
            return launch_staged(kernels, stream, w, act, out.ptr, &plan, OP);
        }
    }
    let p = plan(w.tensor.dtype, k, m, n);
    if p.shared_bytes > kernels.large_shared_limit {
        return Err(bad_call(
            OP,
            format!(
                "rows of {k} need {} bytes of shared memory per block",
                p.shared_bytes
            ),
        ));
    }
    let kb = if w.tensor.dtype.is_quantized() {
        k / w.tensor.dtype.block_len()
    } else {
        k
    };
    let grid_y = n.div_ceil(p.tokens_per_block);
    if grid_y > 65_535 {
        return Err(bad_call(OP, format!("{n} tokens exceed one launch")));
    }
    let f = kernels.fns.get(OP, &p.kernel)?;
    enqueue(
        stream,
        f,
        (m.div_ceil(p.rows_per_block) as u32, grid_y as u32, 1),
        p.threads,
        p.shared_bytes as u32,
        &[
            Arg::Ptr(w.ptr),
            Arg::Ptr(act),
            Arg::Ptr(out.ptr),
            Arg::I32(m as i32),
            Arg::I32(n as i32),
            Arg::I32(kb as i32),
            Arg::I32(w.constant as i32),
        ],
        OP,
    )
}
