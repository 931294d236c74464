//! Row movement: embedding lookup, activation quantization, cache writes, copies.

use super::HostTensor;
use half::{bf16, f16};
use std::ops::Range;
use weft_ops::{DType, OpError, Tensor};

pub(super) fn supports_get_rows(table: &Tensor) -> Result<(), OpError> {
    match table.dtype {
        DType::F32
        | DType::F16
        | DType::BF16
        | DType::Q4_0
        | DType::Q4_1
        | DType::Q5_0
        | DType::Q8_0
        | DType::Q4_K
        | DType::Q6_K => Ok(()),
        other => Err(OpError::Unsupported {
            op: "get_rows",
            what: format!("{other} tables on the CPU"),
        }),
    }
}

pub(super) fn supports_quantize(out: &Tensor) -> Result<(), OpError> {
    match out.dtype {
        DType::Q8_0 | DType::Q8_1 | DType::Q8_K | DType::F16 | DType::BF16 => Ok(()),
        other => Err(OpError::Unsupported {
            op: "quantize",
            what: format!("{other} activations on the CPU"),
        }),
    }
}

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn get_rows(
    table: &HostTensor,
    ids: &HostTensor,
    out: &HostTensor,
    rows: Range<usize>,
) -> Result<(), OpError> {
    let ids = std::slice::from_raw_parts(ids.ptr as *const i32, ids.tensor.shape.elements());
    let (t, row) = (table.tensor, table.tensor.row_bytes());
    let dst = out.f32_rows_mut(rows.start, rows.len());
    for (i, r) in rows.enumerate() {
        let id = ids[r];
        if id < 0 || id as usize >= t.rows() {
            return Err(OpError::Param {
                op: "get_rows",
                message: format!("token id {id} is outside the table of {} rows", t.rows()),
            });
        }
        let src = std::slice::from_raw_parts(table.ptr.add(id as usize * row), row);
        convert_row(src, t.dtype, &mut dst[i * t.cols()..(i + 1) * t.cols()])?;
    }
    Ok(())
}

/// Decodes one row of any supported type into f32.
fn convert_row(src: &[u8], dtype: DType, dst: &mut [f32]) -> Result<(), OpError> {
    match dtype {
        DType::F32 => dst.copy_from_slice(bytemuck::cast_slice(src)),
        _ => weft_ops::quant::dequantize_row(dtype, src, dst)?,
    }
    Ok(())
}

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn quantize(
    x: &HostTensor,
    out: &HostTensor,
    rows: Range<usize>,
) -> Result<(), OpError> {
    let cols = x.tensor.cols();
    let xv = x.f32s();
    let dst = out.row_bytes_mut(rows.start, rows.len());
    let row = out.tensor.row_bytes();
    for (i, r) in rows.enumerate() {
        let src = &xv[r * cols..(r + 1) * cols];
        super::quant::quantize_activations(
            out.tensor.dtype,
            src,
            &mut dst[i * row..(i + 1) * row],
        )?;
    }
    Ok(())
}

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn set_rows(
    src: &HostTensor,
    dst: &HostTensor,
    start: u32,
    ring: Option<u32>,
    rows: Range<usize>,
) -> Result<(), OpError> {
    let cols = src.tensor.cols();
    let sv = src.f32s();
    for r in rows {
        let p = start as usize + r;
        let slot = ring.map_or(p, |n| p % n as usize);
        let values = &sv[r * cols..(r + 1) * cols];
        encode_row(values, dst.row_bytes_mut(slot, 1), dst.tensor.dtype)?;
    }
    Ok(())
}

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn copy(
    src: &HostTensor,
    dst: &HostTensor,
    rows: Range<usize>,
) -> Result<(), OpError> {
    let cols = src.tensor.cols();
    let srow = src.tensor.row_bytes();
    let mut tmp = vec![0f32; cols];
    for r in rows {
        let bytes = std::slice::from_raw_parts(src.ptr.add(r * srow), srow);
        convert_row(bytes, src.tensor.dtype, &mut tmp)?;
        encode_row(&tmp, dst.row_bytes_mut(r, 1), dst.tensor.dtype)?;
    }
    Ok(())
}

/// Encodes f32 values as a float row (round to nearest even).
fn encode_row(values: &[f32], dst: &mut [u8], dtype: DType) -> Result<(), OpError> {
    match dtype {
        DType::F32 => dst.copy_from_slice(bytemuck::cast_slice(values)),
        DType::F16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(values) {
                d.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
            }
        }
        DType::BF16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(values) {
                d.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
            }
        }
        other => {
            return Err(OpError::Unsupported {
                op: "set_rows",
                what: format!("{other} destinations"),
            })
        }
    }
    Ok(())
}
