//! Row ops: `GetRows` (weft's gather), `QuantizeRows` (weft's quantizers,
//! writing the f32 companion too), the matmul prologue (dequantized
//! activations), `SetRows` (mlx-native's KV-cache copies for f32/f16
//! caches, weft's for bf16), `Copy` (mlx-native casts, weft's byte copy
//! for same-type copies) and `Write` (host bytes staged in the arena,
//! copied by a weft kernel inside the command buffer).
//!
//! mlx-native's embedding gathers are not used: they read and validate the
//! ids on the host while encoding, but weft's ids are written inside the
//! same command buffer (an uploaded token, the previous step's argmax), so
//! weft's gather checks them on the GPU and reports a bad id by label.

use super::{
    dim, mlx_error, size1, threads1, unsupported, Ctx, MetalTensor, MlxDType, NodeAux, Route,
};
use bytemuck::{Pod, Zeroable};
use mlx_native::ops::elementwise::{cast, CastDirection};
use mlx_native::ops::kv_cache_copy::{
    dispatch_kv_cache_copy_seq_f32, dispatch_kv_cache_copy_seq_f32_to_f16,
};
use mlx_native::{KernelArg, MTLSize, MlxBuffer};
use weft_ops::{DType, OpError, OpNode};

/// Tables `GetRows` reads (what `weft_dequant` decodes).
const GATHER_TYPES: [DType; 12] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q8_1,
    DType::Q8_K,
    DType::Q4_K,
    DType::Q6_K,
];

/// Activation formats the matmul prologue turns back into f32.
pub(super) const ACTIVATION_TYPES: [DType; 5] = [
    DType::Q8_0,
    DType::Q8_1,
    DType::Q8_K,
    DType::F16,
    DType::BF16,
];

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct RowsParams {
    rows: u32,
    cols: u32,
    src_row_bytes: u32,
    dtype: u32,
    table_rows: u32,
    status_slot: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SetRowsParams {
    rows: u32,
    cols: u32,
    start: u32,
    ring: u32,
    dst_dtype: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct QuantizeParams {
    blocks: u32,
    elements: u32,
    companion: u32,
}

pub(super) fn route_get_rows(node: &OpNode, table: &weft_ops::Tensor) -> Result<Route, OpError> {
    if !GATHER_TYPES.contains(&table.dtype) {
        return Err(unsupported(node, format!("{} tables", table.dtype)));
    }
    Ok(Route::Weft("weft_get_rows"))
}

pub(super) fn route_quantize(node: &OpNode, out: &weft_ops::Tensor) -> Result<Route, OpError> {
    Ok(Route::Weft(match out.dtype {
        DType::Q8_0 => "weft_quantize_q8_0",
        DType::Q8_1 => "weft_quantize_q8_1",
        DType::Q8_K => "weft_quantize_q8_k",
        DType::F16 => "weft_quantize_f16",
        DType::BF16 => "weft_quantize_bf16",
        DType::F32 => "weft_copy_u8",
        other => return Err(unsupported(node, format!("quantizing to {other}"))),
    }))
}

pub(super) fn route_set_rows(dst: &weft_ops::Tensor) -> Route {
    match dst.dtype {
        DType::F32 => Route::MlxNative("kv_cache_copy_seq_f32"),
        DType::F16 => Route::MlxNative("kv_cache_copy_seq_f32_to_f16"),
        _ => Route::Weft("weft_set_rows"),
    }
}

fn cast_direction(from: DType, to: DType) -> Option<(CastDirection, &'static str)> {
    Some(match (from, to) {
        (DType::F32, DType::F16) => (CastDirection::F32ToF16, "cast_f32_to_f16"),
        (DType::F16, DType::F32) => (CastDirection::F16ToF32, "cast_f16_to_f32"),
        (DType::F32, DType::BF16) => (CastDirection::F32ToBF16, "cast_f32_to_bf16"),
        (DType::BF16, DType::F32) => (CastDirection::BF16ToF32, "cast_bf16_to_f32"),
        (DType::BF16, DType::F16) => (CastDirection::BF16ToF16, "cast_bf16_to_f16"),
        (DType::F16, DType::BF16) => (CastDirection::F16ToBF16, "cast_f16_to_bf16"),
        _ => return None,
    })
}

pub(super) fn route_copy(
    node: &OpNode,
    src: &weft_ops::Tensor,
    dst: &weft_ops::Tensor,
) -> Result<Route, OpError> {
    if src.dtype == dst.dtype {
        return Ok(Route::Weft("weft_copy_u8"));
    }
    match cast_direction(src.dtype, dst.dtype) {
        Some((_, name)) => Ok(Route::MlxNative(name)),
        None => Err(unsupported(
            node,
            format!("copies {} -> {}", src.dtype, dst.dtype),
        )),
    }
}

/// Status words and slot for a node: the runtime's, or a scratch word.
fn status_of(cx: &mut Ctx<'_>, aux: &NodeAux) -> Result<(MlxBuffer, u32), OpError> {
    match &aux.status {
        Some((buf, slot)) => Ok((buf.clone(), *slot)),
        None => Ok((cx.arena.zeroed(4, MlxDType::U32)?, 0)),
    }
}

pub(super) fn get_rows(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    table: &MetalTensor,
    ids: &MetalTensor,
    out: &MetalTensor,
    aux: &NodeAux,
) -> Result<(), OpError> {
    let rows = dim(node, "ids", ids.elements())?;
    let cols = dim(node, "columns", table.tensor.cols())?;
    let (status, slot) = status_of(cx, aux)?;
    let params = RowsParams {
        rows,
        cols,
        src_row_bytes: dim(node, "row bytes", table.tensor.row_bytes())?,
        dtype: table.tensor.dtype.ggml_id(),
        table_rows: dim(node, "table rows", table.tensor.rows())?,
        status_slot: slot,
    };
    let (t, i, o) = (table.bytes()?, ids.bytes()?, out.bytes()?);
    cx.weft_grid(
        "weft_get_rows",
        &[
            (0, KernelArg::Buffer(&t)),
            (1, KernelArg::Buffer(&i)),
            (2, KernelArg::Buffer(&o)),
            (3, KernelArg::Bytes(bytemuck::bytes_of(&params))),
            (4, KernelArg::Buffer(&status)),
        ],
        MTLSize::new(cols as u64, rows as u64, 1),
        threads1(cols as u64),
    )
}

/// The f32 image of activation rows `x` in fresh arena scratch.
pub(super) fn dequant_rows(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    x: &MetalTensor,
) -> Result<MlxBuffer, OpError> {
    if !ACTIVATION_TYPES.contains(&x.tensor.dtype) {
        return Err(unsupported(node, format!("{} activations", x.tensor.dtype)));
    }
    let rows = dim(node, "rows", x.tensor.rows())?;
    let cols = dim(node, "columns", x.tensor.cols())?;
    let out = cx.arena.scratch(x.elements() * 4, MlxDType::F32)?;
    let params = RowsParams {
        rows,
        cols,
        src_row_bytes: dim(node, "row bytes", x.tensor.row_bytes())?,
        dtype: x.tensor.dtype.ggml_id(),
        table_rows: rows,
        status_slot: 0,
    };
    let src = x.bytes()?;
    cx.weft_grid(
        "weft_dequant_rows",
        &[
            (0, KernelArg::Buffer(&src)),
            (1, KernelArg::Buffer(&out)),
            (2, KernelArg::Bytes(bytemuck::bytes_of(&params))),
        ],
        MTLSize::new(cols as u64, rows as u64, 1),
        threads1(cols as u64),
    )?;
    Ok(out)
}

pub(super) fn quantize(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    x: &MetalTensor,
    out: &MetalTensor,
    aux: &NodeAux,
) -> Result<(), OpError> {
    let elements = dim(node, "elements", x.elements())?;
    if out.tensor.dtype == DType::F32 {
        return copy_bytes(cx, node, &x.bytes()?, &out.bytes()?, out.tensor.bytes());
    }
    let kernel = match route_quantize(node, &out.tensor)? {
        Route::Weft(k) | Route::MlxNative(k) => k,
    };
    let (src, dst) = (x.view(MlxDType::F32)?, out.bytes()?);
    let comp = aux.companion_out.clone().unwrap_or_else(|| dst.clone());
    let params = QuantizeParams {
        blocks: elements / out.tensor.dtype.block_len() as u32,
        elements,
        companion: u32::from(aux.companion_out.is_some()),
    };
    let bindings = [
        (0, KernelArg::Buffer(&src)),
        (1, KernelArg::Buffer(&dst)),
        (2, KernelArg::Buffer(&comp)),
        (3, KernelArg::Bytes(bytemuck::bytes_of(&params))),
    ];
    match out.tensor.dtype {
        // One simdgroup per block of 32, eight per threadgroup.
        DType::Q8_0 | DType::Q8_1 => cx.weft(
            kernel,
            &bindings,
            size1((params.blocks as u64).div_ceil(8)),
            MTLSize::new(256, 1, 1),
        ),
        // One threadgroup of 256 per block.
        DType::Q8_K => cx.weft(
            kernel,
            &bindings,
            size1(params.blocks as u64),
            MTLSize::new(256, 1, 1),
        ),
        _ => cx.weft_grid(
            kernel,
            &bindings,
            size1(elements as u64),
            threads1(elements as u64),
        ),
    }
}

pub(super) fn set_rows(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    src: &MetalTensor,
    dst: &MetalTensor,
    start: u32,
    ring: Option<u32>,
) -> Result<(), OpError> {
    let n = src.tensor.rows();
    let cols = dim(node, "columns", src.tensor.cols())?;
    // A ring keeps only the last `ring` of the rows written; passing only
    // those means no two threads write one slot.
    let (skip, count) = match ring {
        Some(r) if n > r as usize => (n - r as usize, r as usize),
        _ => (0, n),
    };
    let start = start
        .checked_add(dim(node, "rows", skip)?)
        .ok_or_else(|| unsupported(node, "positions above u32"))?;
    let count = dim(node, "rows", count)?;
    let skip = dim(node, "rows", skip)?;
    let capacity = match ring {
        Some(r) => r,
        None => dim(node, "cache rows", dst.tensor.rows())?,
    };
    let kernel = match route_set_rows(&dst.tensor) {
        Route::Weft(k) | Route::MlxNative(k) => k,
    };
    let (s, d) = (src.view(MlxDType::F32)?, dst.bytes()?);
    let (reg, dev, enc) = (&mut *cx.registry, cx.device.metal_device(), &mut *cx.enc);
    match dst.tensor.dtype {
        DType::F32 => dispatch_kv_cache_copy_seq_f32(
            enc,
            reg,
            dev,
            &s,
            &dst.view(MlxDType::F32)?,
            1,
            cols,
            capacity,
            start,
            count,
            skip,
        )
        .map_err(mlx_error(node, kernel)),
        DType::F16 => dispatch_kv_cache_copy_seq_f32_to_f16(
            enc,
            reg,
            dev,
            &s,
            &dst.view(MlxDType::F16)?,
            1,
            cols,
            capacity,
            start,
            count,
            skip,
        )
        .map_err(mlx_error(node, kernel)),
        _ => {
            let src_rows = src.view(MlxDType::F32)?;
            let offset = skip as u64 * src.tensor.row_bytes() as u64;
            let tail = super::view_of(
                &src_rows,
                offset,
                count as u64 * src.tensor.row_bytes() as u64,
                MlxDType::F32,
            )?;
            let params = SetRowsParams {
                rows: count,
                cols,
                start,
                ring: ring.unwrap_or(0),
                dst_dtype: dst.tensor.dtype.ggml_id(),
            };
            cx.weft_grid(
                "weft_set_rows",
                &[
                    (0, KernelArg::Buffer(&tail)),
                    (1, KernelArg::Buffer(&d)),
                    (2, KernelArg::Bytes(bytemuck::bytes_of(&params))),
                ],
                MTLSize::new(cols as u64, count as u64, 1),
                threads1(cols as u64),
            )
        }
    }
}

pub(super) fn copy(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    src: &MetalTensor,
    dst: &MetalTensor,
) -> Result<(), OpError> {
    if src.tensor.dtype == dst.tensor.dtype {
        return copy_bytes(cx, node, &src.bytes()?, &dst.bytes()?, dst.tensor.bytes());
    }
    let Some((direction, kernel)) = cast_direction(src.tensor.dtype, dst.tensor.dtype) else {
        return Err(unsupported(
            node,
            format!("copies {} -> {}", src.tensor.dtype, dst.tensor.dtype),
        ));
    };
    let mlx = |t: DType| match t {
        DType::F16 => MlxDType::F16,
        DType::BF16 => MlxDType::BF16,
        _ => MlxDType::F32,
    };
    let (s, d) = (
        src.view(mlx(src.tensor.dtype))?,
        dst.view(mlx(dst.tensor.dtype))?,
    );
    cast(
        cx.enc,
        &mut cx.registry,
        cx.device.metal_device(),
        &s,
        &d,
        src.elements(),
        direction,
    )
    .map_err(mlx_error(node, kernel))
}

pub(super) fn write(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    data: &[u8],
    out: &MetalTensor,
) -> Result<(), OpError> {
    let staged = cx.arena.upload(data, MlxDType::U8)?;
    copy_bytes(cx, node, &staged, &out.bytes()?, out.tensor.bytes())
}

/// Copies `bytes` bytes: by words when both views and the length are
/// 4-byte aligned, by bytes otherwise.
fn copy_bytes(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    src: &MlxBuffer,
    dst: &MlxBuffer,
    bytes: u64,
) -> Result<(), OpError> {
    let words = bytes.is_multiple_of(4)
        && src.byte_offset().is_multiple_of(4)
        && dst.byte_offset().is_multiple_of(4);
    let (kernel, n) = if words {
        ("weft_copy_u32", bytes / 4)
    } else {
        ("weft_copy_u8", bytes)
    };
    let n32 = dim(node, "bytes", n as usize)?;
    cx.weft_grid(
        kernel,
        &[
            (0, KernelArg::Buffer(src)),
            (1, KernelArg::Buffer(dst)),
            (2, KernelArg::Bytes(&n32.to_ne_bytes())),
        ],
        size1(n),
        threads1(n),
    )
}
