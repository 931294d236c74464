//! `RmsNorm` on mlx-native's `rms_norm_f32` (`rms_norm_f32_v2`, float4 and
//! simd sums, when rows are a multiple of 4 long).

use super::{dim, mlx_error, Ctx, MetalTensor, MlxDType, Route};
use mlx_native::ops::rms_norm::dispatch_rms_norm;
use weft_ops::{OpError, OpNode, Tensor};

pub(super) fn route(x: &Tensor) -> Route {
    if x.cols().is_multiple_of(4) {
        Route::MlxNative("rms_norm_f32_v2")
    } else {
        Route::MlxNative("rms_norm_f32")
    }
}

pub(super) fn rms_norm(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    x: &MetalTensor,
    w: &MetalTensor,
    y: &MetalTensor,
    eps: f32,
) -> Result<(), OpError> {
    let rows = dim(node, "rows", x.tensor.rows())?;
    let cols = dim(node, "columns", x.tensor.cols())?;
    // The kernel reads [eps, dim] from a buffer.
    let params = cx.arena.upload(&[eps, cols as f32], MlxDType::F32)?;
    dispatch_rms_norm(
        cx.enc,
        &mut cx.registry,
        cx.device.metal_device(),
        &x.view(MlxDType::F32)?,
        &w.view(MlxDType::F32)?,
        &y.view(MlxDType::F32)?,
        &params,
        rows,
        cols,
    )
    .map_err(mlx_error(node, "rms_norm_f32"))
}
