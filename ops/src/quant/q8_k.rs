//! Q8_K: 256 values in 292 bytes, symmetric 8-bit with an f32 scale and sums
//! of every 16 quants. The activation format of all K-quants.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..4 | `d` | f32 scale |
//! | 4..260 | `qs[256]` | i8 quants in element order |
//! | 260..292 | `bsums[16]` | i16 LE: `bsums[j] = sum(qs[16j..16j+16])` |
//!
//! Value: `x = q * d`. Quantized as ggml's `quantize_row_q8_K_ref` (which
//! ggml's x86 backend also uses): `max` = the element of largest magnitude
//! with its sign, `iscale = -127 / max`, `q = min(127, nearest_int(iscale*x))`,
//! `d = 1 / iscale`. (Older ggml used -128; the IQ formats needed 127.)

use super::common::{nearest_int, signed_abs_max};
use super::QK_K;
use bytemuck::{Pod, Zeroable};

/// One Q8_K block (alignment 1, 292 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    /// Block scale (f32 bytes, little-endian).
    pub d: [u8; 4],
    /// Packed quants.
    pub qs: [i8; QK_K],
    /// Sums of each 16 quants (i16, little-endian).
    pub bsums: [[u8; 2]; 16],
}

impl BlockQ8K {
    /// The f32 scale.
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    /// Sum of quants `16j..16j+16`.
    pub fn bsum(&self, j: usize) -> i16 {
        i16::from_le_bytes(self.bsums[j])
    }
}

pub(super) fn dequantize(blocks: &[BlockQ8K], dst: &mut [f32]) {
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (o, &q) in out.iter_mut().zip(b.qs.iter()) {
            *o = q as f32 * d;
        }
    }
}

pub(super) fn quantize(src: &[f32], blocks: &mut [BlockQ8K]) {
    for (x, b) in src.chunks_exact(QK_K).zip(blocks.iter_mut()) {
        let max = signed_abs_max(x);
        if max == 0.0 {
            *b = BlockQ8K::zeroed();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for j in 0..16 {
            let sum: i32 = b.qs[16 * j..16 * (j + 1)].iter().map(|&q| q as i32).sum();
            b.bsums[j] = (sum as i16).to_le_bytes();
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}
