//! Q8_1: 32 values in 36 bytes, symmetric 8-bit plus the block sum. The
//! activation format of Q4_1 and Q5_1 weights.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..2 | `d` | f16 scale |
//! | 2..4 | `s` | f16 of `d * sum(q)` (with the f32 `d`, before its f16 rounding) |
//! | 4..36 | `qs[32]` | i8 quants in element order |
//!
//! Value: `x = q * d`. Quantized as ggml's x86 `quantize_row_q8_1` (see
//! `q8_0.rs` for the rounding); `s` lets a Q4_1 dot product add the weight
//! minimum's contribution `m * s` without touching the quants.

use super::common::{f16_to_f32, f32_to_f16};
use super::q8_0::quantize_block_x86;
use bytemuck::{Pod, Zeroable};

/// One Q8_1 block (alignment 1, 36 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Block scale (f16 bits, little-endian).
    pub d: [u8; 2],
    /// `d * sum(qs)` (f16 bits), for Q4_1/Q5_1 dot products.
    pub s: [u8; 2],
    /// Packed quants.
    pub qs: [i8; 32],
}

pub(super) fn dequantize(blocks: &[BlockQ8_1], dst: &mut [f32]) {
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_to_f32(b.d);
        for (o, &q) in out.iter_mut().zip(b.qs.iter()) {
            *o = q as f32 * d;
        }
    }
}

pub(super) fn quantize(src: &[f32], blocks: &mut [BlockQ8_1]) {
    for (x, b) in src.chunks_exact(32).zip(blocks.iter_mut()) {
        let (d, qs) = quantize_block_x86(x);
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        b.d = f32_to_f16(d);
        b.s = f32_to_f16(d * sum as f32);
        b.qs = qs;
    }
}
