//! Q4_K: 256 weights in 144 bytes: eight sub-blocks of 32, each with a 6-bit
//! scale and a 6-bit minimum, under f16 super-scales.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..2 | `d` | f16 super-scale of the sub-block scales |
//! | 2..4 | `dmin` | f16 super-scale of the sub-block minimums |
//! | 4..16 | `scales[12]` | 8 scales `sc[j]` and 8 minimums `m[j]`, 6 bits each (see [`unpack_scales_mins`]) |
//! | 16..144 | `qs[128]` | 4-bit quants: for chunk `c` in 0..4, byte `32c + l` holds element `64c + l` (low nibble) and `64c + 32 + l` (high nibble) |
//!
//! Value of element `e` in sub-block `j = e / 32`:
//! `x = d * sc[j] * q - dmin * m[j]`. Multiplied with Q8_K activations.

use super::common::{f16_to_f32, f32_to_f16, nearest_int};
use super::kquant_search::make_qkx2_quants;
use super::q8_k::BlockQ8K;
use super::QK_K;
use bytemuck::{Pod, Zeroable};

/// One Q4_K super-block (alignment 1, 144 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Block scale (f16 bits, little-endian).
    pub d: [u8; 2],
    /// Scale of the block minimums (f16 bits).
    pub dmin: [u8; 2],
    /// Sub-block scales (packed).
    pub scales: [u8; 12],
    /// Packed quants.
    pub qs: [u8; 128],
}

/// The 8 scales and 8 minimums packed in 12 bytes (shared with Q5_K):
/// for `j < 4`, `sc[j] = s[j] & 63` and `m[j] = s[j + 4] & 63`; for
/// `j >= 4`, `sc[j] = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4` and
/// `m[j] = (s[j + 4] >> 4) | (s[j] >> 6) << 4`.
pub fn unpack_scales_mins(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        if j < 4 {
            sc[j] = s[j] & 63;
            m[j] = s[j + 4] & 63;
        } else {
            sc[j] = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
            m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
    }
    (sc, m)
}

/// Inverse of [`unpack_scales_mins`] (values must be below 64).
pub(super) fn pack_scales_mins(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = sc[j];
            s[j + 4] = m[j];
        } else {
            s[j + 4] = (sc[j] & 0x0f) | ((m[j] & 0x0f) << 4);
            s[j - 4] |= (sc[j] >> 4) << 6;
            s[j] |= (m[j] >> 4) << 6;
        }
    }
    s
}

impl BlockQ4K {
    /// The 256 quants in element order, each 0..=15.
    pub fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for c in 0..4 {
            for l in 0..32 {
                let byte = self.qs[32 * c + l];
                q[64 * c + l] = byte & 0x0f;
                q[64 * c + 32 + l] = byte >> 4;
            }
        }
        q
    }
}

pub(super) fn dequantize(blocks: &[BlockQ4K], dst: &mut [f32]) {
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

/// ggml's `quantize_row_q4_K_ref`: a weighted (scale, min) search per
/// sub-block, 6-bit sub-scales under f16 super-scales, then requantization.
pub(super) fn quantize(src: &[f32], blocks: &mut [BlockQ4K]) {
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
                15,
                xs,
                &weights,
                &mut levels[32 * j..32 * (j + 1)],
                -1.0,
                0.1,
                20,
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
                levels[32 * j + i] = nearest_int((x[32 * j + i] + dm) / d).clamp(0, 15) as u8;
            }
        }
        for c in 0..4 {
            for l in 0..32 {
                b.qs[32 * c + l] = levels[64 * c + l] | (levels[64 * c + 32 + l] << 4);
            }
        }
    }
}

/// ggml's `ggml_vec_dot_q4_K_q8_K_generic`: exact integer sums per
/// sub-block, eight f32 partial sums (element index mod 8), the minimums
/// through the activation block sums.
pub(super) fn dot(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
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
