//! MXFP4 (OCP microscaling FP4): 32 values in 17 bytes, the format of
//! DeepSeek-V4's native FP4 expert weights.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0 | `e` | E8M0 shared exponent |
//! | 1..17 | `qs[16]` | E2M1 codes: low nibbles are values 0-15, high nibbles 16-31 |
//!
//! Value: `x = KVALUES[code] * 2^(e - 128)`, where [`KVALUES`] holds the
//! E2M1 values doubled (hence `e - 128`, not `e - 127`); `e` of 0 or 1 gives
//! the subnormal scales `2^-128` and `2^-127` exactly as ggml's
//! `ggml_e8m0_to_fp32_half`.
//!
//! The activation format is Q8_0 (32-value blocks): integer sums per block
//! times the two scales.

use super::common::f16_to_f32;
use super::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// One MXFP4 block (alignment 1, 17 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockMxfp4 {
    /// E8M0 exponent.
    pub e: u8,
    /// Packed E2M1 codes.
    pub qs: [u8; 16],
}

/// E2M1 values doubled, by 4-bit code (bit 3 is the sign).
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 128)` (ggml's `ggml_e8m0_to_fp32_half`).
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

impl BlockMxfp4 {
    /// The doubled E2M1 values in element order.
    pub fn values(&self) -> [i8; 32] {
        let mut out = [0i8; 32];
        for (j, &q) in self.qs.iter().enumerate() {
            out[j] = KVALUES[(q & 0x0f) as usize];
            out[j + 16] = KVALUES[(q >> 4) as usize];
        }
        out
    }
}

pub(super) fn dequantize(blocks: &[BlockMxfp4], dst: &mut [f32]) {
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = e8m0_half(b.e);
        for (o, v) in out.iter_mut().zip(b.values()) {
            *o = v as f32 * d;
        }
    }
}

pub(super) fn dot(w: &[BlockMxfp4], a: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(y.d) * e8m0_half(x.e);
        let sumi: i32 = x
            .values()
            .iter()
            .zip(&y.qs)
            .map(|(&v, &q)| v as i32 * q as i32)
            .sum();
        sumf += d * sumi as f32;
    }
    sumf
}

/// Quantizes like the `gguf` package's reference: `e = floor(log2(amax)) -
/// 2 + 127` (0 for an all-zero block), then each value to the nearest
/// doubled E2M1 value times `2^(e - 128)` (ties: the lower code).
pub(super) fn quantize(src: &[f32], blocks: &mut [BlockMxfp4]) {
    for (x, b) in src.chunks_exact(32).zip(blocks.iter_mut()) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        let code = |v: f32| {
            let mut best = 0usize;
            for (i, &k) in KVALUES.iter().enumerate() {
                if (d * k as f32 - v).abs() < (d * KVALUES[best] as f32 - v).abs() {
                    best = i;
                }
            }
            best as u8
        };
        b.e = e;
        for j in 0..16 {
            b.qs[j] = code(x[j]) | (code(x[j + 16]) << 4);
        }
    }
}
