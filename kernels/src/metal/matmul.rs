//! `MatMul`: `y = x @ w^T` with f32 activations on every route (low
//! precision activations arrive as their exact f32 image, see the module
//! docs of `metal`).
//!
//! | weights | kernel |
//! |---|---|
//! | Q4_0, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K | mlx-native `quantized_matmul_ggml` (`kernel_mul_mv_*_f32` for few rows, `kernel_mul_mm_*` for many) |
//! | Q4_1 | weft `weft_mul_mv_q4_1_f32` (mlx-native has no Q4_1 kernel) |
//! | F32, F16, BF16 with k >= 32 | mlx-native `dense_matmul_{f32,f16,bf16}_f32_tensor` |
//! | F32, F16, BF16 with k < 32 | weft `weft_mul_mv_dense_f32` |

use super::{dim, mlx_error, unsupported, Ctx, MetalTensor, MlxDType, NodeAux, Route};
use bytemuck::{Pod, Zeroable};
use mlx_native::ops::dense_mm_bf16::{dense_matmul_bf16_f32_tensor, DenseMmBf16F32Params};
use mlx_native::ops::dense_mm_f16::{dense_matmul_f16_f32_tensor, DenseMmF16F32Params};
use mlx_native::ops::dense_mm_f32_f32::{dense_matmul_f32_f32_tensor, DenseMmF32F32Params};
use mlx_native::ops::quantized_matmul_ggml::{
    quantized_matmul_ggml, GgmlQuantizedMatmulParams, GgmlType,
};
use mlx_native::{KernelArg, MTLSize, MlxBuffer};
use weft_ops::{DType, OpError, OpNode, Tensor};

/// mlx-native's dense kernels tile k by 32.
const DENSE_MIN_K: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct MulMvParams {
    x_rows: u32,
    w_rows: u32,
    k: u32,
    w_row_bytes: u32,
    dtype: u32,
}

/// mlx-native's GGML type for a weft weight type it has kernels for.
fn ggml_type(t: DType) -> Option<GgmlType> {
    Some(match t {
        DType::Q4_0 => GgmlType::Q4_0,
        DType::Q5_0 => GgmlType::Q5_0,
        DType::Q5_1 => GgmlType::Q5_1,
        DType::Q8_0 => GgmlType::Q8_0,
        DType::Q2_K => GgmlType::Q2_K,
        DType::Q3_K => GgmlType::Q3_K,
        DType::Q4_K => GgmlType::Q4_K,
        DType::Q5_K => GgmlType::Q5_K,
        DType::Q6_K => GgmlType::Q6_K,
        _ => return None,
    })
}

pub(super) fn route(node: &OpNode, x: &Tensor, w: &Tensor) -> Result<Route, OpError> {
    if x.dtype != DType::F32 && !super::rows::ACTIVATION_TYPES.contains(&x.dtype) {
        return Err(unsupported(node, format!("{} activations", x.dtype)));
    }
    if ggml_type(w.dtype).is_some() {
        return Ok(Route::MlxNative("quantized_matmul_ggml"));
    }
    Ok(match w.dtype {
        DType::Q4_1 => {
            if !w.offset.is_multiple_of(4) {
                return Err(unsupported(
                    node,
                    format!(
                        "Q4_1 weights at byte offset {} (needs 4-byte alignment)",
                        w.offset
                    ),
                ));
            }
            Route::Weft("weft_mul_mv_q4_1_f32")
        }
        DType::F32 | DType::F16 | DType::BF16 if x.cols() < DENSE_MIN_K => {
            Route::Weft("weft_mul_mv_dense_f32")
        }
        DType::F32 => Route::MlxNative("hf2q_dense_mm_f32_f32"),
        DType::F16 => Route::MlxNative("hf2q_dense_mm_f16_f32"),
        DType::BF16 => Route::MlxNative("hf2q_dense_mm_bf16_f32"),
        other => return Err(unsupported(node, format!("{other} weights"))),
    })
}

pub(super) fn matmul(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    x: &MetalTensor,
    w: &MetalTensor,
    y: &MetalTensor,
    aux: &NodeAux,
) -> Result<(), OpError> {
    let x32 = match (x.tensor.dtype, &aux.x_f32) {
        (DType::F32, _) => x.view(MlxDType::F32)?,
        (_, Some(image)) => image.clone(),
        (t, None) => {
            return Err(unsupported(
                node,
                format!("{t} activations without their f32 image (the runtime encodes a prologue)"),
            ))
        }
    };
    let m = dim(node, "rows", x.tensor.rows())?;
    let n = dim(node, "weight rows", w.tensor.rows())?;
    let k = dim(node, "k", x.tensor.cols())?;
    let out = y.view(MlxDType::F32)?;
    let route = route(node, &x.tensor, &w.tensor)?;
    let kernel = match route {
        Route::MlxNative(k) | Route::Weft(k) => k,
    };
    if let Some(ggml) = ggml_type(w.tensor.dtype) {
        let params = GgmlQuantizedMatmulParams {
            m,
            n,
            k,
            ggml_type: ggml,
        };
        return quantized_matmul_ggml(
            cx.enc,
            &mut cx.registry,
            cx.device,
            &x32,
            &w.bytes()?,
            &out,
            &params,
        )
        .map_err(mlx_error(node, kernel));
    }
    match route {
        Route::Weft("weft_mul_mv_q4_1_f32") => {
            let params = mv_params(node, m, n, k, &w.tensor)?;
            let wb = w.bytes()?;
            cx.weft(
                kernel,
                &bindings(&wb, &x32, &out, &params),
                MTLSize::new(u64::from(n).div_ceil(4), u64::from(m).div_ceil(4), 1),
                MTLSize::new(64, 1, 1),
            )
        }
        Route::Weft(_) => {
            let params = mv_params(node, m, n, k, &w.tensor)?;
            let wb = w.bytes()?;
            cx.weft(
                kernel,
                &bindings(&wb, &x32, &out, &params),
                MTLSize::new(u64::from(n), u64::from(m), 1),
                MTLSize::new(32, 1, 1),
            )
        }
        Route::MlxNative(_) => dense(cx, node, &x32, w, &out, (m, n, k), kernel),
    }
}

fn mv_params(node: &OpNode, m: u32, n: u32, k: u32, w: &Tensor) -> Result<MulMvParams, OpError> {
    Ok(MulMvParams {
        x_rows: m,
        w_rows: n,
        k,
        w_row_bytes: dim(node, "weight row bytes", w.row_bytes())?,
        dtype: w.dtype.ggml_id(),
    })
}

fn bindings<'a>(
    w: &'a MlxBuffer,
    x: &'a MlxBuffer,
    y: &'a MlxBuffer,
    params: &'a MulMvParams,
) -> [(u64, KernelArg<'a>); 4] {
    [
        (0, KernelArg::Buffer(w)),
        (1, KernelArg::Buffer(x)),
        (2, KernelArg::Buffer(y)),
        (3, KernelArg::Bytes(bytemuck::bytes_of(params))),
    ]
}

/// mlx-native's dense f32/f16/bf16 x f32 kernels (one batch).
fn dense(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    x32: &MlxBuffer,
    w: &MetalTensor,
    out: &MlxBuffer,
    (m, n, k): (u32, u32, u32),
    kernel: &'static str,
) -> Result<(), OpError> {
    let (enc, reg, dev) = (&mut *cx.enc, &mut *cx.registry, cx.device);
    let result = match w.tensor.dtype {
        DType::F32 => {
            let p = DenseMmF32F32Params {
                m,
                n,
                k,
                src0_batch: 1,
                src1_batch: 1,
            };
            dense_matmul_f32_f32_tensor(enc, reg, dev, &w.view(MlxDType::F32)?, x32, out, &p)
        }
        DType::F16 => {
            let p = DenseMmF16F32Params {
                m,
                n,
                k,
                src0_batch: 1,
                src1_batch: 1,
            };
            dense_matmul_f16_f32_tensor(enc, reg, dev, &w.view(MlxDType::F16)?, x32, out, &p)
        }
        DType::BF16 => {
            let p = DenseMmBf16F32Params {
                m,
                n,
                k,
                src0_batch: 1,
                src1_batch: 1,
            };
            dense_matmul_bf16_f32_tensor(enc, reg, dev, &w.view(MlxDType::BF16)?, x32, out, &p)
        }
        other => return Err(unsupported(node, format!("{other} weights"))),
    };
    result.map_err(mlx_error(node, kernel))
}
