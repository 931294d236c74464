//! Q2_K: 256 weights in 84 bytes: sixteen sub-blocks of 16, each with a
//! 4-bit scale and a 4-bit minimum, under f16 super-scales; 2-bit quants.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..16 | `scales[16]` | sub-block `j`: scale `scales[j] & 15`, minimum `scales[j] >> 4` |
//! | 16..80 | `qs[64]` | element `128h + 32k + l` is `(qs[32h + l] >> 2k) & 3` |
//! | 80..82 | `d` | f16 super-scale of the scales |
//! | 82..84 | `dmin` | f16 super-scale of the minimums |
//!
//! Value: `x = d * sc[e / 16] * q - dmin * m[e / 16]`. Multiplied with Q8_K
//! activations.

use super::common::{f16_to_f32, f32_to_f16, nearest_int};
use super::kquant_search::make_qkx2_quants;
use super::q8_k::BlockQ8K;
use super::QK_K;
use bytemuck::{Pod, Zeroable};

/// One Q2_K super-block (alignment 1, 84 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Sub-block scales (packed).
    pub scales: [u8; 16],
    /// Packed quants.
    pub qs: [u8; 64],
    /// Block scale (f16 bits, little-endian).
    pub d: [u8; 2],
    /// Scale of the block minimums (f16 bits).
    pub dmin: [u8; 2],
}

impl BlockQ2K {
    /// The 256 quants in element order, each 0..=3.
    pub fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for (e, v) in q.iter_mut().enumerate() {
            let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
            *v = (self.qs[32 * h + l] >> (2 * k)) & 3;
        }
        q
    }
}

pub(super) fn dequantize(blocks: &[BlockQ2K], dst: &mut [f32]) {
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let q = b.quants();
        for (e, o) in out.iter_mut().enumerate() {
            let sc = b.scales[e / 16];
            *o = (d * (sc & 0x0f) as f32) * q[e] as f32 - dmin * (sc >> 4) as f32;
        }
    }
}

/// ggml's `quantize_row_q2_K_ref`.
pub(super) fn quantize(src: &[f32], blocks: &mut [BlockQ2K]) {
    for (x, b) in src.chunks_exact(QK_K).zip(blocks.iter_mut()) {
        let mut levels = [0u8; QK_K];
        let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
        for j in 0..16 {
            let xs = &x[16 * j..16 * (j + 1)];
            let mut weights = [0f32; 16];
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            (scales[j], mins[j]) = make_qkx2_quants(
                3,
                xs,
                &weights,
                &mut levels[16 * j..16 * (j + 1)],
                -0.5,
                0.1,
                15,
            );
        }
        let max_scale = scales.iter().fold(0f32, |a, &s| a.max(s));
        let max_min = mins.iter().fold(0f32, |a, &s| a.max(s));
        *b = BlockQ2K::zeroed();
        if max_scale > 0.0 {
            let iscale = 15.0 / max_scale;
            for (s, &v) in b.scales.iter_mut().zip(&scales) {
                *s = nearest_int(iscale * v).clamp(0, 15) as u8;
            }
            b.d = f32_to_f16(max_scale / 15.0);
        }
        if max_min > 0.0 {
            let iscale = 15.0 / max_min;
            for (s, &v) in b.scales.iter_mut().zip(&mins) {
                *s |= (nearest_int(iscale * v).clamp(0, 15) as u8) << 4;
            }
            b.dmin = f32_to_f16(max_min / 15.0);
        }
        for j in 0..16 {
            let d = f16_to_f32(b.d) * (b.scales[j] & 0x0f) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = f16_to_f32(b.dmin) * (b.scales[j] >> 4) as f32;
            for i in 0..16 {
                levels[16 * j + i] = nearest_int((x[16 * j + i] + dm) / d).clamp(0, 3) as u8;
            }
        }
        for (e, &lv) in levels.iter().enumerate() {
            let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
            b.qs[32 * h + l] |= lv << (2 * k);
        }
    }
}

/// ggml's `ggml_vec_dot_q2_K_q8_K_generic`.
pub(super) fn dot(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let q = x.quants();
        let summs: i32 = (0..16)
            .map(|j| y.bsum(j) as i32 * (x.scales[j] >> 4) as i32)
            .sum();
        let mut isum = 0i32;
        for j in 0..16 {
            let part: i32 = (16 * j..16 * (j + 1))
                .map(|e| y.qs[e] as i32 * q[e] as i32)
                .sum();
            isum += (x.scales[j] & 0x0f) as i32 * part;
        }
        let dall = y.d() * f16_to_f32(x.d);
        let dmin = y.d() * f16_to_f32(x.dmin);
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}
