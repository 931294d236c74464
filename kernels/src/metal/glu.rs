//! `Gelu` and `GeluMul` (GEGLU): mlx-native's `gelu_f32` and its
//! `fused_gelu_mul` kernel (the tanh form; weft encodes the latter's
//! dispatch itself, mlx-native only exposes it inside its MoE helpers).

use super::{dim, mlx_error, size1, threads1, Ctx, MetalTensor, MlxDType};
use mlx_native::ops::gelu::dispatch_gelu;
use mlx_native::KernelArg;
use weft_ops::{OpError, OpNode};

pub(super) fn gelu(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    x: &MetalTensor,
    out: &MetalTensor,
) -> Result<(), OpError> {
    dim(node, "elements", x.elements())?;
    dispatch_gelu(
        cx.enc,
        &mut cx.registry,
        cx.device.metal_device(),
        &x.view(MlxDType::F32)?,
        &out.view(MlxDType::F32)?,
    )
    .map_err(mlx_error(node, "gelu_f32"))
}

pub(super) fn gelu_mul(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    gate: &MetalTensor,
    up: &MetalTensor,
    out: &MetalTensor,
) -> Result<(), OpError> {
    let n = dim(node, "elements", gate.elements())?;
    let (g, u, o) = (
        gate.view(MlxDType::F32)?,
        up.view(MlxDType::F32)?,
        out.view(MlxDType::F32)?,
    );
    let pipeline = cx
        .registry
        .get_pipeline("fused_gelu_mul", cx.device.metal_device())
        .map_err(mlx_error(node, "fused_gelu_mul"))?;
    // FusedGeluMulParams { uint n_elements }.
    cx.enc.encode_with_args(
        pipeline,
        &[
            (0, KernelArg::Buffer(&g)),
            (1, KernelArg::Buffer(&u)),
            (2, KernelArg::Buffer(&o)),
            (3, KernelArg::Bytes(&n.to_ne_bytes())),
        ],
        size1(u64::from(n)),
        threads1(u64::from(n)),
    );
    Ok(())
}
