//! Q6_K: 256 weights in 210 bytes: sixteen sub-blocks of 16 with signed
//! 8-bit scales under one f16 super-scale.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..128 | `ql[128]` | low 4 bits |
//! | 128..192 | `qh[64]` | high 2 bits |
//! | 192..208 | `scales[16]` | i8 scale of each 16-element sub-block |
//! | 208..210 | `d` | f16 super-scale |
//!
//! Element `e = 128h + 32k + l` (`h` in 0..2, `k` in 0..4, `l` in 0..32):
//! low bits from `ql[64h + l + 32(k & 1)]` (low nibble for `k < 2`, high
//! nibble for `k >= 2`), high bits `(qh[32h + l] >> 2k) & 3`.
//! Value: `x = d * scales[e / 16] * (q - 32)`, `q` in 0..=63.
//! Multiplied with Q8_K activations.

use super::common::{f16_to_f32, f32_to_f16, nearest_int};
use super::kquant_search::make_qx_quants;
use super::q8_k::BlockQ8K;
use super::QK_K;
use bytemuck::{Pod, Zeroable};

/// One Q6_K super-block (alignment 1, 210 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; 128],
    /// High bits of the quants.
    pub qh: [u8; 64],
    /// The 16 signed sub-block scales.
    pub scales: [i8; 16],
    /// Block scale (f16 bits, little-endian).
    pub d: [u8; 2],
}

impl BlockQ6K {
    /// The 256 quants in element order, each 0..=63 (before the -32 offset).
    pub fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for h in 0..2 {
            let (ql, qh) = (&self.ql[64 * h..64 * h + 64], &self.qh[32 * h..32 * h + 32]);
            for l in 0..32 {
                let e = 128 * h + l;
                q[e] = (ql[l] & 0x0f) | ((qh[l] & 3) << 4);
                q[e + 32] = (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4);
                q[e + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                q[e + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        q
    }
}

pub(super) fn dequantize(blocks: &[BlockQ6K], dst: &mut [f32]) {
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let q = b.quants();
        for (e, o) in out.iter_mut().enumerate() {
            *o = d * b.scales[e / 16] as f32 * (q[e] as i32 - 32) as f32;
        }
    }
}

/// ggml's `quantize_row_q6_K_ref`.
pub(super) fn quantize(src: &[f32], blocks: &mut [BlockQ6K]) {
    for (x, b) in src.chunks_exact(QK_K).zip(blocks.iter_mut()) {
        let mut levels = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for j in 0..16 {
            scales[j] = make_qx_quants(
                32,
                &x[16 * j..16 * (j + 1)],
                &mut levels[16 * j..16 * (j + 1)],
            );
            if scales[j].abs() > max_abs_scale {
                max_abs_scale = scales[j].abs();
                max_scale = scales[j];
            }
        }
        *b = BlockQ6K::zeroed();
        if max_abs_scale < 1e-15 {
            continue;
        }
        let iscale = -128.0 / max_scale;
        b.d = f32_to_f16(1.0 / iscale);
        for (s, &v) in b.scales.iter_mut().zip(&scales) {
            *s = nearest_int(iscale * v).min(127) as i8;
        }
        for j in 0..16 {
            let d = f16_to_f32(b.d) * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for i in 0..16 {
                levels[16 * j + i] = (nearest_int(x[16 * j + i] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for h in 0..2 {
            for l in 0..32 {
                let e = 128 * h + l;
                let q = |k: usize| levels[e + 32 * k] as u8;
                b.ql[64 * h + l] = (q(0) & 0x0f) | ((q(2) & 0x0f) << 4);
                b.ql[64 * h + l + 32] = (q(1) & 0x0f) | ((q(3) & 0x0f) << 4);
                b.qh[32 * h + l] =
                    (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
    }
}

/// ggml's `ggml_vec_dot_q6_K_q8_K_generic`.
pub(super) fn dot(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let mut sums = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let q = x.quants();
        let mut aux32 = [0i32; 8];
        for (e, (&qv, &yv)) in q.iter().zip(y.qs.iter()).enumerate() {
            aux32[e % 8] += x.scales[e / 16] as i32 * ((qv as i32 - 32) * yv as i32);
        }
        let d = f16_to_f32(x.d) * y.d();
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    sums.iter().fold(0f32, |s, v| s + v)
}
