//! Quantized prefill products on the tensor cores (fast/matmul.cu): int8
//! `mma.sync` over 32-element chunks of codes with per-chunk scales, for
//! products of [`MIN_TOKENS`] or more activation rows. Decode products (one
//! row) keep the exact matvecs, which read the weights at memory speed.

use super::super::launch::{bad_call, launch as enqueue, Arg};
use super::super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::{DType, OpError};

/// The tile shapes of fast/matmul.cu, largest first: (name part, weight
/// rows, tokens) per block of four warps.
const TILES: [(&str, usize, usize); 3] = [("w2n4", 64, 64), ("w2n2", 64, 32), ("w1n1", 32, 32)];

macro_rules! tile_names {
    ($($f:literal),*) => {
        &[$(concat!("mq_", $f, "_w2n4"), concat!("mq_", $f, "_w2n2"), concat!("mq_", $f, "_w1n1")),*]
    };
}

pub(in crate::cuda) const KERNELS: &[&str] =
    tile_names!("q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k");

/// Fewest activation rows the tensor-core product takes: below this a
/// product reads its weights about as often as the exact kernels do, and
/// those are tuned for few rows.
pub(in crate::cuda) const MIN_TOKENS: usize = 16;

/// Threads per block (`MQ_THREADS`).
pub(in crate::cuda) const THREADS: u32 = 128;
/// 32-element chunks per stage (`MQ_KC`) and words per tile row
/// (`MQ_STRIDE`).
const CHUNKS: usize = 4;
const STRIDE_WORDS: usize = CHUNKS * 8 + 4;

/// The kernel-name part of a weight format the tensor-core product takes.
pub(in crate::cuda) fn format_name(w: DType) -> Option<&'static str> {
    Some(match w {
        DType::Q4_0 => "q4_0",
        DType::Q4_1 => "q4_1",
        DType::Q5_0 => "q5_0",
        DType::Q8_0 => "q8_0",
        DType::Q4_K => "q4_k",
        DType::Q6_K => "q6_k",
        _ => return None,
    })
}

/// Whether the tensor-core product takes `n` activation rows of `k`
/// columns against `w` weights (activations in the weights' dot type).
pub(in crate::cuda) fn takes(w: DType, n: usize, k: usize) -> bool {
    n >= MIN_TOKENS && format_name(w).is_some() && k.is_multiple_of(32) && k > 0
}

/// The largest tile that still gives every multiprocessor work: (name
/// part, rows, tokens).
fn tile(m: usize, n: usize, sms: usize) -> (&'static str, usize, usize) {
    let blocks = |t: &(&str, usize, usize)| m.div_ceil(t.1) * n.div_ceil(t.2);
    if blocks(&TILES[0]) >= 2 * sms {
        TILES[0]
    } else if blocks(&TILES[1]) >= sms {
        TILES[1]
    } else {
        TILES[2]
    }
}

/// Shared memory of a tile: two stages of codes and scale slots (two per
/// chunk, Q2_K's expert products four).
pub(in crate::cuda) fn shared_bytes(rows: usize, tokens: usize, slots: usize) -> usize {
    2 * (rows + tokens) * (STRIDE_WORDS * 4 + CHUNKS * 4 * slots)
}

/// Enqueues `out = act @ w^T` for the activations of `p` (the weights' dot
/// type).
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
            format!("no tensor-core product of {} weights", w.tensor.dtype),
        ));
    };
    let (part, rows, tokens) = tile(p.m, p.n, kernels.sms);
    enqueue_tiles(
        kernels,
        stream,
        op,
        &format!("mq_{name}_{part}"),
        (rows, tokens),
        shared_bytes(rows, tokens, 2),
        (w, p),
        &[Arg::I32(w.constant as i32)],
    )
}

/// The operands of `out = act @ w^T` besides the weights: device
/// addresses of the activations and the output, `m` weight rows, `n`
/// activation rows, `k` columns.
pub(in crate::cuda) struct Product {
    pub act: u64,
    pub out: u64,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// Enqueues tile kernel `kernel` of the tensor-core products over a grid
/// of (weight-row tiles, token tiles) for `tile = (rows, tokens)`, with
/// arguments `(w, act, out, m, n, k, extra...)`.
///
/// # Safety
/// As [`CudaKernels::launch`]: the operands cover their rows.
#[allow(clippy::too_many_arguments)]
pub(in crate::cuda) unsafe fn enqueue_tiles(
    kernels: &CudaKernels,
    stream: &CudaStream,
    op: &'static str,
    kernel: &str,
    (rows, tokens): (usize, usize),
    shared: usize,
    (w, p): (&DeviceTensor, &Product),
    extra: &[Arg],
) -> Result<(), OpError> {
    let grid_y = p.n.div_ceil(tokens);
    if grid_y > 65_535 || i32::try_from(p.k).is_err() || i32::try_from(p.m).is_err() {
        return Err(bad_call(
            op,
            format!("{} x {} x {} exceeds one launch", p.n, p.m, p.k),
        ));
    }
    let f = kernels.fns.get(op, kernel)?;
    let mut args = vec![
        Arg::Ptr(w.ptr),
        Arg::Ptr(p.act),
        Arg::Ptr(p.out),
        Arg::I32(p.m as i32),
        Arg::I32(p.n as i32),
        Arg::I32(p.k as i32),
    ];
    args.extend_from_slice(extra);
    enqueue(
        stream,
        f,
        (p.m.div_ceil(rows) as u32, grid_y as u32, 1),
        THREADS,
        shared as u32,
        &args,
        op,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fill_the_device_and_fit_its_shared_memory() {
        // SmolLM2's prefill of 512 tokens on 132 multiprocessors.
        assert_eq!(tile(576, 512, 132).0, "w2n2");
        assert_eq!(tile(1536, 512, 132).0, "w2n2");
        assert_eq!(tile(4096, 4096, 132).0, "w2n4");
        assert_eq!(tile(576, 16, 132).0, "w1n1");
        for (_, rows, tokens) in TILES {
            assert!(shared_bytes(rows, tokens, 2) <= 48 * 1024);
        }
        assert_eq!(shared_bytes(64, 64, 2), 45_056);
        assert!(KERNELS.contains(&"mq_q6_k_w1n1"));
        assert!(takes(DType::Q4_K, 16, 256) && !takes(DType::Q4_K, 15, 256));
        assert!(!takes(DType::F16, 512, 256));
    }
}
