//! `Rope`: mlx-native's `rope_neox_f32` for plain NeoX rotation of whole
//! heads (its pairing `(i, i + head_dim / 2)` and frequencies
//! `base^(-2i / head_dim)` are weft's when `n_dims == head_dim`); weft's
//! `weft_rope_f32` otherwise: adjacent pairs (the GGUF llama layout, which
//! mlx-native's `rope_f32` handles only for one head per row), partial
//! rotation and YaRN.

use super::{dim, mlx_error, Ctx, MetalTensor, MlxDType, Route};
use bytemuck::{Pod, Zeroable};
use mlx_native::ops::rope::dispatch_rope_neox_f32;
use mlx_native::{KernelArg, MTLSize};
use weft_ops::{OpError, OpNode, RopeMode, RopeParams};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    head_dim: u32,
    n_dims: u32,
    neox: u32,
    yarn: u32,
    freq_scale: f32,
    mscale: f32,
}

fn plain_neox(p: &RopeParams) -> bool {
    p.mode == RopeMode::Neox
        && p.n_dims == p.head_dim
        && p.freq_scale == 1.0
        && p.ext_factor == 0.0
        && p.attn_factor == 1.0
}

pub(super) fn route(p: &RopeParams) -> Route {
    if plain_neox(p) {
        Route::MlxNative("rope_neox_f32")
    } else {
        Route::Weft("weft_rope_f32")
    }
}

/// Per-pair tables, computed as `weft_ops::reference::rope_angles` does:
/// `base^(-2i / n_dims)` and YaRN's ramp (zeros without YaRN).
fn tables(p: &RopeParams) -> (Vec<f32>, Vec<f32>) {
    let n = p.n_dims as f32;
    let mut inv_freq: Vec<f32> = (0..p.n_dims / 2)
        .map(|i| p.base.powf(-2.0 * i as f32 / n))
        .collect();
    if inv_freq.is_empty() {
        inv_freq.push(0.0);
    }
    let ramp = if p.ext_factor != 0.0 {
        let corr = |rot: f32| {
            n * (p.orig_ctx as f32 / (rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * p.base.ln())
        };
        let low = corr(p.beta_fast).floor().max(0.0);
        let high = corr(p.beta_slow).ceil().min(n - 1.0);
        (0..p.n_dims / 2)
            .map(|i| {
                let y = (i as f32 - low) / (high - low).max(0.001);
                (1.0 - y.clamp(0.0, 1.0)) * p.ext_factor
            })
            .collect()
    } else {
        vec![0.0; (p.n_dims / 2).max(1)]
    };
    (inv_freq, ramp)
}

pub(super) fn rope(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    x: &MetalTensor,
    positions: &MetalTensor,
    y: &MetalTensor,
    p: &RopeParams,
) -> Result<(), OpError> {
    let rows = dim(node, "rows", x.tensor.rows())?;
    let cols = dim(node, "columns", x.tensor.cols())?;
    let head_dim = dim(node, "head size", p.head_dim)?;
    let n_dims = dim(node, "rotated dims", p.n_dims)?;
    let heads = cols / head_dim.max(1);
    let (xv, yv) = (x.view(MlxDType::F32)?, y.view(MlxDType::F32)?);
    if plain_neox(p) {
        // Positions are read as u32 (weft's are non-negative i32); the
        // dispatcher reads [base, head_dim, rope_dim, 0] on the host.
        let params = cx.arena.upload(
            &[p.base, head_dim as f32, n_dims as f32, 0.0],
            MlxDType::F32,
        )?;
        return dispatch_rope_neox_f32(
            cx.enc,
            &mut cx.registry,
            cx.device.metal_device(),
            &xv,
            &yv,
            &params,
            &positions.view(MlxDType::U32)?,
            None,
            rows,
            heads,
            head_dim,
            n_dims,
        )
        .map_err(mlx_error(node, "rope_neox_f32"));
    }
    let (inv_freq, ramp) = tables(p);
    let inv_freq = cx.arena.upload(&inv_freq, MlxDType::F32)?;
    let ramp = cx.arena.upload(&ramp, MlxDType::F32)?;
    let yarn = p.ext_factor != 0.0;
    let mut mscale = p.attn_factor;
    if yarn {
        mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
    }
    let params = Params {
        rows,
        cols,
        head_dim,
        n_dims,
        neox: u32::from(p.mode == RopeMode::Neox),
        yarn: u32::from(yarn),
        freq_scale: p.freq_scale,
        mscale,
    };
    let pos = positions.bytes()?;
    // One thread per rotated pair, plus one per two pass-through elements.
    let width = n_dims / 2 + (head_dim - n_dims).div_ceil(2);
    cx.weft_grid(
        "weft_rope_f32",
        &[
            (0, KernelArg::Buffer(&xv)),
            (1, KernelArg::Buffer(&pos)),
            (2, KernelArg::Buffer(&yv)),
            (3, KernelArg::Buffer(&inv_freq)),
            (4, KernelArg::Buffer(&ramp)),
            (5, KernelArg::Bytes(bytemuck::bytes_of(&params))),
        ],
        MTLSize::new(u64::from(width.max(1)), u64::from(heads), u64::from(rows)),
        MTLSize::new(u64::from(width.clamp(1, 64)), 1, 1),
    )
}
