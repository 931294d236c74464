//! Q4_0: 32 weights in 18 bytes, symmetric 4-bit.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..2 | `d` | f16 scale |
//! | 2..18 | `qs[16]` | byte `j` holds element `j` in its low nibble and element `j + 16` in its high nibble |
//!
//! Value: `x = (q - 8) * d`, `q` in 0..=15. Multiplied with Q8_0 activations.

use super::common::{f16_to_f32, f32_to_f16, signed_abs_max};
use super::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// One Q4_0 block (alignment 1, 18 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Block scale (f16 bits, little-endian).
    pub d: [u8; 2],
    /// Packed quants.
    pub qs: [u8; 16],
}

impl BlockQ4_0 {
    /// The 32 quants in element order, each 0..=15.
    pub fn quants(&self) -> [u8; 32] {
        let mut q = [0u8; 32];
        for j in 0..16 {
            q[j] = self.qs[j] & 0x0f;
            q[j + 16] = self.qs[j] >> 4;
        }
        q
    }
}

pub(super) fn dequantize(blocks: &[BlockQ4_0], dst: &mut [f32]) {
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_to_f32(b.d);
        for (o, q) in out.iter_mut().zip(b.quants()) {
            *o = (q as i32 - 8) as f32 * d;
        }
    }
}

/// ggml's `quantize_row_q4_0_ref`: `d = max / -8` where `max` is the signed
/// element of largest magnitude, `q = min(15, trunc(x / d + 8.5))`.
pub(super) fn quantize(src: &[f32], blocks: &mut [BlockQ4_0]) {
    for (x, b) in src.chunks_exact(32).zip(blocks.iter_mut()) {
        let d = signed_abs_max(x) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        for j in 0..16 {
            let lo = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let hi = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            b.qs[j] = lo | (hi << 4);
        }
    }
}

/// ggml's `ggml_vec_dot_q4_0_q8_0_generic`.
pub(super) fn dot(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi: i32 = x
            .quants()
            .iter()
            .zip(y.qs.iter())
            .map(|(&q, &v)| (q as i32 - 8) * v as i32)
            .sum();
        sum += sumi as f32 * f16_to_f32(x.d) * f16_to_f32(y.d);
    }
    sum
}
