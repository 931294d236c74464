//! Row movement on CUDA: get_rows, activation quantization, set_rows, copy.

use super::launch::{
    bad_call, blocks_for, check_aligned, check_arity, launch as enqueue, natural_alignment,
    unsupported, Arg, BLOCK,
};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::{DType, OpError, Tensor};

pub(super) const KERNELS: &[&str] = &[
    "get_rows_f32",
    "get_rows_f16",
    "get_rows_bf16",
    "get_rows_q4_0",
    "get_rows_q4_1",
    "get_rows_q5_0",
    "get_rows_q8_0",
    "get_rows_q4_k",
    "get_rows_q6_k",
    "copy_f32_f32",
    "copy_f32_f16",
    "copy_f32_bf16",
    "copy_f16_f32",
    "copy_f16_f16",
    "copy_f16_bf16",
    "copy_bf16_f32",
    "copy_bf16_f16",
    "copy_bf16_bf16",
    "copy_q4_0_f32",
    "copy_q4_0_f16",
    "copy_q4_0_bf16",
    "copy_q4_1_f32",
    "copy_q4_1_f16",
    "copy_q4_1_bf16",
    "copy_q5_0_f32",
    "copy_q5_0_f16",
    "copy_q5_0_bf16",
    "copy_q8_0_f32",
    "copy_q8_0_f16",
    "copy_q8_0_bf16",
    "copy_q4_k_f32",
    "copy_q4_k_f16",
    "copy_q4_k_bf16",
    "copy_q6_k_f32",
    "copy_q6_k_f16",
    "copy_q6_k_bf16",
    "set_rows_f32",
    "set_rows_f16",
    "set_rows_bf16",
    "quant_q8_0",
    "quant_q8_1",
    "quant_q8_k",
    "quant_f16",
    "quant_bf16",
];

/// Table (and copy source) formats the row kernels decode.
fn decodable(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32
            | DType::F16
            | DType::BF16
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q8_0
            | DType::Q4_K
            | DType::Q6_K
    )
}

fn float_dst(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

pub(super) fn supports_get_rows(table: &Tensor) -> Result<(), OpError> {
    if decodable(table.dtype) {
        Ok(())
    } else {
        Err(unsupported("get_rows", format!("{} tables", table.dtype)))
    }
}

pub(super) fn supports_quantize(out: &Tensor) -> Result<(), OpError> {
    match out.dtype {
        DType::Q8_0 | DType::Q8_1 | DType::Q8_K | DType::F16 | DType::BF16 => Ok(()),
        other => Err(unsupported("quantize", format!("{other} activations"))),
    }
}

pub(super) fn supports_copy(src: &Tensor, dst: &Tensor) -> Result<(), OpError> {
    if decodable(src.dtype) && float_dst(dst.dtype) {
        Ok(())
    } else {
        Err(unsupported(
            "copy",
            format!("copies from {} to {}", src.dtype, dst.dtype),
        ))
    }
}

pub(super) fn supports_set_rows(dst: &Tensor) -> Result<(), OpError> {
    if float_dst(dst.dtype) {
        Ok(())
    } else {
        Err(unsupported(
            "set_rows",
            format!("{} destinations", dst.dtype),
        ))
    }
}

/// Quantizes `rows` f32 rows of `cols` at `src` into `dtype` at `dst`.
///
/// # Safety
/// Both addresses must cover the rows (`dst` in `dtype`'s row size).
pub(super) unsafe fn quantize_into(
    kernels: &CudaKernels,
    stream: &CudaStream,
    src: u64,
    dst: u64,
    dtype: DType,
    rows: usize,
    cols: usize,
) -> Result<(), OpError> {
    const OP: &str = "quantize";
    let (name, threads) = match dtype {
        DType::Q8_0 => ("quant_q8_0", rows * cols),
        DType::Q8_1 => ("quant_q8_1", rows * cols),
        DType::Q8_K => ("quant_q8_k", rows * cols / 256 * 32),
        DType::F16 => ("quant_f16", rows * cols),
        DType::BF16 => ("quant_bf16", rows * cols),
        other => return Err(unsupported(OP, format!("{other} activations"))),
    };
    let f = kernels.fns.get(OP, name)?;
    let grid = (blocks_for(threads as u64), 1, 1);
    let args = match dtype {
        DType::F16 | DType::BF16 => {
            vec![Arg::Ptr(src), Arg::Ptr(dst), Arg::U64((rows * cols) as u64)]
        }
        _ => vec![
            Arg::Ptr(src),
            Arg::Ptr(dst),
            Arg::I32(rows as i32),
            Arg::I32(cols as i32),
        ],
    };
    enqueue(stream, f, grid, BLOCK, 0, &args, OP)
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn quantize(
    kernels: &CudaKernels,
    stream: &CudaStream,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    check_arity("quantize", ins, outs, 1)?;
    let (x, out) = (&ins[0], &outs[0]);
    check_aligned("quantize", x, 4)?;
    check_aligned("quantize", out, natural_alignment(out.tensor.dtype))?;
    quantize_into(
        kernels,
        stream,
        x.ptr,
        out.ptr,
        out.tensor.dtype,
        x.tensor.rows(),
        x.tensor.cols(),
    )
}

fn type_suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::Q4_0 => "q4_0",
        DType::Q4_1 => "q4_1",
        DType::Q5_0 => "q5_0",
        DType::Q8_0 => "q8_0",
        DType::Q4_K => "q4_k",
        _ => "q6_k",
    }
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn get_rows(
    kernels: &CudaKernels,
    stream: &CudaStream,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    const OP: &str = "get_rows";
    check_arity(OP, ins, outs, 2)?;
    let (table, ids, out) = (&ins[0], &ins[1], &outs[0]);
    supports_get_rows(&table.tensor)?;
    check_aligned(OP, table, natural_alignment(table.tensor.dtype))?;
    check_aligned(OP, ids, 4)?;
    check_aligned(OP, out, 4)?;
    let (n, cols) = (out.tensor.rows(), table.tensor.cols());
    let name = format!("get_rows_{}", type_suffix(table.tensor.dtype));
    let f = kernels.fns.get(OP, &name)?;
    enqueue(
        stream,
        f,
        (blocks_for((n * cols) as u64), 1, 1),
        BLOCK,
        0,
        &[
            Arg::Ptr(table.ptr),
            Arg::Ptr(ids.ptr),
            Arg::Ptr(out.ptr),
            Arg::I32(n as i32),
            Arg::I32(cols as i32),
            Arg::I32(table.tensor.rows() as i32),
            Arg::U64(table.tensor.row_bytes() as u64),
        ],
        OP,
    )
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn copy(
    kernels: &CudaKernels,
    stream: &CudaStream,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    const OP: &str = "copy";
    check_arity(OP, ins, outs, 1)?;
    let (src, dst) = (&ins[0], &outs[0]);
    supports_copy(&src.tensor, &dst.tensor)?;
    check_aligned(OP, src, natural_alignment(src.tensor.dtype))?;
    check_aligned(OP, dst, natural_alignment(dst.tensor.dtype))?;
    let (rows, cols) = (src.tensor.rows(), src.tensor.cols());
    let name = format!(
        "copy_{}_{}",
        type_suffix(src.tensor.dtype),
        type_suffix(dst.tensor.dtype)
    );
    let f = kernels.fns.get(OP, &name)?;
    enqueue(
        stream,
        f,
        (blocks_for((rows * cols) as u64), 1, 1),
        BLOCK,
        0,
        &[
            Arg::Ptr(src.ptr),
            Arg::Ptr(dst.ptr),
            Arg::I32(rows as i32),
            Arg::I32(cols as i32),
            Arg::U64(src.tensor.row_bytes() as u64),
            Arg::U64(dst.tensor.row_bytes() as u64),
        ],
        OP,
    )
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn set_rows(
    kernels: &CudaKernels,
    stream: &CudaStream,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    start: u32,
    ring: Option<u32>,
    step: u64,
) -> Result<(), OpError> {
    const OP: &str = "set_rows";
    check_arity(OP, ins, outs, 1)?;
    let (src, dst) = (&ins[0], &outs[0]);
    supports_set_rows(&dst.tensor)?;
    check_aligned(OP, src, 4)?;
    check_aligned(OP, dst, natural_alignment(dst.tensor.dtype))?;
    if src.tensor.cols() != dst.tensor.cols() {
        return Err(bad_call(OP, "source and destination rows differ".into()));
    }
    let (n, cols) = (src.tensor.rows(), src.tensor.cols());
    let name = format!("set_rows_{}", type_suffix(dst.tensor.dtype));
    let f = kernels.fns.get(OP, &name)?;
    enqueue(
        stream,
        f,
        (blocks_for((n * cols) as u64), 1, 1),
        BLOCK,
        0,
        &[
            Arg::Ptr(src.ptr),
            Arg::Ptr(dst.ptr),
            Arg::I32(n as i32),
            Arg::I32(cols as i32),
            Arg::U64(dst.tensor.row_bytes() as u64),
            Arg::U32(start),
            Arg::U32(ring.unwrap_or(u32::MAX)),
            Arg::Ptr(step),
        ],
        OP,
    )
}
