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

/// The table's entries as f32 (what the vector path gathers from).
#[cfg(target_arch = "x86_64")]
fn gelu_table_f32() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        gelu_table()
            .iter()
            .map(|&b| f16::from_bits(b).to_f32())
            .collect()
    })
}

#[cfg(target_arch = "x86_64")]
fn avx512() -> bool {
    use super::quant::Isa;
    matches!(Isa::detect(), Ok(Isa::Avx512))
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
    let cols = x.tensor.cols();
    let span = rows.start * cols..rows.end * cols;
    let src = &x.f32s()[span];
    let dst = out.f32_rows_mut(rows.start, rows.len());
    geglu(src, None, dst);
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
    let cols = gate.tensor.cols();
    let span = rows.start * cols..rows.end * cols;
    let (g, u) = (&gate.f32s()[span.clone()], &up.f32s()[span]);
    let dst = out.f32_rows_mut(rows.start, rows.len());
    geglu(g, Some(u), dst);
}

/// `out = gelu(x) * up` (or `gelu(x)` without `up`), vectorised where the
/// CPU allows; every path gives the same bits.
fn geglu(x: &[f32], up: Option<&[f32]>, out: &mut [f32]) {
    let n = x
        .len()
        .min(out.len())
        .min(up.map_or(usize::MAX, <[f32]>::len));
    #[cfg(target_arch = "x86_64")]
    let start = if avx512() {
        let start = n - n % 16;
        let table = gelu_table_f32();
        let up_ptr = up.map_or(std::ptr::null(), <[f32]>::as_ptr);
        // SAFETY: AVX-512F is available (checked above); `x`, `out` and (if
        // given) `up` hold at least `start` values; the table has 65,536
        // entries and every gathered index is a u16.
        unsafe { x86::geglu(x.as_ptr(), up_ptr, out.as_mut_ptr(), start, table.as_ptr()) };
        start
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let start = 0;
    let table = gelu_table();
    for i in start..n {
        out[i] = match up {
            // ggml writes a plain +0 below the cut-off (not 0 * up, which may be -0).
            Some(_) if x[i] <= -CUTOFF => 0.0,
            Some(u) => gelu(x[i], table) * u[i],
            None => gelu(x[i], table),
        };
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CUTOFF;
    use std::arch::x86_64::*;

    /// 16 values at a time: round to f16 (RNE, as ggml's scalar conversion
    /// does for every finite input), gather the table entry, apply the
    /// cut-offs, multiply by `up` unless it is null.
    #[target_feature(enable = "avx512f,f16c")]
    pub unsafe fn geglu(x: *const f32, up: *const f32, out: *mut f32, n: usize, table: *const f32) {
        let lo = _mm512_set1_ps(-CUTOFF);
        let hi = _mm512_set1_ps(CUTOFF);
        let mut i = 0;
        while i < n {
            let v = _mm512_loadu_ps(x.add(i));
            let bits = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            let idx = _mm512_cvtepu16_epi32(bits);
            let g = _mm512_i32gather_ps::<4>(idx, table);
            let above = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, hi);
            let below = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, lo);
            let g = _mm512_mask_mov_ps(g, above, v);
            let r = if up.is_null() {
                g
            } else {
                _mm512_mul_ps(g, _mm512_loadu_ps(up.add(i)))
            };
            let r = _mm512_mask_mov_ps(r, below, _mm512_setzero_ps());
            _mm512_storeu_ps(out.add(i), r);
            i += 16;
        }
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

    #[test]
    fn vector_and_scalar_paths_agree_bit_for_bit() {
        let table = gelu_table();
        // Every finite f16 value, the cut-offs and values around them.
        let mut x: Vec<f32> = (0..=u16::MAX)
            .map(|b| f16::from_bits(b).to_f32())
            .filter(|v| v.is_finite())
            .collect();
        x.extend([
            -10.0, 10.0, -10.000001, 9.999999, 1e-8, -1e-8, 0.0, -0.0, 3.3e4,
        ]);
        x.extend((0..1000).map(|i| (i as f32 * 0.7371).sin() * 12.0));
        let up: Vec<f32> = x.iter().map(|v| 0.5 - v.cos()).collect();
        let mut got = vec![0f32; x.len()];
        geglu(&x, Some(&up), &mut got);
        for (i, (v, u)) in x.iter().zip(&up).enumerate() {
            let want = if *v <= -CUTOFF {
                0.0
            } else {
                gelu(*v, table) * u
            };
            assert_eq!(got[i].to_bits(), want.to_bits(), "gelu_mul({v}) * {u}");
        }
        geglu(&x, None, &mut got);
        for (i, v) in x.iter().enumerate() {
            assert_eq!(got[i].to_bits(), gelu(*v, table).to_bits(), "gelu({v})");
        }
    }
}
