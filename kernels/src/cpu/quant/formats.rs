//! The 32-element block formats as the fast kernels see them: every weight
//! is an *unsigned code* `u` (0..=15, 0..=31 or 0..=255) with a fixed
//! offset, so `weight = d * (u - OFFSET) [+ m]`. Unsigned codes let
//! `vpdpbusd` (u8 x i8) multiply them with the i8 activations directly; the
//! offset is taken back through the activation sums.
//!
//! The byte layouts themselves are defined (and documented) in
//! `weft_ops::quant`; this file only names offsets into them.

use weft_ops::quant::f16_to_f32;

/// Which 32-element format a generic kernel is instantiated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
}

/// A 32-element weight format multiplied with Q8_0 or Q8_1 activations.
pub(crate) trait Block32: Copy + 'static {
    const KIND: Kind;
    /// Bytes per block.
    const BYTES: usize;
    /// `weight = d * (code - OFFSET) [+ m]`.
    const OFFSET: i32;
    /// Whether blocks carry a minimum `m` (then the activations are Q8_1
    /// and the kernels add `m * s` per block).
    const HAS_MIN: bool;
    /// Byte offset of the 16 nibble bytes (or the 32 i8 for Q8_0).
    const QS: usize;
    /// Byte offset of the 32 fifth bits (Q5 formats).
    const QH: usize = 0;

    /// The block's 32 unsigned codes in element order.
    fn codes(block: &[u8]) -> [u8; 32] {
        let mut u = [0u8; 32];
        match Self::KIND {
            Kind::Q8_0 => {
                for (c, &q) in u.iter_mut().zip(&block[Self::QS..Self::QS + 32]) {
                    *c = q ^ 0x80;
                }
            }
            _ => {
                let qs = &block[Self::QS..Self::QS + 16];
                for j in 0..16 {
                    u[j] = qs[j] & 0x0f;
                    u[j + 16] = qs[j] >> 4;
                }
                if matches!(Self::KIND, Kind::Q5_0 | Kind::Q5_1) {
                    let qh = u32::from_le_bytes([
                        block[Self::QH],
                        block[Self::QH + 1],
                        block[Self::QH + 2],
                        block[Self::QH + 3],
                    ]);
                    for (j, c) in u.iter_mut().enumerate() {
                        *c |= (((qh >> j) & 1) as u8) << 4;
                    }
                }
            }
        }
        u
    }

    /// The block scale.
    fn d(block: &[u8]) -> f32 {
        f16_to_f32([block[0], block[1]])
    }

    /// The block minimum (formats with `HAS_MIN`).
    fn m(block: &[u8]) -> f32 {
        f16_to_f32([block[2], block[3]])
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Q4_0;
#[derive(Clone, Copy)]
pub(crate) struct Q4_1;
#[derive(Clone, Copy)]
pub(crate) struct Q5_0;
#[derive(Clone, Copy)]
pub(crate) struct Q5_1;
#[derive(Clone, Copy)]
pub(crate) struct Q8_0;

impl Block32 for Q4_0 {
    const KIND: Kind = Kind::Q4_0;
    const BYTES: usize = 18;
    const OFFSET: i32 = 8;
    const HAS_MIN: bool = false;
    const QS: usize = 2;
}

impl Block32 for Q4_1 {
    const KIND: Kind = Kind::Q4_1;
    const BYTES: usize = 20;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    const QS: usize = 4;
}

impl Block32 for Q5_0 {
    const KIND: Kind = Kind::Q5_0;
    const BYTES: usize = 22;
    const OFFSET: i32 = 16;
    const HAS_MIN: bool = false;
    const QS: usize = 6;
    const QH: usize = 2;
}

impl Block32 for Q5_1 {
    const KIND: Kind = Kind::Q5_1;
    const BYTES: usize = 24;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    const QS: usize = 8;
    const QH: usize = 4;
}

impl Block32 for Q8_0 {
    const KIND: Kind = Kind::Q8_0;
    const BYTES: usize = 34;
    const OFFSET: i32 = 128;
    const HAS_MIN: bool = false;
    const QS: usize = 2;
}

/// Activation block layout (Q8_0: d, qs; Q8_1: d, s, qs).
pub(crate) const fn act_bytes(has_min: bool) -> usize {
    if has_min {
        36
    } else {
        34
    }
}

/// Byte offset of the 32 activation quants in an activation block.
pub(crate) const fn act_qs(has_min: bool) -> usize {
    if has_min {
        4
    } else {
        2
    }
}

/// Byte offsets inside the K super-block formats.
pub(crate) mod kq {
    /// Q4_K: d, dmin, scales[12], qs[128].
    pub const Q4K_BYTES: usize = 144;
    pub const Q4K_QS: usize = 16;
    /// Q6_K: ql[128], qh[64], scales[16], d.
    pub const Q6K_BYTES: usize = 210;
    pub const Q6K_QH: usize = 128;
    pub const Q6K_SCALES: usize = 192;
    pub const Q6K_D: usize = 208;
    /// Q8_K: d (f32), qs[256], bsums[16] (i16).
    pub const Q8K_BYTES: usize = 292;
    pub const Q8K_QS: usize = 4;
    pub const Q8K_BSUMS: usize = 260;
}
