//! GELU and the GELU-gated product (GEGLU), evaluated the way llama.cpp's
//! CPU backend does (ggml defines `GGML_GELU_FP16`):
//!
//! ```text
//! x <= -10: 0          x >= 10: x          otherwise: table[f16_bits(f16(x))]
//! ```
//!
//! where `table` holds, for every f16 value `h`, `f16(gelu(h))` computed in
//! f32 with the fused multiply-add gcc makes of ggml's C:
//! `(0.5 h) * (1 + tanhf((sqrt(2/pi) h) * fma(0.044715 h, h, 1)))`.
//! `tanhf` is the C library's (Rust's `f32::tanh` calls it), so the table is
//! bit-identical to the one `ggml_cpu_init` builds. The gated product then
//! multiplies the looked-up value by `up` in f32.

use super::{HostTensor, WorkSplit};
use half::f16;
use std::ops::Range;
use std::sync::OnceLock;
use weft_ops::Tensor;

/// ggml's `GELU_COEF_A`.
const GELU_COEF_A: f32 = 0.044715;
/// ggml's `SQRT_2_OVER_PI` (as an f32).
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// Beyond this magnitude ggml skips the table (0 below, identity above).
const CUTOFF: f32 = 10.0;

/// GELU of one f32 value, the way ggml's scalar `ggml_gelu_f32` computes it.
fn gelu_f32(h: f32) -> f32 {
    let inner = (SQRT_2_OVER_PI * h) * (GELU_COEF_A * h).mul_add(h, 1.0);
    (0.5 * h) * (1.0 + inner.tanh())
}

/// f32 to f16 bits as ggml's software conversion: round to nearest even,
/// every NaN to the quiet NaN `0x7e00` with the input's sign.
fn to_f16_bits(v: f32) -> u16 {
    if v.is_nan() {
        ((v.to_bits() >> 16) as u16 & 0x8000) | 0x7e00
    } else {
        f16::from_f32(v).to_bits()
    }
}

/// The 65,536-entry table, indexed by the f16 bits of the input.
pub fn gelu_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| to_f16_bits(gelu_f32(f16::from_bits(bits).to_f32())))
            .collect()
    })
}

/// `gelu(x)` as ggml's CPU backend evaluates it.
#[inline]
pub fn gelu(x: f32, table: &[u16]) -> f32 {
    if x <= -CUTOFF {
        0.0
    } else if x >= CUTOFF {
        x
    } else {
        f16::from_bits(table[f16::from_f32(x).to_bits() as usize]).to_f32()
    }
}

pub(super) fn split(x: &Tensor, threads: usize) -> WorkSplit {
    WorkSplit::new(x.rows(), super::rows_per_item(x.rows(), threads))
}

/// `out = gelu(x)` over rows `rows`.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn gelu_rows(x: &HostTensor, out: &HostTensor, rows: Range<usize>) {
    let table = gelu_table();
    let cols = x.tensor.cols();
    let span = rows.start * cols..rows.end * cols;
    let src = &x.f32s()[span];
    let dst = out.f32_rows_mut(rows.start, rows.len());
    for (o, v) in dst.iter_mut().zip(src) {
        *o = gelu(*v, table);
    }
}

/// `out = gelu(gate) * up` over rows `rows` (ggml's `ggml_vec_geglu_f32`:
/// above the cut-off the product is `gate * up`, below it `+0`).
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn gelu_mul_rows(
    gate: &HostTensor,
    up: &HostTensor,
    out: &HostTensor,
    rows: Range<usize>,
) {
    let table = gelu_table();
    let cols = gate.tensor.cols();
    let span = rows.start * cols..rows.end * cols;
    let (g, u) = (&gate.f32s()[span.clone()], &up.f32s()[span]);
    let dst = out.f32_rows_mut(rows.start, rows.len());
    for ((o, x), y) in dst.iter_mut().zip(g).zip(u) {
        // ggml writes a plain +0 below the cut-off (not 0 * up, which may be -0).
        *o = if *x <= -CUTOFF {
            0.0
        } else {
            gelu(*x, table) * y
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a of the little-endian table ggml 0.25.3 builds (dumped from
    /// llama.cpp's `ggml_table_gelu_f16` after `ggml_cpu_init`).
    const GGML_TABLE_FNV1A: u64 = 0xab04_4edb_a0ed_200c;

    #[test]
    fn table_is_ggmls() {
        let table = gelu_table();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in table.iter().flat_map(|v| v.to_le_bytes()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        assert_eq!(h, GGML_TABLE_FNV1A, "the GELU table differs from ggml's");
        assert_eq!(table[0x3c00], 0x3abb); // gelu(1) = 0.8413
        assert_eq!(gelu(-12.0, table), 0.0);
        assert_eq!(gelu(12.5, table), 12.5);
    }
}
