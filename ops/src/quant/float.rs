//! Plain float rows: F32 (4 bytes LE), F16 (IEEE half, 2 bytes LE) and BF16
//! (upper 16 bits of an f32, 2 bytes LE). One "block" is one element.
//!
//! ggml multiplies F16 weights with F16 activations and BF16 with BF16
//! (the f32 activations are converted first); the reference dot products
//! below multiply in f32 and sum in f64, like ggml's scalar fallback.

use super::common::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

pub(super) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

pub(super) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32([c[0], c[1]]);
    }
}

pub(super) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_to_f32([c[0], c[1]]);
    }
}

pub(super) fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (s, c) in src.iter().zip(dst.chunks_exact_mut(4)) {
        c.copy_from_slice(&s.to_le_bytes());
    }
}

pub(super) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (s, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_f16(*s));
    }
}

pub(super) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (s, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_bf16(*s));
    }
}

/// Sum in f64 of the f32 products of two decoded rows.
fn dot_with(w: &[u8], a: &[u8], width: usize, decode: impl Fn(&[u8]) -> f32) -> f32 {
    let mut sum = 0f64;
    for (x, y) in w.chunks_exact(width).zip(a.chunks_exact(width)) {
        sum += (decode(x) * decode(y)) as f64;
    }
    sum as f32
}

pub(super) fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    dot_with(w, a, 4, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

pub(super) fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    dot_with(w, a, 2, |c| f16_to_f32([c[0], c[1]]))
}

pub(super) fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    dot_with(w, a, 2, |c| bf16_to_f32([c[0], c[1]]))
}
