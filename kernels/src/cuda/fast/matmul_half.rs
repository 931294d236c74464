//! Half-precision prefill products on the tensor cores
//! (fast/matmul_half.cu): f16 and bf16 weights against activations in the
//! weights' type, f16/bf16 `mma.sync` with f32 accumulators, for products
//! of [`MIN_TOKENS`] or more activation rows. Decode products keep the
//! exact kernels, which read the weights at memory speed.

use super::super::launch::bad_call;
use super::super::{CudaKernels, DeviceTensor};
use super::matmul::{enqueue_tiles, Product};
use cudarc::driver::CudaStream;
use weft_ops::{DType, OpError};

pub(in crate::cuda) const KERNELS: &[&str] =
    &["mh_f16_r64", "mh_f16_r32", "mh_bf16_r64", "mh_bf16_r32"];

/// Fewest activation rows the tensor-core product takes (as the quantized
/// one, [`super::matmul::MIN_TOKENS`]).
pub(in crate::cuda) const MIN_TOKENS: usize = super::matmul::MIN_TOKENS;

/// Tokens per block (`MH_TOKENS`; threads per block, `MH_THREADS`, are
/// the quantized product's), columns per stage (`MH_KS`) and halves per
/// shared row (`MH_STRIDE`).
const TOKENS: usize = 64;
const STAGE_COLUMNS: usize = 64;
const STRIDE_HALVES: usize = STAGE_COLUMNS + 8;

/// The kernel-name part of a weight format the product takes.
fn format_name(w: DType) -> Option<&'static str> {
    match w {
        DType::F16 => Some("f16"),
        DType::BF16 => Some("bf16"),
        _ => None,
    }
}

/// Whether the tensor-core product takes `n` activation rows of `k`
/// columns against `w` weights at these addresses (16-byte aligned rows of
/// whole stages).
/// A product of long rows whose grid would leave most multiprocessors idle
/// (few weight rows, more than [`LONG_ROWS`] columns: DeepSeek-V4's
/// 24 x 16,384 mixer) keeps the exact kernel, which splits its rows finer
/// and is the faster of the two there (docs/performance.md).
pub(in crate::cuda) fn takes(w: &DeviceTensor, act: u64, n: usize, k: usize, sms: usize) -> bool {
    let m = w.tensor.rows();
    n >= MIN_TOKENS
        && format_name(w.tensor.dtype).is_some()
        && k > 0
        && k.is_multiple_of(STAGE_COLUMNS)
        && w.ptr.is_multiple_of(16)
        && act.is_multiple_of(16)
        && (k <= LONG_ROWS || 2 * m.div_ceil(32) * n.div_ceil(TOKENS) >= sms)
}

/// Columns past which a product on a grid under half the device keeps the
/// exact kernel ([`takes`]).
const LONG_ROWS: usize = 4096;

/// Weight rows per block: 64 when that still gives every multiprocessor
/// two blocks, else 32.
fn tile_rows(m: usize, n: usize, sms: usize) -> usize {
    if m.div_ceil(64) * n.div_ceil(TOKENS) >= 2 * sms {
        64
    } else {
        32
    }
}

/// Shared memory of a block of `rows` weight rows: two stages of token and
/// weight rows.
fn shared_bytes(rows: usize) -> usize {
    2 * (TOKENS + rows) * STRIDE_HALVES * 2
}

/// Enqueues `out = act @ w^T` for the activations of `p` (the weights'
/// type); the caller checked [`takes`].
///
/// # Safety
/// As [`CudaKernels::launch`]: `p.act` and `p.out` cover `p.n` rows.
pub(in crate::cuda) unsafe fn launch(
    kernels: &CudaKernels,
    stream: &CudaStream,
    op: &'static str,
    w: &DeviceTensor,
    p: &Product,
) -> Result<(), OpError> {
    let Some(name) = format_name(w.tensor.dtype) else {
        return Err(bad_call(
            op,
            format!(
                "no half-precision tensor-core product of {} weights",
                w.tensor.dtype
            ),
        ));
    };
    let rows = tile_rows(p.m, p.n, kernels.sms);
    enqueue_tiles(
        kernels,
        stream,
        op,
        &format!("mh_{name}_r{rows}"),
        (rows, TOKENS),
        shared_bytes(rows),
        (w, p),
        &[],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fill_the_device_and_fit_its_shared_memory() {
        // DeepSeek-V4's indexer query matrix and hyper-connection mixer at
        // 512 tokens on 132 multiprocessors.
        assert_eq!(tile_rows(8192, 512, 132), 64);
        assert_eq!(tile_rows(24, 512, 132), 32);
        assert!(shared_bytes(64) <= 48 * 1024);
        assert_eq!(shared_bytes(64), 36_864);
        assert!(KERNELS.contains(&"mh_bf16_r32"));
        // The mixer's grid (8 blocks) is too small; a compressor's is not.
        assert!(2 * 24usize.div_ceil(32) * 512usize.div_ceil(TOKENS) < 132);
        assert!(2 * 1024usize.div_ceil(32) * 512usize.div_ceil(TOKENS) >= 132);
    }
}
