//! Scalar helpers shared by the formats: half-precision conversions and
//! ggml's rounding.

/// IEEE half (stored little-endian) to f32; exact.
pub fn f16_to_f32(bits: [u8; 2]) -> f32 {
    half::f16::from_le_bytes(bits).to_f32()
}

/// f32 to IEEE half, rounding to nearest even (what F16C's
/// `vcvtps2ph` with rounding mode 0 and ggml's scalar code do).
pub fn f32_to_f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// bfloat16 (stored little-endian) to f32; exact.
pub fn bf16_to_f32(bits: [u8; 2]) -> f32 {
    f32::from_bits((u16::from_le_bytes(bits) as u32) << 16)
}

/// f32 to bfloat16 as ggml's `ggml_compute_fp32_to_bf16`: round to nearest
/// even, NaNs kept quiet.
pub fn f32_to_bf16(x: f32) -> [u8; 2] {
    let u = x.to_bits();
    let h = if (u & 0x7fff_ffff) > 0x7f80_0000 {
        (u >> 16) | 64
    } else {
        (u + (0x7fff + ((u >> 16) & 1))) >> 16
    };
    (h as u16).to_le_bytes()
}

/// ggml's `nearest_int`: round to nearest, ties to even, through the
/// magic-number trick. Valid for `|x| <= 4194303`.
pub fn nearest_int(x: f32) -> i32 {
    let val = x + 12_582_912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Largest absolute value in `x` (0 for an empty slice).
pub(crate) fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// The element of largest magnitude, with its sign (the first one on ties),
/// as ggml's quantizers find it.
pub(crate) fn signed_abs_max(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-127.0), -127);
        assert_eq!(nearest_int(3.49), 3);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0)), 1.0);
        // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0).
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(
            bf16_to_f32(f32_to_bf16(1.0 + 3.0 / 256.0)),
            1.0 + 4.0 / 256.0
        );
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    }
}
