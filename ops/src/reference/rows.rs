//! Row movement: embedding lookup, cache writes, activation quantization.

use super::{f32_bytes, from_f32, to_f32, HostMemory};
use crate::dtype::DType;
use crate::tensor::Tensor;
use crate::OpError;

pub(super) fn get_rows(mem: &HostMemory, table: &Tensor, ids: &Tensor) -> Result<Vec<u8>, OpError> {
    let bytes = mem.bytes(table);
    let row = table.row_bytes();
    let mut out = Vec::new();
    for id in mem.to_i32(ids) {
        if id < 0 || id as usize >= table.rows() {
            return Err(OpError::Param {
                op: "get_rows",
                message: format!("id {id} outside a table of {} rows", table.rows()),
            });
        }
        let r = &bytes[id as usize * row..(id as usize + 1) * row];
        out.extend(to_f32(r, table.dtype, table.cols())?);
    }
    Ok(f32_bytes(out))
}

pub(super) fn quantize(mem: &HostMemory, x: &Tensor, dtype: DType) -> Result<Vec<u8>, OpError> {
    let values = mem.to_f32(x)?;
    let row_bytes = dtype.row_bytes(x.cols()).unwrap_or(0);
    let mut out = vec![0u8; row_bytes * x.rows()];
    for (src, dst) in values
        .chunks(x.cols())
        .zip(out.chunks_mut(row_bytes.max(1)))
    {
        crate::quant::quantize_row(dtype, src, dst)?;
    }
    Ok(out)
}

pub(super) fn set_rows(
    mem: &mut HostMemory,
    src: &Tensor,
    dst: &Tensor,
    start: u32,
    ring: Option<u32>,
) -> Result<(), OpError> {
    let values = mem.to_f32(src)?;
    let row = dst.row_bytes();
    for (i, chunk) in values.chunks(src.cols()).enumerate() {
        let p = start as usize + i;
        let slot = ring.map_or(p, |r| p % r as usize);
        let encoded = from_f32(chunk, dst.dtype)?;
        mem.bytes_mut(dst)[slot * row..(slot + 1) * row].copy_from_slice(&encoded);
    }
    Ok(())
}
