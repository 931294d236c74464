//! RMS norm and LayerNorm.

use super::{f32_bytes, HostMemory};
use crate::tensor::Tensor;
use crate::OpError;

pub(super) fn rms_norm(
    mem: &HostMemory,
    x: &Tensor,
    w: &Tensor,
    eps: f32,
) -> Result<Vec<u8>, OpError> {
    let (x, w) = (mem.to_f32(x)?, mem.to_f32(w)?);
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(w.len()) {
        let mean = row.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / row.len() as f64;
        let scale = 1.0 / (mean + eps as f64).sqrt();
        out.extend(
            row.iter()
                .zip(&w)
                .map(|(v, g)| ((*v as f64 * scale) as f32) * g),
        );
    }
    Ok(f32_bytes(out))
}

pub(super) fn layer_norm(
    mem: &HostMemory,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f32,
) -> Result<Vec<u8>, OpError> {
    let (x, w, b) = (mem.to_f32(x)?, mem.to_f32(w)?, mem.to_f32(b)?);
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(w.len()) {
        let n = row.len() as f64;
        let mean = row.iter().map(|v| *v as f64).sum::<f64>() / n;
        let var = row.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / n;
        let scale = 1.0 / (var + eps as f64).sqrt();
        out.extend(
            row.iter()
                .zip(w.iter().zip(&b))
                .map(|(v, (g, c))| ((*v as f64 - mean) * scale * *g as f64 + *c as f64) as f32),
        );
    }
    Ok(f32_bytes(out))
}
