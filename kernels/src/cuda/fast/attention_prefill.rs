//! Flash attention on the tensor cores for prefill (fast/attention_prefill.cu):
//! [`MIN_ROWS`] or more query rows over an f16 cache, head sizes 64 and
//! 128, an f32 output, on a device whose blocks can take its shared memory
//! ([`shared_bytes`]); other prefills take the exact tiled kernel.

use super::super::attention::AttnArgs;
use super::super::launch::{bad_call, check_aligned, launch as enqueue, Arg};
use super::super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::{AttentionParams, DType, OpError};

pub(in crate::cuda) const KERNELS: &[&str] = &["attn_prefill_f16_d64", "attn_prefill_f16_d128"];

/// Fewest query rows the kernel takes (a block's 64 rows are 16 per warp).
pub(in crate::cuda) const MIN_ROWS: usize = 16;
/// Query rows per block (`FP_ROWS`) and threads (`FP_THREADS`).
const ROWS: usize = 64;
const THREADS: u32 = 128;
/// Cells per tile (`FP_CELLS`).
const CELLS: usize = 64;

/// Whether the kernel takes `rows` query rows of `p` over `kv` keys and
/// values into an `out` output.
pub(in crate::cuda) fn takes(p: &AttentionParams, rows: usize, kv: DType, out: DType) -> bool {
    rows >= MIN_ROWS
        && matches!(p.head_dim, 64 | 128)
        && kv == DType::F16
        && out == DType::F32
        && p.kv_heads > 0
        && p.heads.is_multiple_of(p.kv_heads)
}

/// Dynamic shared memory: two stages of key and value tiles, rows padded
/// by 16 bytes (`FpLayout`).
pub(in crate::cuda) fn shared_bytes(head_dim: usize) -> usize {
    2 * 2 * CELLS * (head_dim + 8) * 2
}

/// Enqueues the kernel for `args.n` query rows at `q`.
///
/// # Safety
/// As [`CudaKernels::launch`]: every pointer covers what the grid touches.
#[allow(clippy::too_many_arguments)]
pub(in crate::cuda) unsafe fn launch(
    kernels: &CudaKernels,
    stream: &CudaStream,
    op: &'static str,
    p: &AttentionParams,
    args: AttnArgs,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    out: &DeviceTensor,
    step: u64,
) -> Result<(), OpError> {
    check_aligned(op, q, 8)?;
    check_aligned(op, k, 16)?;
    check_aligned(op, v, 16)?;
    check_aligned(op, out, 8)?;
    let n = q.tensor.rows();
    let bytes = shared_bytes(p.head_dim);
    if bytes > kernels.large_shared_limit {
        return Err(bad_call(
            op,
            format!(
                "head size {} needs {bytes} bytes of shared memory per block",
                p.head_dim
            ),
        ));
    }
    let f = kernels
        .fns
        .get(op, &format!("attn_prefill_f16_d{}", p.head_dim))?;
    enqueue(
        stream,
        f,
        (n.div_ceil(ROWS) as u32, p.heads as u32, 1),
        THREADS,
        bytes as u32,
        &[
            Arg::Ptr(q.ptr),
            Arg::Ptr(k.ptr),
            Arg::Ptr(v.ptr),
            Arg::Ptr(out.ptr),
            Arg::Attn(args),
            Arg::Ptr(step),
        ],
        op,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_long_f16_prefills_of_two_head_sizes() {
        let p = AttentionParams {
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            scale: 0.125,
            q_position: 0,
            window: None,
            ring: None,
            softcap: 0.0,
            kv_capacity: 0,
            flash: true,
        };
        assert!(takes(&p, 512, DType::F16, DType::F32));
        assert!(!takes(&p, 8, DType::F16, DType::F32));
        assert!(!takes(&p, 512, DType::F32, DType::F32));
        assert!(!takes(&p, 512, DType::F16, DType::Q8_1));
        assert!(!takes(
            &AttentionParams { head_dim: 256, ..p },
            512,
            DType::F16,
            DType::F32
        ));
        assert_eq!(shared_bytes(128), 69_632);
    }
}
