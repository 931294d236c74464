//! Fused ops on CUDA (see fused.cu): rms_norm + quantize, add + rms_norm +
//! quantize, silu_mul + quantize, rope + set_rows. Same bits as their
//! chains (`weft_ops::fused::decompose`).

use super::launch::{
    bad_call, blocks_for, check_aligned, check_arity, launch as enqueue, natural_alignment,
    row_stage, unsupported, Arg, BLOCK,
};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::{DType, OpError, OpNode, RopeParams, Tensor};

pub(super) const KERNELS: &[&str] = &[
    "rms_norm_quant_q8_0",
    "rms_norm_quant_q8_1",
    "rms_norm_quant_q8_k",
    "rms_norm_quant_f16",
    "rms_norm_quant_bf16",
    "add_rms_norm_quant_q8_0",
    "add_rms_norm_quant_q8_1",
    "add_rms_norm_quant_q8_k",
    "add_rms_norm_quant_f16",
    "add_rms_norm_quant_bf16",
    "rms_norm_quant_warps_q8_0",
    "rms_norm_quant_warps_q8_1",
    "add_rms_norm_quant_warps_q8_0",
    "add_rms_norm_quant_warps_q8_1",
    "norm_add_norm_quant_warps_q8_0",
    "norm_add_norm_quant_warps_q8_1",
    "silu_mul_quant_q8_0",
    "silu_mul_quant_q8_1",
    "silu_mul_quant_q8_k",
    "silu_mul_quant_f16",
    "silu_mul_quant_bf16",
    "rope_set_rows_f32",
    "rope_set_rows_f16",
    "rope_set_rows_bf16",
];

fn act_suffix(op: &'static str, dtype: DType) -> Result<&'static str, OpError> {
    Ok(match dtype {
        DType::Q8_0 => "q8_0",
        DType::Q8_1 => "q8_1",
        DType::Q8_K => "q8_k",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        other => return Err(unsupported(op, format!("{other} activations"))),
    })
}

/// The `*_warps_*` norm kernel's name suffix (a warp per quantized block)
/// when it serves rows of `cols` values quantized to `out` under the sum
/// `method`: Q8_0 / Q8_1, 32..=1024 values in whole blocks, the bounded sum.
fn warps_suffix(out: DType, cols: usize, method: i32) -> Option<&'static str> {
    const BOUNDED: i32 = 3;
    if method != BOUNDED || cols == 0 || !cols.is_multiple_of(32) || cols > 1024 {
        return None;
    }
    match out {
        DType::Q8_0 => Some("q8_0"),
        DType::Q8_1 => Some("q8_1"),
        _ => None,
    }
}

/// A post-norm, residual add and pre-norm in one kernel
/// (`norm_add_norm_quant_warps_*`): rows of 32..=1024 values in whole
/// blocks quantized to Q8_0 / Q8_1, the post-normed input of the
/// residual's shape.
pub(super) fn supports_norm_add_norm(node: &OpNode) -> Result<(), OpError> {
    const OP: &str = "norm_add_norm_quantize";
    let (x, b, out) = (&node.inputs[0], &node.inputs[1], &node.outputs[1]);
    let cols = x.cols();
    let rows_ok = b.shape == x.shape;
    if warps_suffix(out.dtype, cols, super::launch::F64_SUM_BOUNDED).is_none() || !rows_ok {
        return Err(unsupported(
            OP,
            format!(
                "rows of {cols} into {} (32 to 1024 values in whole Q8_0 / Q8_1 blocks)",
                out.dtype
            ),
        ));
    }
    Ok(())
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn norm_add_norm_quantize(
    kernels: &CudaKernels,
    stream: &CudaStream,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    eps_b: f32,
    eps: f32,
) -> Result<(), OpError> {
    const OP: &str = "norm_add_norm_quantize";
    check_arity(OP, ins, outs, 4)?;
    sum_and_rows(OP, outs)?;
    let (x, b, wb, w, sum, out) = (&ins[0], &ins[1], &ins[2], &ins[3], &outs[0], &outs[1]);
    for t in [x, b, wb, w, sum] {
        check_aligned(OP, t, 4)?;
    }
    check_aligned(OP, out, natural_alignment(out.tensor.dtype))?;
    let (rows, cols) = (x.tensor.rows(), x.tensor.cols());
    let suffix = warps_suffix(out.tensor.dtype, cols, super::launch::F64_SUM_BOUNDED)
        .ok_or_else(|| bad_call(OP, format!("rows of {cols} into {}", out.tensor.dtype)))?;
    let pre = (wb.constant && w.constant) as i32;
    enqueue(
        stream,
        kernels
            .fns
            .get(OP, &format!("norm_add_norm_quant_warps_{suffix}"))?,
        (rows as u32, 1, 1),
        cols as u32,
        0,
        &[
            Arg::Ptr(x.ptr),
            Arg::Ptr(b.ptr),
            Arg::Ptr(wb.ptr),
            Arg::Ptr(w.ptr),
            Arg::Ptr(sum.ptr),
            Arg::Ptr(out.ptr),
            Arg::I32(cols as i32),
            Arg::F32(eps_b),
            Arg::F32(eps),
            Arg::I32((b.tensor.rows() == 1) as i32),
            Arg::I32(pre),
        ],
        OP,
    )
}

/// A fused add's two outputs: the sum and the quantized rows.
fn sum_and_rows(op: &'static str, outs: &[DeviceTensor]) -> Result<(), OpError> {
    if outs.len() < 2 {
        return Err(bad_call(
            op,
            "expected two outputs (the sum and the quantized rows)".into(),
        ));
    }
    Ok(())
}

pub(super) fn supports_quantized(op: &'static str, out: &Tensor) -> Result<(), OpError> {
    act_suffix(op, out.dtype).map(|_| ())
}

/// `early`: let the next kernel launch before this one waits (see
/// [`CudaKernels::launches_early`]).
///
/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn rms_norm_quantize(
    kernels: &CudaKernels,
    stream: &CudaStream,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    eps: f32,
    early: bool,
) -> Result<(), OpError> {
    const OP: &str = "rms_norm_quantize";
    check_arity(OP, ins, outs, 2)?;
    let (x, w, out) = (&ins[0], &ins[1], &outs[0]);
    let o = NormOperands {
        x,
        add: None,
        w,
        out,
    };
    norm_quantize(kernels, stream, OP, o, eps, early)
}

/// `early`: let the next kernel launch before this one waits (see
/// [`CudaKernels::launches_early`]).
///
/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn add_rms_norm_quantize(
    kernels: &CudaKernels,
    stream: &CudaStream,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    eps: f32,
    early: bool,
) -> Result<(), OpError> {
    const OP: &str = "add_rms_norm_quantize";
    check_arity(OP, ins, outs, 3)?;
    sum_and_rows(OP, outs)?;
    let (x, b, w, sum, out) = (&ins[0], &ins[1], &ins[2], &outs[0], &outs[1]);
    let o = NormOperands {
        x,
        add: Some((b, sum)),
        w,
        out,
    };
    norm_quantize(kernels, stream, OP, o, eps, early)
}

/// A norm+quantize's tensors: rms_norm(x) is quantized into `out`, or with
/// `add` = (b, sum) rms_norm of x + b, the sum written to `sum` first.
#[derive(Clone, Copy)]
struct NormOperands<'a> {
    x: &'a DeviceTensor,
    add: Option<(&'a DeviceTensor, &'a DeviceTensor)>,
    w: &'a DeviceTensor,
    out: &'a DeviceTensor,
}

/// Launches a norm+quantize: the warp-per-block kernel where it serves the
/// rows (`warps_suffix`), the row kernel otherwise.
///
/// # Safety
/// See [`CudaKernels::launch`].
unsafe fn norm_quantize(
    kernels: &CudaKernels,
    stream: &CudaStream,
    op: &'static str,
    o: NormOperands,
    eps: f32,
    early: bool,
) -> Result<(), OpError> {
    let adds = [o.add.map(|a| a.0), o.add.map(|a| a.1)];
    for t in [Some(o.x), Some(o.w)].into_iter().chain(adds).flatten() {
        check_aligned(op, t, 4)?;
    }
    check_aligned(op, o.out, natural_alignment(o.out.tensor.dtype))?;
    let method = super::launch::F64_SUM_BOUNDED;
    let l = norm_launch(op, o, eps, method, early)?;
    let f = kernels.fns.get(op, &l.kernel)?;
    let grid = (l.blocks, 1, 1);
    enqueue(stream, f, grid, l.threads, l.shared, &l.args, op)
}

/// How a norm+quantize launches: kernel, grid, block, shared memory and
/// arguments (in the order of fused.cu's entries).
struct NormLaunch {
    kernel: String,
    blocks: u32,
    threads: u32,
    shared: u32,
    args: Vec<Arg>,
}

/// [`norm_quantize`]'s launch under the f64 sum `method`; `early`: the
/// kernel lets the next one launch before it waits (fused.cu's `pre` bit 1).
fn norm_launch(
    op: &'static str,
    o: NormOperands,
    eps: f32,
    method: i32,
    early: bool,
) -> Result<NormLaunch, OpError> {
    let NormOperands { x, add, w, out } = o;
    let pre = w.constant as i32 | (early as i32) << 1;
    let (rows, cols) = (x.tensor.rows(), x.tensor.cols());
    let prefix = if add.is_some() {
        "add_rms_norm_quant"
    } else {
        "rms_norm_quant"
    };
    // Pointers: x (, b), w (, sum), out.
    let mut args = vec![Arg::Ptr(x.ptr)];
    if let Some((b, _)) = add {
        args.push(Arg::Ptr(b.ptr));
    }
    args.push(Arg::Ptr(w.ptr));
    if let Some((_, sum)) = add {
        args.push(Arg::Ptr(sum.ptr));
    }
    args.push(Arg::Ptr(out.ptr));
    let broadcast = add.map(|(b, _)| Arg::I32((b.tensor.rows() == 1) as i32));
    if let Some(suffix) = warps_suffix(out.tensor.dtype, cols, method) {
        args.extend([Arg::I32(cols as i32), Arg::F32(eps)]);
        args.extend(broadcast);
        args.push(Arg::I32(pre));
        return Ok(NormLaunch {
            kernel: format!("{prefix}_warps_{suffix}"),
            blocks: rows as u32,
            threads: cols as u32,
            shared: 0,
            args,
        });
    }
    let (stage_bytes, staged) = row_stage(cols);
    args.extend([Arg::I32(rows as i32), Arg::I32(cols as i32), Arg::F32(eps)]);
    args.extend(broadcast);
    args.extend([Arg::I32(staged), Arg::I32(method), Arg::I32(pre)]);
    Ok(NormLaunch {
        kernel: format!("{prefix}_{}", act_suffix(op, out.tensor.dtype)?),
        blocks: rows as u32,
        threads: 32,
        shared: stage_bytes,
        args,
    })
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn silu_mul_quantize(
    kernels: &CudaKernels,
    stream: &CudaStream,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    const OP: &str = "silu_mul_quantize";
    check_arity(OP, ins, outs, 2)?;
    let (g, u, out) = (&ins[0], &ins[1], &outs[0]);
    check_aligned(OP, g, 4)?;
    check_aligned(OP, u, 4)?;
    check_aligned(OP, out, natural_alignment(out.tensor.dtype))?;
    let (rows, cols) = (g.tensor.rows(), g.tensor.cols());
    let total = (rows * cols) as u64;
    // Q8_0 / Q8_1: a warp per block, a thread per element.
    let threads = match out.tensor.dtype {
        DType::Q8_K => total / 256 * 32,
        _ => total,
    };
    let name = format!("silu_mul_quant_{}", act_suffix(OP, out.tensor.dtype)?);
    enqueue(
        stream,
        kernels.fns.get(OP, &name)?,
        (blocks_for(threads), 1, 1),
        BLOCK,
        0,
        &[
            Arg::Ptr(g.ptr),
            Arg::Ptr(u.ptr),
            Arg::Ptr(out.ptr),
            Arg::I32(rows as i32),
            Arg::I32(cols as i32),
        ],
        OP,
    )
}

/// # Safety
/// See [`CudaKernels::launch`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rope_set_rows(
    kernels: &CudaKernels,
    stream: &CudaStream,
    p: &RopeParams,
    start: u32,
    ring: Option<u32>,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    step: u64,
) -> Result<(), OpError> {
    const OP: &str = "rope_set_rows";
    check_arity(OP, ins, outs, 2)?;
    let (x, pos, dst) = (&ins[0], &ins[1], &outs[0]);
    super::rows::supports_set_rows(&dst.tensor)?;
    check_aligned(OP, x, 4)?;
    check_aligned(OP, pos, 4)?;
    check_aligned(OP, dst, natural_alignment(dst.tensor.dtype))?;
    let (table, table_len) = kernels.rope_table(p).ok_or_else(|| {
        bad_call(
            OP,
            "the rope table for these parameters is not prepared: call prepare() first".into(),
        )
    })?;
    let (rows, cols) = (x.tensor.rows(), x.tensor.cols());
    let suffix = match dst.tensor.dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        _ => "bf16",
    };
    let args = super::rope::rope_args(p, rows, cols, table_len);
    enqueue(
        stream,
        kernels.fns.get(OP, &format!("rope_set_rows_{suffix}"))?,
        (blocks_for(super::rope::rope_threads(p, rows, cols)), 1, 1),
        BLOCK,
        0,
        &[
            Arg::Ptr(x.ptr),
            Arg::Ptr(pos.ptr),
            Arg::Ptr(dst.ptr),
            Arg::Ptr(table),
            Arg::Rope(args),
            Arg::U64(dst.tensor.row_bytes() as u64),
            Arg::U32(start),
            Arg::U32(ring.unwrap_or(u32::MAX)),
            Arg::Ptr(step),
        ],
        OP,
    )
}

/// Rope parameters of a rope-carrying fused node, for `prepare`.
pub(super) fn rope_params(node: &OpNode) -> Option<RopeParams> {
    match &node.op {
        weft_ops::Op::RopeSetRows { rope, .. } => Some(*rope),
        weft_ops::Op::MatMulRows { rope, .. } => *rope,
        weft_ops::Op::ProjAttention(p) => Some(p.q_rope),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_graph::BufferId;
    use weft_ops::Shape;

    fn dev(ptr: u64, dtype: DType, dims: &[usize], constant: bool) -> DeviceTensor {
        DeviceTensor {
            ptr,
            tensor: Tensor::new(BufferId(0), 0, dtype, Shape::new(dims)).unwrap(),
            constant,
        }
    }

    /// The arguments, kind by kind and value by value, in the order of the
    /// fused.cu entry each launch names (its parameter list, spelled out).
    #[test]
    fn norm_launch_arguments_follow_the_kernel_signatures() {
        let x = dev(0x100, DType::F32, &[3, 576], false);
        let b = dev(0x200, DType::F32, &[1, 576], false);
        let w = dev(0x300, DType::F32, &[576], true);
        let sum = dev(0x400, DType::F32, &[3, 576], false);
        let out = dev(0x500, DType::Q8_1, &[3, 576], false);
        let show = |l: &NormLaunch| format!("{} {:?}", l.kernel, l.args);
        let eps = 0.5;
        // (x, w, out, cols, eps, pre)
        let ops = |x, add, out| NormOperands { x, add, w: &w, out };
        let l = norm_launch("t", ops(&x, None, &out), eps, 3, false).unwrap();
        assert_eq!(
            show(&l),
            "rms_norm_quant_warps_q8_1 [Ptr(256), Ptr(768), Ptr(1280), I32(576), F32(0.5), I32(1)]"
        );
        let l = norm_launch("t", ops(&x, None, &out), eps, 3, true).unwrap();
        assert!(show(&l).ends_with("I32(3)]"), "early launch: pre bit 1");
        assert_eq!((l.blocks, l.threads, l.shared), (3, 576, 0));
        // (x, b, w, sum_out, out, cols, eps, broadcast, pre)
        let l = norm_launch("t", ops(&x, Some((&b, &sum)), &out), eps, 3, false).unwrap();
        assert_eq!(
            show(&l),
            "add_rms_norm_quant_warps_q8_1 [Ptr(256), Ptr(512), Ptr(768), Ptr(1024), Ptr(1280), \
             I32(576), F32(0.5), I32(1), I32(1)]"
        );
        // (x, w, out, rows, cols, eps, staged, method, pre)
        let l = norm_launch("t", ops(&x, None, &out), eps, 1, false).unwrap();
        assert_eq!(
            show(&l),
            "rms_norm_quant_q8_1 [Ptr(256), Ptr(768), Ptr(1280), I32(3), I32(576), F32(0.5), \
             I32(1), I32(1), I32(1)]"
        );
        assert_eq!((l.blocks, l.threads, l.shared), (3, 32, 576 * 4));
        // (x, b, w, sum_out, out, rows, cols, eps, broadcast, staged, method, pre)
        let l = norm_launch("t", ops(&x, Some((&sum, &sum)), &out), eps, 0, false).unwrap();
        assert_eq!(
            show(&l),
            "add_rms_norm_quant_q8_1 [Ptr(256), Ptr(1024), Ptr(768), Ptr(1024), Ptr(1280), \
             I32(3), I32(576), F32(0.5), I32(0), I32(1), I32(0), I32(1)]"
        );
        // Q8_K rows always take the row kernel.
        let out_k = dev(0x500, DType::Q8_K, &[3, 512], false);
        let x_k = dev(0x100, DType::F32, &[3, 512], false);
        let l = norm_launch("t", ops(&x_k, None, &out_k), eps, 3, false).unwrap();
        assert_eq!(l.kernel, "rms_norm_quant_q8_k");
    }
}
