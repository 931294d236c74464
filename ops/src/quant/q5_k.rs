//! Q5_K: 256 weights in 176 bytes: like Q4_K plus a fifth bit per weight.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..2 | `d` | f16 super-scale of the sub-block scales |
//! | 2..4 | `dmin` | f16 super-scale of the sub-block minimums |
//! | 4..16 | `scales[12]` | 8 scales and 8 minimums, 6 bits each, packed as in Q4_K |
//! | 16..48 | `qh[32]` | 5th bits: element `64c + l` uses bit `2c` of `qh[l]`, element `64c + 32 + l` bit `2c + 1` |
//! | 48..176 | `qs[128]` | low 4 bits, laid out as Q4_K's `qs` |
//!
//! Value: `x = d * sc[e / 32] * q - dmin * m[e / 32]`, `q` in 0..=31.
//! Multiplied with Q8_K activations.

use super::common::{f16_to_f32, f32_to_f16, nearest_int};
use super::kquant_search::make_qkx2_quants;
use super::q4_k::{pack_scales_mins, unpack_scales_mins};
use super::q8_k::BlockQ8K;
use super::QK_K;
use bytemuck::{Pod, Zeroable};

/// One Q5_K super-block (alignment 1, 176 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Block scale (f16 bits, little-endian).
    pub d: [u8; 2],
    /// Scale of the block minimums (f16 bits).
    pub dmin: [u8; 2],
    /// Sub-block scales (packed).
    pub scales: [u8; 12],
    /// High bits of the quants.
    pub qh: [u8; 32],
    /// Packed quants.
    pub qs: [u8; 128],
}

impl BlockQ5K {
    /// The 256 quants in element order, each 0..=31.
    pub fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for c in 0..4 {
            for l in 0..32 {
                let byte = self.qs[32 * c + l];
                let hi = self.qh[l];
                q[64 * c + l] = (byte & 0x0f) | (((hi >> (2 * c)) & 1) << 4);
                q[64 * c + 32 + l] = (byte >> 4) | (((hi >> (2 * c + 1)) & 1) << 4);
            }
        }
        q
    }
}

pub(super) fn dequantize(blocks: &[BlockQ5K], dst: &mut [f32]) {
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let (sc, m) = unpack_scales_mins(&b.scales);
        let q = b.quants();
        for (e, o) in out.iter_mut().enumerate() {
            let j = e / 32;
            *o = (d * sc[j] as f32) * q[e] as f32 - dmin * m[j] as f32;
        }
    }
}

/// ggml's `quantize_row_q5_K_ref`.
pub(super) fn quantize(src: &[f32], blocks: &mut [BlockQ5K]) {
    for (x, b) in src.chunks_exact(QK_K).zip(blocks.iter_mut()) {
        let mut levels = [0u8; QK_K];
        let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
        for j in 0..8 {
            let xs = &x[32 * j..32 * (j + 1)];
            let av_x = (xs.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
            let mut weights = [0f32; 32];
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = av_x + v.abs();
            }
            (scales[j], mins[j]) = make_qkx2_quants(
                31,
                xs,
                &weights,
                &mut levels[32 * j..32 * (j + 1)],
                -0.5,
                0.1,
                15,
            );
        }
        let max_scale = scales.iter().fold(0f32, |a, &s| a.max(s));
        let max_min = mins.iter().fold(0f32, |a, &s| a.max(s));
        let inv_scale = if max_scale > 0.0 {
            63.0 / max_scale
        } else {
            0.0
        };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
        for j in 0..8 {
            ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
            lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
        }
        b.scales = pack_scales_mins(&ls, &lm);
        b.d = f32_to_f16(max_scale / 63.0);
        b.dmin = f32_to_f16(max_min / 63.0);
        for j in 0..8 {
            let d = f16_to_f32(b.d) * ls[j] as f32;
            if d == 0.0 {
                continue;
            }
            let dm = f16_to_f32(b.dmin) * lm[j] as f32;
            for i in 0..32 {
                levels[32 * j + i] = nearest_int((x[32 * j + i] + dm) / d).clamp(0, 31) as u8;
            }
        }
        b.qh = [0; 32];
        for c in 0..4 {
            for l in 0..32 {
                let (lo, hi) = (levels[64 * c + l], levels[64 * c + 32 + l]);
                b.qs[32 * c + l] = (lo & 0x0f) | ((hi & 0x0f) << 4);
                b.qh[l] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
            }
        }
    }
}

/// ggml's `ggml_vec_dot_q5_K_q8_K_generic`.
pub(super) fn dot(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    let mut sums = [0f32; 8];
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (sc, m) = unpack_scales_mins(&x.scales);
        let q = x.quants();
        let mut aux32 = [0i32; 8];
        for (e, (&qv, &yv)) in q.iter().zip(y.qs.iter()).enumerate() {
            aux32[e % 8] += sc[e / 32] as i32 * (qv as i32 * yv as i32);
        }
        let summins: i32 = (0..16).map(|j| y.bsum(j) as i32 * m[j / 2] as i32).sum();
        let d = f16_to_f32(x.d) * y.d();
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
        let dmin = f16_to_f32(x.dmin) * y.d();
        sumf -= dmin * summins as f32;
    }
    sums.iter().fold(sumf, |s, v| s + v)
}
