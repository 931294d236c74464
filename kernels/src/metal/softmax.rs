//! `Softmax` of `x * scale` per row: mlx-native's `softmax_f32` when the
//! scale is 1, its `scale_mask_softmax_f32` with an all-zero mask row
//! otherwise.

use super::{dim, mlx_error, Ctx, MetalTensor, MlxDType, Route};
use mlx_native::ops::scale_mask_softmax::{
    dispatch_scale_mask_softmax_f32, ScaleMaskSoftmaxParams,
};
use mlx_native::ops::softmax::dispatch_softmax;
use weft_ops::{OpError, OpNode};

pub(super) fn route(scale: f32) -> Route {
    if scale == 1.0 {
        Route::MlxNative("softmax_f32")
    } else {
        Route::MlxNative("scale_mask_softmax_f32")
    }
}

pub(super) fn softmax(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    x: &MetalTensor,
    out: &MetalTensor,
    scale: f32,
) -> Result<(), OpError> {
    let rows = dim(node, "rows", x.tensor.rows())?;
    let cols = dim(node, "columns", x.tensor.cols())?;
    let (xv, ov) = (x.view(MlxDType::F32)?, out.view(MlxDType::F32)?);
    if scale == 1.0 {
        // The kernel reads [cols, 0] from a buffer.
        let params = cx.arena.upload(&[cols as f32, 0.0], MlxDType::F32)?;
        return dispatch_softmax(
            cx.enc,
            &mut cx.registry,
            cx.device.metal_device(),
            &xv,
            &ov,
            &params,
            rows,
            cols,
        )
        .map_err(mlx_error(node, "softmax_f32"));
    }
    // One bf16 mask row shared by every row (seq_q = 1), all zeros.
    let mask = cx.arena.zeroed(cols as usize * 2, MlxDType::BF16)?;
    let params = ScaleMaskSoftmaxParams {
        rows,
        cols,
        seq_q: 1,
        scale,
    };
    dispatch_scale_mask_softmax_f32(
        cx.enc,
        &mut cx.registry,
        cx.device,
        &xv,
        &ov,
        &mask,
        &params,
    )
    .map_err(mlx_error(node, "scale_mask_softmax_f32"))
}
