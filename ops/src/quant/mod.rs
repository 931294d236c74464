//! GGUF block-quantized formats: layouts, reference (de)quantizers and
//! reference dot products.
//!
//! This module is the *definition* of every format weft computes with: plain
//! scalar Rust written for clarity, matching ggml (llama.cpp's tensor
//! library, commit 0c1e570 as vendored by llama-cpp-python 0.3.36) bit for
//! bit where that matters. Fast kernels live in `weft-kernels`
//! (`kernels/src/cpu/quant/`) and are tested against this module.
//!
//! One file per format owns its block struct (documented byte by byte), its
//! dequantizer, its quantizer and its dot product with the activation format
//! ggml pairs it with. This file holds the one dispatch on [`DType`] per
//! concern:
//!
//! - [`dequantize_row`]: any supported format to f32;
//! - [`quantize_row`]: f32 to a format. For the *activation* formats (Q8_0,
//!   Q8_1, Q8_K, F16, BF16) this is exactly what ggml's x86 CPU backend feeds
//!   its dot products; for weight formats it is ggml's `quantize_row_*_ref`
//!   (used to make test weights);
//! - [`vec_dot_type`]: the activation format a weight format is multiplied
//!   with;
//! - [`vec_dot_reference`]: the integer-exact dot product of one weight row
//!   with one activation row: integer sums per block, combined with the block
//!   scales in f32 in the order of ggml's generic C code.
//!
//! Adding a format (IQ2_XXS, MXFP4, ... for DeepSeek-V4): write `<fmt>.rs`
//! with its block, `dequantize`, optionally `quantize` and `dot`, then add one
//! arm to each `match` below.

mod common;
mod float;
mod iq2_xxs;
mod kquant_search;
mod mxfp4;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;
mod q8_1;
mod q8_k;

#[cfg(test)]
mod tests;

pub use common::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, nearest_int};
pub use iq2_xxs::BlockIq2Xxs;
pub use mxfp4::{e8m0_half, BlockMxfp4};
pub use q2_k::BlockQ2K;
pub use q3_k::BlockQ3K;
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q4_k::{unpack_scales_mins as unpack_q4k_scales_mins, BlockQ4K};
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;
pub use q8_0::BlockQ8_0;
pub use q8_1::BlockQ8_1;
pub use q8_k::BlockQ8K;

use crate::{DType, OpError};

/// Elements per block of the 256-element "K" super-block formats.
pub const QK_K: usize = 256;

/// Number of elements in a row of `bytes` bytes of `dtype`, checking that the
/// row is a whole number of blocks.
pub fn row_elements(dtype: DType, bytes: usize, op: &'static str) -> Result<usize, OpError> {
    let bb = dtype.block_bytes();
    if !bytes.is_multiple_of(bb) {
        return Err(OpError::Param {
            op,
            message: format!(
                "{bytes} bytes is not a whole number of {dtype} blocks ({bb} bytes each)"
            ),
        });
    }
    Ok(bytes / bb * dtype.block_len())
}

/// Decodes one row of `dtype` (`src`, a whole number of blocks) into
/// `dst`, whose length must be the row's element count.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<(), OpError> {
    let n = row_elements(dtype, src.len(), "dequantize")?;
    if n != dst.len() {
        return Err(OpError::Param {
            op: "dequantize",
            message: format!(
                "{} bytes of {dtype} hold {n} values but the output has room for {}",
                src.len(),
                dst.len()
            ),
        });
    }
    match dtype {
        DType::F32 => float::dequantize_f32(src, dst),
        DType::F16 => float::dequantize_f16(src, dst),
        DType::BF16 => float::dequantize_bf16(src, dst),
        DType::Q4_0 => q4_0::dequantize(blocks(src), dst),
        DType::Q4_1 => q4_1::dequantize(blocks(src), dst),
        DType::Q5_0 => q5_0::dequantize(blocks(src), dst),
        DType::Q5_1 => q5_1::dequantize(blocks(src), dst),
        DType::Q8_0 => q8_0::dequantize(blocks(src), dst),
        DType::Q8_1 => q8_1::dequantize(blocks(src), dst),
        DType::Q2_K => q2_k::dequantize(blocks(src), dst),
        DType::Q3_K => q3_k::dequantize(blocks(src), dst),
        DType::Q4_K => q4_k::dequantize(blocks(src), dst),
        DType::Q5_K => q5_k::dequantize(blocks(src), dst),
        DType::Q6_K => q6_k::dequantize(blocks(src), dst),
        DType::Q8_K => q8_k::dequantize(blocks(src), dst),
        DType::IQ2_XXS => iq2_xxs::dequantize(blocks(src), dst),
        DType::MXFP4 => mxfp4::dequantize(blocks(src), dst),
        other => return Err(unsupported("dequantize", other)),
    }
    Ok(())
}

/// Encodes `src` as one row of `dtype` into `dst` (exactly the row's bytes).
///
/// Q8_0 and Q8_1 follow ggml's x86 `quantize_row_q8_0/q8_1` (scale
/// `127/amax`, round half to even), which differ from ggml's scalar `_ref`
/// versions (scale `1/d`, round half away from zero) in rare last-bit cases;
/// Q8_K follows `quantize_row_q8_K_ref`, which is also what x86 uses.
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), OpError> {
    let expected = dtype.row_bytes(src.len()).ok_or_else(|| OpError::Param {
        op: "quantize",
        message: format!(
            "{} values is not a whole number of {dtype} blocks ({} values each)",
            src.len(),
            dtype.block_len()
        ),
    })?;
    if expected != dst.len() {
        return Err(OpError::Param {
            op: "quantize",
            message: format!(
                "{} values of {dtype} take {expected} bytes but the output has {}",
                src.len(),
                dst.len()
            ),
        });
    }
    match dtype {
        DType::F32 => float::quantize_f32(src, dst),
        DType::F16 => float::quantize_f16(src, dst),
        DType::BF16 => float::quantize_bf16(src, dst),
        DType::Q4_0 => q4_0::quantize(src, blocks_mut(dst)),
        DType::Q4_1 => q4_1::quantize(src, blocks_mut(dst)),
        DType::Q5_0 => q5_0::quantize(src, blocks_mut(dst)),
        DType::Q5_1 => q5_1::quantize(src, blocks_mut(dst)),
        DType::Q8_0 => q8_0::quantize(src, blocks_mut(dst)),
        DType::Q8_1 => q8_1::quantize(src, blocks_mut(dst)),
        DType::Q2_K => q2_k::quantize(src, blocks_mut(dst)),
        DType::Q3_K => q3_k::quantize(src, blocks_mut(dst)),
        DType::Q4_K => q4_k::quantize(src, blocks_mut(dst)),
        DType::Q5_K => q5_k::quantize(src, blocks_mut(dst)),
        DType::Q6_K => q6_k::quantize(src, blocks_mut(dst)),
        DType::Q8_K => q8_k::quantize(src, blocks_mut(dst)),
        DType::MXFP4 => mxfp4::quantize(src, blocks_mut(dst)),
        other => return Err(unsupported("quantize", other)),
    }
    Ok(())
}

/// The activation format ggml's CPU backend multiplies `weight` rows with
/// (`type_traits_cpu[..].vec_dot_type`): Q4_0/Q5_0/Q8_0/MXFP4 -> Q8_0,
/// Q4_1/Q5_1 -> Q8_1, K-quants and IQ formats -> Q8_K, F16 -> F16,
/// BF16 -> BF16. Every other type is multiplied in f32.
pub fn vec_dot_type(weight: DType) -> DType {
    match weight {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::MXFP4 => DType::Q8_0,
        DType::Q4_1 | DType::Q5_1 => DType::Q8_1,
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ2_XXS => {
            DType::Q8_K
        }
        DType::F16 => DType::F16,
        DType::BF16 => DType::BF16,
        _ => DType::F32,
    }
}

/// Dot product of one weight row with one activation row of
/// `vec_dot_type(wdtype)`, the way ggml's generic C code computes it:
/// exact integer sums per block, combined with the f32 block scales.
pub fn vec_dot_reference(
    wdtype: DType,
    w_row: &[u8],
    act_dtype: DType,
    act_row: &[u8],
) -> Result<f32, OpError> {
    let expected = vec_dot_type(wdtype);
    if act_dtype != expected {
        return Err(OpError::Param {
            op: "vec_dot",
            message: format!("{wdtype} weights take {expected} activations, got {act_dtype}"),
        });
    }
    let n = row_elements(wdtype, w_row.len(), "vec_dot")?;
    let act_bytes = act_dtype.row_bytes(n).unwrap_or(usize::MAX);
    if act_row.len() != act_bytes {
        return Err(OpError::Param {
            op: "vec_dot",
            message: format!(
                "a row of {n} {wdtype} weights needs {act_bytes} bytes of {act_dtype}, got {}",
                act_row.len()
            ),
        });
    }
    Ok(match wdtype {
        DType::F32 => float::dot_f32(w_row, act_row),
        DType::F16 => float::dot_f16(w_row, act_row),
        DType::BF16 => float::dot_bf16(w_row, act_row),
        DType::Q4_0 => q4_0::dot(blocks(w_row), blocks(act_row)),
        DType::Q4_1 => q4_1::dot(blocks(w_row), blocks(act_row)),
        DType::Q5_0 => q5_0::dot(blocks(w_row), blocks(act_row)),
        DType::Q5_1 => q5_1::dot(blocks(w_row), blocks(act_row)),
        DType::Q8_0 => q8_0::dot(blocks(w_row), blocks(act_row)),
        DType::Q2_K => q2_k::dot(blocks(w_row), blocks(act_row)),
        DType::Q3_K => q3_k::dot(blocks(w_row), blocks(act_row)),
        DType::Q4_K => q4_k::dot(blocks(w_row), blocks(act_row)),
        DType::Q5_K => q5_k::dot(blocks(w_row), blocks(act_row)),
        DType::Q6_K => q6_k::dot(blocks(w_row), blocks(act_row)),
        DType::IQ2_XXS => iq2_xxs::dot(blocks(w_row), blocks(act_row)),
        DType::MXFP4 => mxfp4::dot(blocks(w_row), blocks(act_row)),
        other => return Err(unsupported("vec_dot", other)),
    })
}

/// Reinterprets bytes as blocks. Every block struct has alignment 1 and the
/// callers above checked that the length is a whole number of blocks, so
/// the cast cannot fail.
fn blocks<B: bytemuck::Pod>(bytes: &[u8]) -> &[B] {
    bytemuck::cast_slice(bytes)
}

fn blocks_mut<B: bytemuck::Pod>(bytes: &mut [u8]) -> &mut [B] {
    bytemuck::cast_slice_mut(bytes)
}

fn unsupported(op: &'static str, dtype: DType) -> OpError {
    OpError::Unsupported {
        op,
        what: format!("{dtype} (no block layout implemented for it yet)"),
    }
}
