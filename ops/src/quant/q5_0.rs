//! Q5_0: 32 weights in 22 bytes, symmetric 5-bit.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..2 | `d` | f16 scale |
//! | 2..6 | `qh` | u32 LE: bit `j` is the 5th bit of element `j` |
//! | 6..22 | `qs[16]` | low 4 bits: byte `j` holds element `j` (low nibble) and `j + 16` (high nibble) |
//!
//! Value: `x = (q - 16) * d`, `q` in 0..=31. Multiplied with Q8_0 activations.

use super::common::{f16_to_f32, f32_to_f16, signed_abs_max};
use super::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// One Q5_0 block (alignment 1, 22 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Block scale (f16 bits, little-endian).
    pub d: [u8; 2],
    /// High bits of the quants.
    pub qh: [u8; 4],
    /// Packed quants.
    pub qs: [u8; 16],
}

impl BlockQ5_0 {
    /// The 32 quants in element order, each 0..=31.
    pub fn quants(&self) -> [u8; 32] {
        let qh = u32::from_le_bytes(self.qh);
        let mut q = [0u8; 32];
        for j in 0..16 {
            q[j] = (self.qs[j] & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
            q[j + 16] = (self.qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
        }
        q
    }
}

pub(super) fn dequantize(blocks: &[BlockQ5_0], dst: &mut [f32]) {
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_to_f32(b.d);
        for (o, q) in out.iter_mut().zip(b.quants()) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

/// ggml's `quantize_row_q5_0_ref`: `d = max / -16`,
/// `q = min(31, trunc(x / d + 16.5))`.
pub(super) fn quantize(src: &[f32], blocks: &mut [BlockQ5_0]) {
    for (x, b) in src.chunks_exact(32).zip(blocks.iter_mut()) {
        let d = signed_abs_max(x) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        let mut qh = 0u32;
        for j in 0..16 {
            let lo = ((x[j] * id + 16.5) as i8).min(31) as u8;
            let hi = ((x[j + 16] * id + 16.5) as i8).min(31) as u8;
            b.qs[j] = (lo & 0x0f) | ((hi & 0x0f) << 4);
            qh |= ((lo as u32 >> 4) & 1) << j;
            qh |= ((hi as u32 >> 4) & 1) << (j + 16);
        }
        b.qh = qh.to_le_bytes();
    }
}

/// ggml's `ggml_vec_dot_q5_0_q8_0_generic`.
pub(super) fn dot(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi: i32 = x
            .quants()
            .iter()
            .zip(y.qs.iter())
            .map(|(&q, &v)| (q as i32 - 16) * v as i32)
            .sum();
        sum += (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32;
    }
    sum
}
