//! Q3_K: 256 weights in 110 bytes: sixteen sub-blocks of 16 with 6-bit
//! signed scales under one f16 super-scale; 2 low bits plus a high bit.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..32 | `hmask[32]` | high bits: element `128h + 32k + l` uses bit `4h + k` of `hmask[l]` |
//! | 32..96 | `qs[64]` | low 2 bits: element `128h + 32k + l` is `(qs[32h + l] >> 2k) & 3` |
//! | 96..108 | `scales[12]` | 16 scales of 6 bits (see [`unpack_scales`]), stored with +32 |
//! | 108..110 | `d` | f16 super-scale |
//!
//! Value: `x = d * (sc[e / 16] - 32) * (q - 4 * (1 - hbit))`, `q` in 0..=3.
//! Multiplied with Q8_K activations.

use super::common::{f16_to_f32, f32_to_f16, nearest_int};
use super::kquant_search::make_q3_quants;
use super::q8_k::BlockQ8K;
use super::QK_K;
use bytemuck::{Pod, Zeroable};

/// One Q3_K super-block (alignment 1, 110 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ3K {
    /// High bit of every quant.
    pub hmask: [u8; 32],
    /// Packed quants.
    pub qs: [u8; 64],
    /// Sub-block scales (packed).
    pub scales: [u8; 12],
    /// Block scale (f16 bits, little-endian).
    pub d: [u8; 2],
}

/// The 16 signed scales: the low 4 bits of scale `j` are nibble `j / 8` of
/// byte `j % 8`, the high 2 bits are bits `2(j / 4)..` of byte `8 + j % 4`;
/// the stored 6-bit value minus 32.
pub fn unpack_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0x0f } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

impl BlockQ3K {
    /// The 256 signed quants in element order, each -4..=3.
    pub fn quants(&self) -> [i8; QK_K] {
        let mut q = [0i8; QK_K];
        for (e, v) in q.iter_mut().enumerate() {
            let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
            let low = ((self.qs[32 * h + l] >> (2 * k)) & 3) as i8;
            let high = (self.hmask[l] >> (4 * h + k)) & 1;
            *v = low - if high == 1 { 0 } else { 4 };
        }
        q
    }
}

pub(super) fn dequantize(blocks: &[BlockQ3K], dst: &mut [f32]) {
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let sc = unpack_scales(&b.scales);
        let q = b.quants();
        for (e, o) in out.iter_mut().enumerate() {
            *o = (d * sc[e / 16] as f32) * q[e] as f32;
        }
    }
}

/// ggml's `quantize_row_q3_K_ref`.
pub(super) fn quantize(src: &[f32], blocks: &mut [BlockQ3K]) {
    for (x, b) in src.chunks_exact(QK_K).zip(blocks.iter_mut()) {
        let mut levels = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0f32, 0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(
                4,
                &x[16 * j..16 * (j + 1)],
                &mut levels[16 * j..16 * (j + 1)],
            );
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        *b = BlockQ3K::zeroed();
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                let l = (nearest_int(iscale * s).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    b.scales[j] = l & 0x0f;
                } else {
                    b.scales[j - 8] |= (l & 0x0f) << 4;
                }
                b.scales[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
            }
            b.d = f32_to_f16(1.0 / iscale);
        }
        let sc = unpack_scales(&b.scales);
        for j in 0..16 {
            let d = f16_to_f32(b.d) * sc[j] as f32;
            if d == 0.0 {
                continue;
            }
            for i in 0..16 {
                levels[16 * j + i] = (nearest_int(x[16 * j + i] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        for (e, &lv) in levels.iter().enumerate() {
            let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
            let mut q = lv as u8;
            if q > 3 {
                b.hmask[l] |= 1 << (4 * h + k);
                q -= 4;
            }
            b.qs[32 * h + l] |= q << (2 * k);
        }
    }
}

/// ggml's `ggml_vec_dot_q3_K_q8_K_generic`.
pub(super) fn dot(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
    let mut sums = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let sc = unpack_scales(&x.scales);
        let q = x.quants();
        let mut aux32 = [0i32; 8];
        for (e, (&qv, &yv)) in q.iter().zip(y.qs.iter()).enumerate() {
            aux32[e % 8] += sc[e / 16] as i32 * (qv as i32 * yv as i32);
        }
        let d = f16_to_f32(x.d) * y.d();
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    sums.iter().fold(0f32, |s, v| s + v)
}
