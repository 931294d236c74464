//! `Argmax` per row on mlx-native's `argmax_f32` (one dispatch per row,
//! all in the node's level: they write distinct outputs). Ties go to the
//! lowest index, as in the reference. A row holding a NaN or an infinity
//! gives index -1 (mlx-native's sentinel, u32::MAX) where the reference
//! would pick an index: a non-finite logit never passes for a token.

use super::{dim, mlx_error, view_of, Ctx, MetalTensor, MlxDType};
use mlx_native::ops::argmax::dispatch_argmax_f32;
use weft_ops::{OpError, OpNode};

pub(super) fn argmax(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    x: &MetalTensor,
    out: &MetalTensor,
) -> Result<(), OpError> {
    let rows = x.tensor.rows();
    let cols = dim(node, "columns", x.tensor.cols())?;
    let row_bytes = x.tensor.row_bytes() as u64;
    let xs = x.view(MlxDType::F32)?;
    let idx = out.view(MlxDType::U32)?;
    // The kernel reads n from a buffer and also writes the maximum value.
    let params = cx.arena.upload(&[cols], MlxDType::U32)?;
    let values = cx.arena.scratch(4 * rows, MlxDType::F32)?;
    for r in 0..rows as u64 {
        let row = view_of(&xs, r * row_bytes, row_bytes, MlxDType::F32)?;
        let index = view_of(&idx, 4 * r, 4, MlxDType::U32)?;
        let value = view_of(&values, 4 * r, 4, MlxDType::F32)?;
        dispatch_argmax_f32(
            cx.enc,
            &mut cx.registry,
            cx.device.metal_device(),
            &row,
            &index,
            &value,
            &params,
            cols,
        )
        .map_err(mlx_error(node, "argmax_f32"))?;
    }
    Ok(())
}
