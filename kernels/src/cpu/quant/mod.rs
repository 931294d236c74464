//! Quantized (and plain float) dot products and matmul kernels for the CPU.
//!
//! What this module owns: the fast versions of the products defined in
//! `weft_ops::quant` — activation quantizers, weight-row x activation-row
//! dot products, and the matmul micro-kernels the runtime calls, one call
//! per thread with a range of weight rows. How the runtime splits work and
//! where tensors live is not its business.
//!
//! **Numerics.** Every path (scalar, AVX2, AVX-512) computes the same bits:
//! the order of ggml's x86 CPU backend (`scalar.rs` spells it out), so
//! weft's logits match llama.cpp's bit for bit where the inputs do. The
//! activation quantizers match `weft_ops::quant::quantize_row` bit for bit.
//!
//! **Paths.** [`Isa::detect`] picks the best supported path once (capped by
//! `WEFT_CPU_ISA`); every entry point has a `_with` variant taking an
//! explicit [`Isa`] so tests and benchmarks can force a path.
//!
//! **Entry points for the runtime.**
//! - [`quantize_activations`]: one f32 row into `vec_dot_type(w)` format.
//! - [`matmul`]: `out[t][r] = w_row(r) . act_row(t)` for the weight rows
//!   `out.cols()` and all `n` activation rows; [`OutColumns::split_at`]
//!   gives each thread its own rows.
//! - [`matmul_rows`]: the same on the executor's [`HostTensor`]s.
//! - [`vec_dot`]: one weight row against one activation row
//!   ([`vec_dot_in_order_with`]: in a given K-quant order).
//!
//! **Orders.** Q4_K and Q6_K products are summed in the order llama.cpp's
//! CPU backend picks for the call (`ggml_vec_dot`, the repacked Q4_K
//! gemv/gemm, the tiled matmul), from the weight's row count, the number of
//! activation rows and the row index: [`DotOrder`] (`order.rs`).
//!
//! Files: `isa.rs` (detection), `order.rs` (the K-quant orders),
//! `formats.rs` (format descriptions),
//! `scalar.rs` (the specification and fallback), `avx2.rs`,
//! `avx512_b32.rs` (32-element formats: decode matvec and prefill gemm),
//! `avx512_kq.rs` / `avx512_kq_mv.rs` (Q4_K, Q6_K prefill / decode),
//! `avx512_float.rs` (F32, F16, BF16 decode), `float_gemm.rs` (their
//! prefill, in ggml's tinyBLAS order),
//! `activation.rs` (quantizers),
//! `matmul.rs` (the driver and output views).

// The SIMD paths use `core::arch::x86_64`; elsewhere only the scalar path
// exists (`Isa::best_supported` is `Scalar` and `Isa::checked` refuses the
// others), with the same results.
#[cfg(target_arch = "x86_64")]
mod activation;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512_b32;
#[cfg(target_arch = "x86_64")]
mod avx512_b32_mv;
#[cfg(target_arch = "x86_64")]
mod avx512_float;
#[cfg(target_arch = "x86_64")]
mod avx512_kq;
#[cfg(target_arch = "x86_64")]
mod avx512_kq_mv;
mod float_gemm;
mod formats;
mod isa;
mod matmul;
mod order;
mod scalar;

pub use isa::{Isa, ISA_ENV};
pub use matmul::OutColumns;
pub use order::DotOrder;
// When llama.cpp takes tinyBLAS's order, also for attention with flash
// attention off (its score and value matmuls).
pub(crate) use float_gemm::{applies as tinyblas_applies, dot_f16 as tinyblas_dot_f16};

use super::HostTensor;
use std::ops::Range;
use weft_ops::quant::vec_dot_type;
use weft_ops::{DType, OpError};

/// Weight formats the fast kernels compute with. [`REFERENCE_WEIGHTS`] are
/// multiplied too, at reference speed; `matmul` refuses others with
/// `OpError::Unsupported` (`weft_ops::quant` may still decode them).
pub const SUPPORTED_WEIGHTS: [DType; 10] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q6_K,
];

/// Weight formats `matmul` multiplies with `weft_ops::quant`'s reference
/// dot product (ggml's generic C order), row by row: correct but slow.
pub const REFERENCE_WEIGHTS: [DType; 3] = [DType::Q2_K, DType::Q3_K, DType::Q5_K];

/// Quantizes (or converts) one f32 row into `dtype` (Q8_0, Q8_1, Q8_K,
/// F16, BF16 or F32), bit-identical to `weft_ops::quant::quantize_row`.
pub fn quantize_activations(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), OpError> {
    quantize_activations_with(Isa::detect()?, dtype, src, dst)
}

/// [`quantize_activations`] on an explicit path.
pub fn quantize_activations_with(
    isa: Isa,
    dtype: DType,
    src: &[f32],
    dst: &mut [u8],
) -> Result<(), OpError> {
    let isa = isa.checked()?;
    let need = dtype.row_bytes(src.len());
    if need != Some(dst.len()) {
        return Err(OpError::Param {
            op: "quantize",
            message: format!(
                "{} values of {dtype} need {need:?} bytes, the output has {}",
                src.len(),
                dst.len()
            ),
        });
    }
    match (isa, dtype) {
        (Isa::Scalar, _) | (_, DType::F32) => weft_ops::quant::quantize_row(dtype, src, dst),
        // SAFETY (all arms below): the path's CPU features are present
        // (`checked`) and the lengths match (checked above).
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, DType::Q8_0 | DType::Q8_1) => {
            unsafe { activation::q8_blocks_avx512(src, dst, dtype == DType::Q8_1) };
            Ok(())
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, DType::Q8_0 | DType::Q8_1) => {
            unsafe { activation::q8_blocks_avx2(src, dst, dtype == DType::Q8_1) };
            Ok(())
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, DType::Q8_K) => {
            unsafe { activation::q8k_blocks_avx512(src, dst) };
            Ok(())
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, DType::Q8_K) => {
            unsafe { activation::q8k_blocks_avx2(src, dst) };
            Ok(())
        }
        #[cfg(target_arch = "x86_64")]
        (_, DType::F16) => {
            unsafe { activation::f16_avx2(src, dst) };
            Ok(())
        }
        #[cfg(target_arch = "x86_64")]
        (_, DType::BF16) => {
            unsafe { activation::bf16_avx2(src, dst) };
            Ok(())
        }
        _ => weft_ops::quant::quantize_row(dtype, src, dst),
    }
}

/// Whether a matmul of `batch` activation rows over `wdtype` weights of
/// `weight_rows` rows of `k` elements sums every activation row in the
/// order a one-row call sums it: then one step over the rows of `batch`
/// independent sequences gives each of them the bits it gets alone. True
/// for every 32-element format; for Q4_K and Q6_K only below the batch
/// sizes where llama.cpp switches kernels ([`DotOrder::of`]), and for
/// float weights only where tinyBLAS takes neither call.
pub fn batch_keeps_row_order(wdtype: DType, weight_rows: usize, k: usize, batch: usize) -> bool {
    let alone = DotOrder::of(wdtype, weight_rows, 1, 0);
    float_gemm::applies(wdtype, k, weight_rows, batch)
        == float_gemm::applies(wdtype, k, weight_rows, 1)
        && (0..batch).all(|t| DotOrder::of(wdtype, weight_rows, batch, t) == alone)
}

/// `w_row . act_row`, where `act_row` is in `vec_dot_type(wdtype)` format,
/// in ggml's `vec_dot` order ([`DotOrder::VecDot`]; a matmul may sum Q4_K
/// and Q6_K products in another order, see [`DotOrder::of`]).
pub fn vec_dot(wdtype: DType, w_row: &[u8], act_row: &[u8]) -> Result<f32, OpError> {
    vec_dot_with(Isa::detect()?, wdtype, w_row, act_row)
}

/// [`vec_dot`] on an explicit path.
pub fn vec_dot_with(isa: Isa, wdtype: DType, w_row: &[u8], act_row: &[u8]) -> Result<f32, OpError> {
    let k = weft_ops::quant::row_elements(wdtype, w_row.len(), "vec_dot")?;
    let adtype = vec_dot_type(wdtype);
    if adtype.row_bytes(k) != Some(act_row.len()) {
        return Err(OpError::Param {
            op: "vec_dot",
            message: format!(
                "a row of {k} {wdtype} weights needs {:?} bytes of {adtype}, got {}",
                adtype.row_bytes(k),
                act_row.len()
            ),
        });
    }
    let mut out = [0f32];
    let mut view = OutColumns::new(&mut out, 1, 1)?;
    matmul_with(isa, wdtype, w_row, k, act_row, 1, &mut view)?;
    Ok(out[0])
}

/// `w_row . act_row` summed in `order`. Every format has
/// [`DotOrder::VecDot`] (that is [`vec_dot_with`]); the other orders exist
/// for Q4_K (all) and Q6_K ([`DotOrder::Tiled`]) and are refused for the
/// rest. [`matmul`] gives the same bits as this with the order
/// [`DotOrder::of`] picks.
pub fn vec_dot_in_order_with(
    isa: Isa,
    order: DotOrder,
    wdtype: DType,
    w_row: &[u8],
    act_row: &[u8],
) -> Result<f32, OpError> {
    let exists = match wdtype {
        DType::Q4_K => true,
        DType::Q6_K => matches!(order, DotOrder::VecDot | DotOrder::Tiled),
        _ => order == DotOrder::VecDot,
    };
    if !exists {
        return Err(OpError::Param {
            op: "vec_dot",
            message: format!("{wdtype} weights have no {order:?} order"),
        });
    }
    // Checks the lengths and the path.
    let vec_dot = vec_dot_with(isa, wdtype, w_row, act_row)?;
    if order == DotOrder::VecDot {
        return Ok(vec_dot);
    }
    let (q6, nb) = (wdtype == DType::Q6_K, w_row.len() / wdtype.block_bytes());
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: the path is supported and the lengths were checked above.
        return Ok(unsafe { avx2::dot_kquant(order, q6, w_row.as_ptr(), act_row.as_ptr(), nb) });
    }
    Ok(scalar::dot_kquant(order, q6, w_row, act_row, nb))
}

/// `out[t * stride + r] = w_row(r) . act_row(t)` for `r` in `out.cols()`
/// and `t` in `0..n`: `w` holds the weight matrix (rows of `k` elements in
/// GGUF layout, row `r` at `r * row_bytes`), `act` holds `n` rows of `k`
/// activations in `vec_dot_type(wdtype)` format. The output's row stride
/// is taken to be the weight's row count (it decides, as in ggml, whether
/// float weights take the tinyBLAS order for `n >= 2`, and with `n` which
/// order Q4_K and Q6_K products take: [`DotOrder::of`]).
pub fn matmul(
    wdtype: DType,
    w: &[u8],
    k: usize,
    act: &[u8],
    n: usize,
    out: &mut OutColumns,
) -> Result<(), OpError> {
    matmul_with(Isa::detect()?, wdtype, w, k, act, n, out)
}

/// [`matmul`] on an explicit path.
pub fn matmul_with(
    isa: Isa,
    wdtype: DType,
    w: &[u8],
    k: usize,
    act: &[u8],
    n: usize,
    out: &mut OutColumns,
) -> Result<(), OpError> {
    let problem = matmul::Problem {
        wdtype,
        w,
        k,
        act,
        n,
    };
    matmul::run(isa, &problem, out)
}

/// The executor's entry point: `out = x @ w^T` for weight rows `rows`.
/// `x` is in `vec_dot_type(w)` format, or f32 (then it is converted here,
/// per call, into per-thread scratch).
///
/// # Safety
/// The tensors must point at live memory of their sizes; no other thread
/// may write `x` or `w`, or touch columns `rows` of `out`, during the call.
pub unsafe fn matmul_rows(
    x: &HostTensor,
    w: &HostTensor,
    out: &HostTensor,
    rows: Range<usize>,
) -> Result<(), OpError> {
    let (wdtype, k, n, m) = (
        w.tensor.dtype,
        w.tensor.cols(),
        x.tensor.rows(),
        w.tensor.rows(),
    );
    let wb = w.bytes();
    let mut view = OutColumns::from_raw(out.ptr as *mut f32, n, m, rows)?;
    let adtype = vec_dot_type(wdtype);
    if x.tensor.dtype == adtype {
        return matmul(wdtype, wb, k, x.bytes(), n, &mut view);
    }
    if x.tensor.dtype != DType::F32 {
        return Err(OpError::Param {
            op: "matmul",
            message: format!(
                "{wdtype} weights take {adtype} or f32 activations, got {}",
                x.tensor.dtype
            ),
        });
    }
    let act_row = adtype
        .row_bytes(k)
        .ok_or_else(|| OpError::Shape(format!("k = {k} does not fit {adtype} blocks")))?;
    let xs = x.f32s();
    matmul::with_act_scratch(act_row * n, |buf| {
        for (src, dst) in xs.chunks_exact(k).zip(buf.chunks_exact_mut(act_row)) {
            quantize_activations(adtype, src, dst)?;
        }
        matmul(wdtype, wb, k, buf, n, &mut view)
    })
}

/// One dot product on raw rows (lengths checked by the caller) for the
/// formats without a dedicated matmul kernel on `isa`.
///
/// # Safety
/// `w` and `a` must hold a row of `k` elements of `wdtype` and of its
/// activation format; `isa` must be supported.
unsafe fn dot_raw(isa: Isa, wdtype: DType, w: *const u8, a: *const u8, k: usize) -> f32 {
    let wrow = std::slice::from_raw_parts(w, wdtype.row_bytes(k).unwrap_or(0));
    let arow = std::slice::from_raw_parts(a, vec_dot_type(wdtype).row_bytes(k).unwrap_or(0));
    match (isa, wdtype) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, DType::F32) => avx512_float::dot_f32(w, a, k),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, DType::F32) => avx2::dot_f32(w, a, k),
        (_, DType::F32) => scalar::dot_f32(wrow, arow, k),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, DType::F16) => avx512_float::dot_f16(w, a, k),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, DType::F16) => avx2::dot_f16(w, a, k),
        (_, DType::F16) => scalar::dot_f16(wrow, arow, k),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, DType::BF16) => avx512_float::dot_bf16(w, a, k),
        (_, DType::BF16) => scalar::dot_bf16(wrow, arow, k),
        // `matmul::dispatch` sends only the formats above here.
        _ => f32::NAN,
    }
}

/// The block format description for a 32-element dtype (used by tests).
#[cfg(test)]
fn block32_bytes(dtype: DType) -> Option<usize> {
    use formats::Block32;
    match dtype {
        DType::Q4_0 => Some(formats::Q4_0::BYTES),
        DType::Q4_1 => Some(formats::Q4_1::BYTES),
        DType::Q5_0 => Some(formats::Q5_0::BYTES),
        DType::Q5_1 => Some(formats::Q5_1::BYTES),
        DType::Q8_0 => Some(formats::Q8_0::BYTES),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_agree_with_dtype() {
        for d in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
        ] {
            assert_eq!(block32_bytes(d), Some(d.block_bytes()));
        }
    }

    #[test]
    fn batches_keep_row_order_where_llama_cpp_keeps_its_kernel() {
        let keeps = |d, rows, k, b| batch_keeps_row_order(d, rows, k, b);
        for d in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0] {
            assert!(keeps(d, 576, 576, 64), "{d}");
        }
        // Q4_K with rows a multiple of 8: gemv alone, gemm from 4 rows.
        assert!(keeps(DType::Q4_K, 896, 256, 3));
        assert!(!keeps(DType::Q4_K, 896, 256, 4));
        // Q4_K otherwise and Q6_K: vec_dot below 8 rows, tiled from 8.
        assert!(keeps(DType::Q4_K, 900, 256, 7));
        assert!(!keeps(DType::Q4_K, 900, 256, 8));
        assert!(keeps(DType::Q6_K, 896, 256, 7));
        assert!(!keeps(DType::Q6_K, 896, 256, 8));
        // Plain floats: tinyBLAS from 2 rows, unless the shape rules it out.
        assert!(keeps(DType::F16, 896, 256, 1));
        assert!(!keeps(DType::F16, 896, 256, 2));
        assert!(keeps(DType::F32, 898, 256, 16));
    }
}
