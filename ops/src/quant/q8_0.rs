//! Q8_0: 32 values in 34 bytes, symmetric 8-bit. Both a weight format (the
//! SmolLM2 token embedding / output head) and the activation format of
//! Q4_0, Q5_0 and Q8_0 weights.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..2 | `d` | f16 scale |
//! | 2..34 | `qs[32]` | i8 quants in element order |
//!
//! Value: `x = q * d`.
//!
//! The quantizer is ggml's x86 `quantize_row_q8_0` (AVX2 path), which is what
//! llama.cpp feeds its dot products on x86: `amax = max|x|`, `d = amax / 127`
//! (stored as f16), `q = round_half_even(x * (127 / amax))`. ggml's scalar
//! `quantize_row_q8_0_ref` multiplies by `1 / d` and rounds half away from
//! zero instead; the two differ in rare last-bit cases.

use super::common::{abs_max, f16_to_f32, f32_to_f16};
use bytemuck::{Pod, Zeroable};

/// One Q8_0 block (alignment 1, 34 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Block scale (f16 bits, little-endian).
    pub d: [u8; 2],
    /// Packed quants.
    pub qs: [i8; 32],
}

pub(super) fn dequantize(blocks: &[BlockQ8_0], dst: &mut [f32]) {
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_to_f32(b.d);
        for (o, &q) in out.iter_mut().zip(b.qs.iter()) {
            *o = q as f32 * d;
        }
    }
}

/// Quantizes one 32-value block the way ggml's x86 code does; returns the
/// f32 scale `d` (before f16 rounding) and the quants.
pub(super) fn quantize_block_x86(x: &[f32]) -> (f32, [i8; 32]) {
    let amax = abs_max(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(x) {
        // cvtps2dq of an already rounded value, then saturating packs.
        *q = (v * id).round_ties_even().clamp(-128.0, 127.0) as i8;
    }
    (d, qs)
}

pub(super) fn quantize(src: &[f32], blocks: &mut [BlockQ8_0]) {
    for (x, b) in src.chunks_exact(32).zip(blocks.iter_mut()) {
        let (d, qs) = quantize_block_x86(x);
        b.d = f32_to_f16(d);
        b.qs = qs;
    }
}

/// ggml's `ggml_vec_dot_q8_0_q8_0_generic`.
pub(super) fn dot(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi: i32 =
            x.qs.iter()
                .zip(y.qs.iter())
                .map(|(&p, &q)| p as i32 * q as i32)
                .sum();
        sum += sumi as f32 * (f16_to_f32(x.d) * f16_to_f32(y.d));
    }
    sum
}
