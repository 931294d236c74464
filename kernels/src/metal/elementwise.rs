//! `Add`, `Mul`, `Scale`, `SiluMul`: mlx-native's `elementwise_add_f32`,
//! `elementwise_mul_f32`, `scalar_mul_f32` and `silu_mul_f32`; a single
//! row of `b` broadcast over `a`'s rows runs on weft's
//! `weft_binary_row_f32` (mlx-native's binary kernels take equal shapes).

use super::{dim, mlx_error, size1, threads1, Ctx, MetalTensor, MlxDType, Route};
use bytemuck::{Pod, Zeroable};
use mlx_native::ops::elementwise::{elementwise_add, elementwise_mul, scalar_mul_f32};
use mlx_native::ops::silu_mul::dispatch_silu_mul;
use mlx_native::KernelArg;
use weft_ops::{Op, OpError, OpNode};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct BinaryParams {
    elements: u32,
    cols: u32,
    op: u32,
}

fn broadcasts(node: &OpNode) -> bool {
    node.inputs[1].rows() != node.inputs[0].rows()
}

pub(super) fn route_binary(node: &OpNode) -> Route {
    match (broadcasts(node), &node.op) {
        (true, _) => Route::Weft("weft_binary_row_f32"),
        (false, Op::Mul) => Route::MlxNative("elementwise_mul_f32"),
        (false, _) => Route::MlxNative("elementwise_add_f32"),
    }
}

pub(super) fn binary(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    a: &MetalTensor,
    b: &MetalTensor,
    out: &MetalTensor,
    mul: bool,
) -> Result<(), OpError> {
    let n = a.elements();
    let (av, bv, ov) = (
        a.view(MlxDType::F32)?,
        b.view(MlxDType::F32)?,
        out.view(MlxDType::F32)?,
    );
    if broadcasts(node) {
        let params = BinaryParams {
            elements: dim(node, "elements", n)?,
            cols: dim(node, "columns", b.tensor.cols())?,
            op: u32::from(mul),
        };
        return cx.weft_grid(
            "weft_binary_row_f32",
            &[
                (0, KernelArg::Buffer(&av)),
                (1, KernelArg::Buffer(&bv)),
                (2, KernelArg::Buffer(&ov)),
                (3, KernelArg::Bytes(bytemuck::bytes_of(&params))),
            ],
            size1(n as u64),
            threads1(n as u64),
        );
    }
    dim(node, "elements", n)?;
    let dev = cx.device.metal_device();
    let result = if mul {
        elementwise_mul(
            cx.enc,
            &mut cx.registry,
            dev,
            &av,
            &bv,
            &ov,
            n,
            MlxDType::F32,
        )
    } else {
        elementwise_add(
            cx.enc,
            &mut cx.registry,
            dev,
            &av,
            &bv,
            &ov,
            n,
            MlxDType::F32,
        )
    };
    let kernel = if mul {
        "elementwise_mul_f32"
    } else {
        "elementwise_add_f32"
    };
    result.map_err(mlx_error(node, kernel))
}

pub(super) fn scale(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    x: &MetalTensor,
    out: &MetalTensor,
    factor: f32,
) -> Result<(), OpError> {
    let n = x.elements();
    dim(node, "elements", n)?;
    scalar_mul_f32(
        cx.enc,
        &mut cx.registry,
        cx.device.metal_device(),
        &x.view(MlxDType::F32)?,
        &out.view(MlxDType::F32)?,
        n,
        factor,
    )
    .map_err(mlx_error(node, "scalar_mul_f32"))
}

pub(super) fn silu_mul(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    gate: &MetalTensor,
    up: &MetalTensor,
    out: &MetalTensor,
) -> Result<(), OpError> {
    let n = dim(node, "elements", gate.elements())?;
    // The kernel reads its element count from a buffer.
    let params = cx.arena.upload(&[n], MlxDType::U32)?;
    dispatch_silu_mul(
        cx.enc,
        &mut cx.registry,
        cx.device.metal_device(),
        &gate.view(MlxDType::F32)?,
        &up.view(MlxDType::F32)?,
        &out.view(MlxDType::F32)?,
        &params,
        n,
    )
    .map_err(mlx_error(node, "silu_mul_f32"))
}
