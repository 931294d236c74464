//! Rotary position embedding, with YaRN.

use super::{f32_bytes, HostMemory};
use crate::op::{RopeMode, RopeParams};
use crate::tensor::Tensor;
use crate::OpError;

/// `(cos, sin)` for each rotated pair of a head at `position`, with YaRN's
/// ramp and magnitude scaling when `ext_factor != 0`.
pub fn rope_angles(p: &RopeParams, position: f32) -> Vec<(f32, f32)> {
    rope_angles_with_factors(p, position, None)
}

/// [`rope_angles`] with pair `i`'s unscaled angle divided by `factors[i]`.
pub fn rope_angles_with_factors(
    p: &RopeParams,
    position: f32,
    factors: Option<&[f32]>,
) -> Vec<(f32, f32)> {
    let n = p.n_dims as f32;
    let (low, high) = yarn_corr_dims(p);
    (0..p.n_dims / 2)
        .map(|i| {
            let factor = factors.map_or(1.0, |f| f[i]);
            let theta_extrap = position * p.base.powf(-2.0 * i as f32 / n) / factor;
            let theta_interp = p.freq_scale * theta_extrap;
            let mut mscale = p.attn_factor;
            let theta = if p.ext_factor != 0.0 {
                let y = (i as f32 - low) / (high - low).max(0.001);
                let ramp = (1.0 - y.clamp(0.0, 1.0)) * p.ext_factor;
                mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
                theta_interp * (1.0 - ramp) + theta_extrap * ramp
            } else {
                theta_interp
            };
            (theta.cos() * mscale, theta.sin() * mscale)
        })
        .collect()
}

/// YaRN's correction range in rotated-pair units.
fn yarn_corr_dims(p: &RopeParams) -> (f32, f32) {
    let n = p.n_dims as f32;
    let dim = |rot: f32| {
        n * (p.orig_ctx as f32 / (rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * p.base.ln())
    };
    let low = dim(p.beta_fast).floor().max(0.0);
    let high = dim(p.beta_slow).ceil().min(n - 1.0);
    (low, high)
}

pub(super) fn rope(
    mem: &HostMemory,
    x: &Tensor,
    pos: &Tensor,
    factors: Option<&Tensor>,
    p: &RopeParams,
) -> Result<Vec<u8>, OpError> {
    let mut v = mem.to_f32(x)?;
    let positions = mem.to_i32(pos);
    let factors = factors.map(|f| mem.to_f32(f)).transpose()?;
    let half = p.n_dims / 2;
    for (row, &position) in v.chunks_mut(x.cols()).zip(&positions) {
        let angles = rope_angles_with_factors(p, position as f32, factors.as_deref());
        for head in row.chunks_mut(p.head_dim) {
            for (i, &(c, s)) in angles.iter().enumerate() {
                let (a, b) = match p.mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
    }
    Ok(f32_bytes(v))
}
