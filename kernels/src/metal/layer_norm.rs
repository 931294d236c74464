//! `LayerNorm` (with bias) on weft's `weft_layer_norm`: mlx-native has RMS
//! norm but no LayerNorm.

use super::{dim, Ctx, MetalTensor, MlxDType};
use bytemuck::{Pod, Zeroable};
use mlx_native::{KernelArg, MTLSize};
use weft_ops::{OpError, OpNode};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct LayerNormParams {
    rows: u32,
    cols: u32,
    eps: f32,
}

pub(super) fn layer_norm(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    ins: &[MetalTensor],
    y: &MetalTensor,
    eps: f32,
) -> Result<(), OpError> {
    let params = LayerNormParams {
        rows: dim(node, "rows", ins[0].tensor.rows())?,
        cols: dim(node, "columns", ins[0].tensor.cols())?,
        eps,
    };
    let (x, w, b, o) = (
        ins[0].view(MlxDType::F32)?,
        ins[1].view(MlxDType::F32)?,
        ins[2].view(MlxDType::F32)?,
        y.view(MlxDType::F32)?,
    );
    cx.weft(
        "weft_layer_norm",
        &[
            (0, KernelArg::Buffer(&x)),
            (1, KernelArg::Buffer(&w)),
            (2, KernelArg::Buffer(&b)),
            (3, KernelArg::Buffer(&o)),
            (4, KernelArg::Bytes(bytemuck::bytes_of(&params))),
        ],
        MTLSize::new(u64::from(params.rows), 1, 1),
        MTLSize::new(256, 1, 1),
    )
}
