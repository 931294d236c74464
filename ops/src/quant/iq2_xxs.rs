//! IQ2_XXS: 256 values in 66 bytes (2.06 bits per weight), one of the
//! "importance" quants DeepSeek-V4 GGUFs use for routed experts.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..2 | `d` | f16 scale |
//! | 2..66 | `qs[32]` | u16 LE; eight 32-value sub-blocks of two u32 each |
//!
//! Sub-block `s` reads `a = qs[4s..4s+2]` and `b = qs[4s+2..4s+4]` as two
//! little-endian u32. The four bytes of `a` pick four 8-value patterns from
//! [`GRID`] (values 8, 25 or 43); seven-bit fields `b >> 7l` (l = 0..3)
//! pick their sign patterns (bit `j` set: value `j` is negative; the eighth
//! sign keeps the number of minus signs even); `b >> 28` is the sub-block
//! scale `s4`. Value: `x = d (0.5 + s4) / 4 * grid * sign`.
//!
//! The activation format is Q8_K; the dot product sums integers per
//! sub-block, scales by `2 s4 + 1` and combines with `d * d8 / 8` as
//! ggml's generic code does.

use super::common::f16_to_f32;
use super::q8_k::BlockQ8K;
use super::QK_K;
use bytemuck::{Pod, Zeroable};

/// One IQ2_XXS block (alignment 1, 66 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIq2Xxs {
    /// Block scale (f16 bits, little-endian).
    pub d: [u8; 2],
    /// Packed grid indices, signs and sub-block scales (u16 LE each).
    pub qs: [u8; 64],
}

/// The values a grid index selects.
const GRID_VALUES: [u8; 3] = [8, 25, 43];

/// ggml's `iq2xxs_grid`, each of its 256 eight-value patterns packed as
/// eight 2-bit indices into [`GRID_VALUES`] (value `j` in bits `2j..2j+2`).
const GRID: [u16; 256] = [
    0x0000, 0x0002, 0x0005, 0x0008, 0x000a, 0x0011, 0x0014, 0x0020, 0x0022, 0x0028, 0x002a, 0x0041,
    0x0044, 0x0050, 0x0058, 0x0061, 0x0064, 0x0080, 0x0082, 0x008a, 0x00a2, 0x0101, 0x0104, 0x0110,
    0x0115, 0x0140, 0x0184, 0x0198, 0x0200, 0x0202, 0x0222, 0x0282, 0x0401, 0x0404, 0x0410, 0x0421,
    0x0424, 0x0440, 0x0442, 0x0448, 0x0460, 0x0481, 0x0484, 0x0490, 0x04a4, 0x0500, 0x0502, 0x0508,
    0x0520, 0x0546, 0x0569, 0x0580, 0x0591, 0x0609, 0x0610, 0x0640, 0x0684, 0x06a4, 0x0800, 0x0805,
    0x0808, 0x0814, 0x0828, 0x0841, 0x0844, 0x0850, 0x0852, 0x0888, 0x0904, 0x0940, 0x0a02, 0x0a14,
    0x1001, 0x1004, 0x1010, 0x1021, 0x1040, 0x1060, 0x1084, 0x1090, 0x1095, 0x1100, 0x1108, 0x1120,
    0x1150, 0x115a, 0x1180, 0x1224, 0x1245, 0x1400, 0x1408, 0x1420, 0x1425, 0x1449, 0x1480, 0x1518,
    0x1562, 0x1600, 0x1616, 0x1801, 0x1804, 0x1810, 0x1840, 0x1881, 0x1900, 0x1905, 0x19a0, 0x1a51,
    0x2000, 0x2002, 0x200a, 0x2044, 0x2061, 0x2080, 0x2082, 0x2129, 0x2148, 0x2200, 0x2202, 0x2401,
    0x2404, 0x2410, 0x2440, 0x2456, 0x2500, 0x2541, 0x2564, 0x2690, 0x2808, 0x2820, 0x2894, 0x2a44,
    0x4001, 0x4004, 0x4010, 0x4018, 0x4021, 0x4024, 0x4040, 0x4048, 0x4056, 0x4060, 0x4081, 0x4084,
    0x4090, 0x4100, 0x4120, 0x4161, 0x4180, 0x4185, 0x4201, 0x4210, 0x4248, 0x4256, 0x4268, 0x4400,
    0x4408, 0x4420, 0x4480, 0x4499, 0x4512, 0x4524, 0x4600, 0x4801, 0x4804, 0x4810, 0x4840, 0x4845,
    0x4900, 0x4958, 0x4961, 0x4982, 0x4a45, 0x4a90, 0x5000, 0x5008, 0x5011, 0x5019, 0x5020, 0x5080,
    0x5088, 0x5104, 0x5142, 0x51a4, 0x5291, 0x5490, 0x5492, 0x550a, 0x5601, 0x5654, 0x5800, 0x5811,
    0x5819, 0x5864, 0x5940, 0x5a08, 0x6004, 0x6010, 0x6040, 0x6068, 0x6100, 0x6155, 0x6218, 0x6260,
    0x6400, 0x6405, 0x6510, 0x6512, 0x6584, 0x6842, 0x8000, 0x8002, 0x800a, 0x8041, 0x8082, 0x8104,
    0x8118, 0x8140, 0x8211, 0x8401, 0x8404, 0x8410, 0x8415, 0x8440, 0x8460, 0x8500, 0x8546, 0x8594,
    0x8609, 0x8640, 0x8660, 0x8802, 0x8904, 0x8a11, 0x9004, 0x9010, 0x9024, 0x9040, 0x90a1, 0x9116,
    0x9180, 0x9245, 0x9400, 0x9422, 0x9444, 0x9551, 0x9881, 0x9920, 0xa002, 0xa050, 0xa085, 0xa109,
    0xa200, 0xa418, 0xa850, 0xa904,
];

/// Value `j` of grid pattern `index`.
fn grid(index: u8, j: usize) -> u8 {
    GRID_VALUES[((GRID[index as usize] >> (2 * j)) & 3) as usize]
}

/// The 7 stored sign bits plus the parity bit that makes the count even.
fn signs(bits7: u32) -> u8 {
    let b = (bits7 & 0x7f) as u8;
    b | (((b.count_ones() & 1) as u8) << 7)
}

impl BlockIq2Xxs {
    /// Sub-block `s`'s two words.
    fn words(&self, s: usize) -> (u32, u32) {
        let at = |w: usize| {
            let i = 8 * s + 4 * w;
            u32::from_le_bytes([self.qs[i], self.qs[i + 1], self.qs[i + 2], self.qs[i + 3]])
        };
        (at(0), at(1))
    }

    /// The signed grid values (before scaling) in element order, and the
    /// eight sub-block scales `s4`.
    pub fn values(&self) -> ([i8; QK_K], [u8; 8]) {
        let mut out = [0i8; QK_K];
        let mut scales = [0u8; 8];
        for (s, scale) in scales.iter_mut().enumerate() {
            let (a, b) = self.words(s);
            *scale = (b >> 28) as u8;
            for l in 0..4 {
                let index = (a >> (8 * l)) as u8;
                let sign = signs(b >> (7 * l));
                for j in 0..8 {
                    let v = grid(index, j) as i8;
                    out[32 * s + 8 * l + j] = if sign & (1 << j) != 0 { -v } else { v };
                }
            }
        }
        (out, scales)
    }
}

pub(super) fn dequantize(blocks: &[BlockIq2Xxs], dst: &mut [f32]) {
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let (values, scales) = b.values();
        for (s, &s4) in scales.iter().enumerate() {
            let db = d * (0.5 + s4 as f32) * 0.25;
            for i in 32 * s..32 * (s + 1) {
                out[i] = db * values[i] as f32;
            }
        }
    }
}

pub(super) fn dot(w: &[BlockIq2Xxs], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(x.d) * y.d();
        let (values, scales) = x.values();
        let mut bsum = 0i32;
        for (s, &s4) in scales.iter().enumerate() {
            let sumi: i32 = (32 * s..32 * (s + 1))
                .map(|i| values[i] as i32 * y.qs[i] as i32)
                .sum();
            bsum += sumi * (2 * s4 as i32 + 1);
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}
