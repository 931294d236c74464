//! Elementwise ops, GELU, softmax and argmax.

use super::{f32_bytes, HostMemory};
use crate::tensor::Tensor;
use crate::OpError;

pub(super) fn binary(
    mem: &HostMemory,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(f32, f32) -> f32,
) -> Result<Vec<u8>, OpError> {
    let (x, y) = (mem.to_f32(a)?, mem.to_f32(b)?);
    let out = x
        .iter()
        .enumerate()
        .map(|(i, &v)| f(v, y[i % y.len()]))
        .collect();
    Ok(f32_bytes(out))
}

pub(super) fn unary(
    mem: &HostMemory,
    a: &Tensor,
    f: impl Fn(f32) -> f32,
) -> Result<Vec<u8>, OpError> {
    Ok(f32_bytes(mem.to_f32(a)?.into_iter().map(f).collect()))
}

pub(super) fn softmax(mem: &HostMemory, a: &Tensor, scale: f32) -> Result<Vec<u8>, OpError> {
    let x = mem.to_f32(a)?;
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(a.cols()) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(v * scale));
        let e: Vec<f64> = row
            .iter()
            .map(|v| ((v * scale - max) as f64).exp())
            .collect();
        let sum: f64 = e.iter().sum();
        out.extend(e.iter().map(|v| (v / sum) as f32));
    }
    Ok(f32_bytes(out))
}

pub(super) fn argmax(mem: &HostMemory, a: &Tensor) -> Result<Vec<u8>, OpError> {
    let x = mem.to_f32(a)?;
    let ids: Vec<i32> = x
        .chunks(a.cols())
        .map(|row| {
            let mut best = 0;
            for (i, v) in row.iter().enumerate() {
                if *v > row[best] {
                    best = i;
                }
            }
            best as i32
        })
        .collect();
    Ok(bytemuck::cast_slice(&ids).to_vec())
}

/// GELU in its tanh form, evaluated in f64 and rounded once.
pub(super) fn gelu(x: f32) -> f32 {
    let x = x as f64;
    let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    (0.5 * x * (1.0 + inner.tanh())) as f32
}
