//! Q4_1: 32 weights in 20 bytes, 4-bit with a minimum.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..2 | `d` | f16 scale |
//! | 2..4 | `m` | f16 minimum |
//! | 4..20 | `qs[16]` | byte `j` holds element `j` (low nibble) and element `j + 16` (high nibble) |
//!
//! Value: `x = q * d + m`, `q` in 0..=15. Multiplied with Q8_1 activations,
//! whose per-block sum `s` carries the `m` term: `sum(x*a) = d*da*sum(q*qa) + m*s`.

use super::common::{f16_to_f32, f32_to_f16};
use super::q8_1::BlockQ8_1;
use bytemuck::{Pod, Zeroable};

/// One Q4_1 block (alignment 1, 20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Block scale (f16 bits, little-endian).
    pub d: [u8; 2],
    /// Block minimum (f16 bits): `x = q * d + m`.
    pub m: [u8; 2],
    /// Packed quants.
    pub qs: [u8; 16],
}

impl BlockQ4_1 {
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

pub(super) fn dequantize(blocks: &[BlockQ4_1], dst: &mut [f32]) {
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
        for (o, q) in out.iter_mut().zip(b.quants()) {
            *o = q as f32 * d + m;
        }
    }
}

/// ggml's `quantize_row_q4_1_ref`: `d = (max - min) / 15`,
/// `q = min(15, trunc((x - min) / d + 0.5))`.
pub(super) fn quantize(src: &[f32], blocks: &mut [BlockQ4_1]) {
    for (x, b) in src.chunks_exact(32).zip(blocks.iter_mut()) {
        let min = x.iter().fold(f32::MAX, |m, &v| m.min(v));
        let max = x.iter().fold(-f32::MAX, |m, &v| m.max(v));
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        for j in 0..16 {
            let lo = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let hi = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            b.qs[j] = lo | (hi << 4);
        }
    }
}

/// ggml's `ggml_vec_dot_q4_1_q8_1_generic`.
pub(super) fn dot(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi: i32 = x
            .quants()
            .iter()
            .zip(y.qs.iter())
            .map(|(&q, &v)| q as i32 * v as i32)
            .sum();
        sum +=
            (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32 + f16_to_f32(x.m) * f16_to_f32(y.s);
    }
    sum
}
