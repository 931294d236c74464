//! Rotary embedding, computing angles exactly as llama.cpp's CPU backend
//! does: `theta` starts at the position and is multiplied by
//! `base^(-2/n_dims)` once per pair (not recomputed with `powf` per pair),
//! then YaRN's ramp, then `cosf`/`sinf` in f32, and the rotation with the
//! same fused multiply-adds the compiler makes of ggml's C.

use super::HostTensor;
use weft_ops::{RopeMode, RopeParams};

/// `(cos, sin)` per rotated pair at `position`, llama.cpp's way.
pub fn angle_cache(p: &RopeParams, position: f32, cache: &mut Vec<(f32, f32)>) {
    angle_cache_with_factors(p, position, None, cache);
}

/// [`angle_cache`] with pair `i`'s unscaled angle divided by `factors[i]`
/// before YaRN's ramp, as ggml's `rope_cache_init` does with
/// `freq_factors`.
pub fn angle_cache_with_factors(
    p: &RopeParams,
    position: f32,
    factors: Option<&[f32]>,
    cache: &mut Vec<(f32, f32)>,
) {
    cache.clear();
    let theta_scale = p.base.powf(-2.0 / p.n_dims as f32);
    let (low, high) = corr_dims(p);
    let mut theta_extrap = position;
    for i0 in (0..p.n_dims).step_by(2) {
        let theta_pair = match factors {
            Some(f) => theta_extrap / f[i0 / 2],
            None => theta_extrap,
        };
        let theta_interp = p.freq_scale * theta_pair;
        let mut theta = theta_interp;
        let mut mscale = p.attn_factor;
        if p.ext_factor != 0.0 {
            let y = ((i0 / 2) as f32 - low) / (high - low).max(0.001);
            let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * p.ext_factor;
            theta = theta_interp * (1.0 - ramp_mix) + theta_pair * ramp_mix;
            mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
        }
        cache.push((theta.cos() * mscale, theta.sin() * mscale));
        theta_extrap *= theta_scale;
    }
}

fn corr_dims(p: &RopeParams) -> (f32, f32) {
    let n = p.n_dims as f32;
    let dim = |rot: f32| {
        n * (p.orig_ctx as f32 / (rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * p.base.ln())
    };
    (
        dim(p.beta_fast).floor().max(0.0),
        dim(p.beta_slow).ceil().min(n - 1.0),
    )
}

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn rope(
    x: &HostTensor,
    positions: &HostTensor,
    factors: Option<&HostTensor>,
    out: &HostTensor,
    p: &RopeParams,
    rows: std::ops::Range<usize>,
) {
    let factors = factors.map(|f| f.f32s());
    let cols = x.tensor.cols();
    let xv = x.f32s();
    let pos = std::slice::from_raw_parts(
        positions.ptr as *const i32,
        positions.tensor.shape.elements(),
    );
    let o = out.ptr as *mut f32;
    let half = p.n_dims / 2;
    let mut cache = Vec::with_capacity(half);
    for r in rows {
        angle_cache_with_factors(p, pos[r] as f32, factors, &mut cache);
        for h in 0..cols / p.head_dim {
            let base = r * cols + h * p.head_dim;
            let src = &xv[base..base + p.head_dim];
            let dst = o.add(base);
            for (i, &(c, s)) in cache.iter().enumerate() {
                let (a, b) = match p.mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                let (x0, x1) = (src[a], src[b]);
                // The contraction gcc makes of `x0*c - x1*s` and `x0*s + x1*c`
                // in ggml's rope: the first product is fused.
                *dst.add(a) = x0.mul_add(c, -(x1 * s));
                *dst.add(b) = x0.mul_add(s, x1 * c);
            }
            for (d, x) in src.iter().enumerate().skip(p.n_dims) {
                *dst.add(d) = *x;
            }
        }
    }
}
