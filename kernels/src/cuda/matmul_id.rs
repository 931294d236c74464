//! The indexed expert matmul (`MatMulId`) on CUDA: `out[i, s*m..(s+1)*m] =
//! W[ids[i, s]] @ x_row(i, s)`, the hot op of DeepSeek-V4's routed experts.
//!
//! One kernel per weight format and tile width (`matmul_id.cu`): a block
//! of 256 threads routes its tile (up to 1 or 4 (token, slot) pairs of one
//! expert) from the ids in device memory, quantizes the tile's activation
//! rows into shared memory and streams its weight rows, 32 per pass, eight
//! lanes per row. Grid: x = ranges of weight rows, y = tiles. Decode (one
//! token, six slots) takes tiles of one pair and about one block per 32 to
//! 64 rows (one wave on an H200); from two pairs per expert on average,
//! tiles of four pairs (each weight load feeds four products) and few row
//! ranges. No scratch: re-quantizing the tile's activation rows per block
//! costs L2 reads (decode: one 16 KiB row per 32 weight rows), not a launch
//! and a round trip. The ids are never read on the host, so a captured graph
//! replays for any routing.
//!
//! **Decode kernels.** Tiles of one pair of Q8_0, Q4_K (m % 8 == 0), Q2_K,
//! IQ2_XXS and MXFP4 weights whose rows are whole 16-byte units (and whole
//! ring slices) take the `_d1` kernels when the weights are 16-byte
//! aligned: each warp streams its four rows through a ring of shared-memory
//! stages filled by 16-byte `cp.async` copies, requested before the
//! activations are quantized, and reads them with wide, conflict-free loads
//! (the first kernels spent most of their issue slots on 2- and 4-byte
//! global loads, their addresses and their latency). Same bits. H200,
//! DeepSeek-V4-Flash decode (Nsight Compute, cold L2): Q8_0 output
//! projection 30.7 -> 14.4 us, Q4_K 24.0 -> 16.7, MXFP4 25.6 -> 17.4, Q2_K
//! 19.4 -> 15.5, IQ2_XXS 24.4 -> 19.6 (2048 x 4096 experts).
//!
//! **Numerics.** The CPU kernel groups the pairs by expert and runs its
//! matmul kernels per group; Q4_K, Q6_K and the float formats pick their
//! float order from the group's size and the pair's rank in it
//! (`cpu/quant/order.rs`, `float_gemm.rs`), Q2_K, IQ2_XXS and MXFP4 take
//! `weft_ops::quant`'s reference dot products. The kernels find each
//! pair's group size and rank on the device and follow the same order, so
//! every supported format gives the CPU's bits. Ids outside `0..experts`
//! give NaN rows (the CPU refuses them). In numerics `fast`, a prefill
//! chunk's product (the experts averaging four pairs or more) takes the
//! grouped tensor-core product of `fast/matmul_id.rs` instead.
//!
//! **Limits.** Formats: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
//! Q6_K, Q2_K, IQ2_XXS, MXFP4 (others, Q3_K and Q5_K among them, are
//! refused). A block's shared memory (the staged activation rows, and four
//! bytes per expert when more than 32 pairs are routed) stays within the
//! default 48 KiB: rows up to about 40,000 values.

use super::fast::matmul_id::Grouped;
use super::launch::{bad_call, check_aligned, check_arity, launch as enqueue, unsupported, Arg};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::{DType, OpError, OpNode};

const OP: &str = "matmul_id";

pub(super) const KERNELS: &[&str] = &[
    "mmid_f32_t1",
    "mmid_f32_t4",
    "mmid_f16_t1",
    "mmid_f16_t4",
    "mmid_bf16_t1",
    "mmid_bf16_t4",
    "mmid_q4_0_t1",
    "mmid_q4_0_t4",
    "mmid_q4_1_t1",
    "mmid_q4_1_t4",
    "mmid_q5_0_t1",
    "mmid_q5_0_t4",
    "mmid_q5_1_t1",
    "mmid_q5_1_t4",
    "mmid_q8_0_t1",
    "mmid_q8_0_t4",
    "mmid_q4_k_t1",
    "mmid_q4_k_t4",
    "mmid_q6_k_t1",
    "mmid_q6_k_t4",
    "mmid_q2_k_t1",
    "mmid_q2_k_t4",
    "mmid_iq2_xxs_t1",
    "mmid_iq2_xxs_t4",
    "mmid_mxfp4_t1",
    "mmid_mxfp4_t4",
    "mmid_q8_0_d1",
    "mmid_q4_k_d1",
    "mmid_q2_k_d1",
    "mmid_iq2_xxs_d1",
    "mmid_mxfp4_d1",
];

/// Threads per block; eight per weight row (`MMID_THREADS`, `MMID_ROWS`).
const THREADS: u32 = 256;
const ROWS_PER_PASS: usize = 32;
/// Pairs up to this many are routed by one warp (`MMID_WARP_ROUTE`); more
/// take the whole block and `4 * experts` bytes of shared counters.
const WARP_ROUTE: usize = 32;
/// Dynamic shared memory a block may take: the default 48 KiB less the
/// static part (tile, counters, the IQ2_XXS grid: under 2.2 KiB).
const SHARED_LIMIT: usize = 48 * 1024 - 2560;
/// Blocks a launch aims for: about the blocks an H200 holds at once (three
/// per SM at up to 80 registers per thread). A launch with few tiles
/// (decode: six) splits the weight rows over more blocks, one or two passes
/// each, in one wave.
const TARGET_BLOCKS: usize = 3 * 132;

/// Dynamic shared memory a decode (`_d1`) block may take: the default 48
/// KiB less its static part (tile, counters, barriers, the IQ2_XXS tables:
/// under 3.3 KiB).
const D1_SHARED_LIMIT: usize = 48 * 1024 - 3584;

/// The decode kernels' formats: (blocks per ring slice, stages, bytes per
/// row in a stage), as `MMID_D*_CFG` in matmul_id_decode.cu.
fn d1_ring(dtype: DType) -> Option<(usize, usize, usize)> {
    Some(match dtype {
        DType::Q8_0 => (16, 2, 544),
        DType::Q4_K => (4, 2, 608),
        DType::Q2_K => (4, 3, 352),
        DType::IQ2_XXS => (8, 2, 544),
        DType::MXFP4 => (32, 2, 544),
        _ => return None,
    })
}

/// The activation format a weight format is multiplied with, as staged.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Float formats read x and convert on the fly.
    Direct,
    /// Q8_0 / Q8_1 blocks repacked: 32 quants each, then the scales (and
    /// sums) as f32.
    Q8 { sums: bool },
    /// Q8_K blocks as they are (292 bytes).
    Q8K,
}

/// Kernel-name part, staged activation format and the weights' alignment.
fn format(dtype: DType) -> Option<(&'static str, Act, u64)> {
    let q8 = Act::Q8 { sums: false };
    let q8_1 = Act::Q8 { sums: true };
    Some(match dtype {
        DType::F32 => ("f32", Act::Direct, 4),
        DType::F16 => ("f16", Act::Direct, 2),
        DType::BF16 => ("bf16", Act::Direct, 2),
        DType::Q4_0 => ("q4_0", q8, 2),
        DType::Q4_1 => ("q4_1", q8_1, 4),
        DType::Q5_0 => ("q5_0", q8, 2),
        DType::Q5_1 => ("q5_1", q8_1, 4),
        DType::Q8_0 => ("q8_0", q8, 2),
        DType::Q4_K => ("q4_k", Act::Q8K, 4),
        DType::Q6_K => ("q6_k", Act::Q8K, 2),
        DType::Q2_K => ("q2_k", Act::Q8K, 4),
        DType::IQ2_XXS => ("iq2_xxs", Act::Q8K, 2),
        // Any alignment: the kernel reads aligned words around each block.
        DType::MXFP4 => ("mxfp4", Act::Q8 { sums: false }, 1),
        _ => return None,
    })
}

/// Shared bytes of one staged activation row of `k` values.
fn act_stride(act: Act, k: usize) -> usize {
    let bytes = match act {
        Act::Direct => 0,
        Act::Q8 { sums: false } => k / 32 * 36,
        Act::Q8 { sums: true } => k / 32 * 40,
        Act::Q8K => k / 256 * 292,
    };
    bytes.next_multiple_of(16)
}

/// How one node is launched.
struct Plan {
    kernel: String,
    grid: (u32, u32, u32),
    shared: usize,
    rows_per_block: usize,
    astride: usize,
    experts: usize,
    m: usize,
    k: usize,
    pairs: usize,
    slots: usize,
    x_per_pair: bool,
    row_bytes: usize,
    align: u64,
    /// The decode kernel (name, dynamic shared bytes, activation stride),
    /// taken when the weights are 16-byte aligned.
    d1: Option<(String, usize, usize)>,
}

fn plan(node: &OpNode) -> Result<Plan, OpError> {
    if node.inputs.len() != 3 || node.outputs.len() != 1 {
        return Err(bad_call(
            OP,
            format!(
                "expected 3 inputs (x, experts, ids) and 1 output, got {} and {}",
                node.inputs.len(),
                node.outputs.len()
            ),
        ));
    }
    let (x, w, ids, out) = (
        &node.inputs[0],
        &node.inputs[1],
        &node.inputs[2],
        &node.outputs[0],
    );
    if x.dtype != DType::F32 || ids.dtype != DType::I32 || out.dtype != DType::F32 {
        return Err(unsupported(
            OP,
            format!(
                "{} activations, {} ids, {} output (f32, i32, f32)",
                x.dtype, ids.dtype, out.dtype
            ),
        ));
    }
    let (name, act, align) =
        format(w.dtype).ok_or_else(|| unsupported(OP, format!("{} expert weights", w.dtype)))?;
    let dims = w.shape.dims();
    if dims.len() != 3 {
        return Err(bad_call(OP, format!("expert weights {:?} (3-D)", w.shape)));
    }
    let (experts, m, k) = (dims[0], dims[1], dims[2]);
    let (n, slots) = (ids.rows(), ids.cols());
    let pairs = n * slots;
    let row_bytes = w
        .dtype
        .row_bytes(k)
        .ok_or_else(|| bad_call(OP, format!("rows of {k} are not whole {} blocks", w.dtype)))?;
    if x.cols() != k || (x.rows() != n && x.rows() != pairs) || out.shape.elements() != pairs * m {
        return Err(bad_call(
            OP,
            format!(
                "x {:?}, experts {:?}, ids {:?} cannot give {:?}",
                x.shape, w.shape, ids.shape, out.shape
            ),
        ));
    }
    let limit = |what: String| unsupported(OP, what);
    if [m, k, experts, pairs, x.rows()]
        .iter()
        .any(|&v| v > i32::MAX as usize)
        || m.checked_mul(row_bytes)
            .and_then(|b| b.checked_mul(experts))
            .is_none()
    {
        return Err(limit(format!("sizes of {:?} x {:?}", w.shape, ids.shape)));
    }
    let astride = act_stride(act, k);
    let route = if pairs > WARP_ROUTE { 4 * experts } else { 0 };
    // Four pairs per tile once the experts average two pairs or more.
    let mut tt = if pairs >= 2 * experts { 4 } else { 1 };
    if tt * astride + route > SHARED_LIMIT {
        tt = 1;
    }
    let shared = tt * astride + route;
    if shared > SHARED_LIMIT {
        return Err(limit(format!(
            "rows of {k} with {experts} experts ({shared} bytes of shared memory)"
        )));
    }
    let tiles = pairs.min(pairs.div_ceil(tt) + experts.min(pairs));
    if tiles > 65_535 {
        return Err(limit(format!("{pairs} (token, slot) pairs in one launch")));
    }
    let passes = m.div_ceil(ROWS_PER_PASS).max(1);
    let split = passes.min(TARGET_BLOCKS.div_ceil(tiles.max(1))).max(1);
    let rows_per_block = passes.div_ceil(split) * ROWS_PER_PASS;
    // Tiles of one pair go through the cp.async kernels when the rows are
    // whole 16-byte units and whole ring slices, and an expert's bytes fit
    // in 32 bits (Q4_K: the repacked orders only, m % 8 == 0).
    let d1 = d1_ring(w.dtype).and_then(|(kb, stages, rs)| {
        let nb = k / w.dtype.block_len();
        if tt != 1
            || row_bytes % 16 != 0
            || nb % kb != 0
            || m * row_bytes >= 1 << 32
            || (w.dtype == DType::Q4_K && m % 8 != 0)
        {
            return None;
        }
        let act = match act {
            Act::Q8K => nb * 304,
            _ => nb * 36,
        };
        let ring = (THREADS as usize / 32) * stages * 4 * rs;
        let shared = act + route.next_multiple_of(16) + ring;
        (shared <= D1_SHARED_LIMIT).then(|| (format!("mmid_{name}_d1"), shared, act))
    });
    Ok(Plan {
        kernel: format!("mmid_{name}_t{tt}"),
        grid: (m.div_ceil(rows_per_block) as u32, tiles as u32, 1),
        shared,
        rows_per_block,
        astride,
        experts,
        m,
        k,
        pairs,
        slots,
        x_per_pair: x.rows() != n,
        row_bytes,
        align,
        d1,
    })
}

pub(super) fn supports(node: &OpNode) -> Result<(), OpError> {
    plan(node).map(|_| ())
}

/// The grouped tensor-core plan of a node the exact plan accepts, where
/// numerics `fast` takes one.
fn grouped(k: &CudaKernels, node: &OpNode) -> Option<Grouped> {
    (k.numerics() == crate::Numerics::Fast)
        .then(|| Grouped::of(node))
        .flatten()
}

/// Scratch of one launch: the grouped product's quantized activations and
/// routing table (numerics `fast`, prefill chunks); none otherwise.
pub(super) fn scratch_bytes(k: &CudaKernels, node: &OpNode) -> usize {
    if plan(node).is_err() {
        return 0;
    }
    grouped(k, node).map_or(0, |g| g.scratch_bytes())
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch(
    k: &CudaKernels,
    s: &CudaStream,
    node: &OpNode,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    scratch: u64,
) -> Result<(), OpError> {
    check_arity(OP, ins, outs, 3)?;
    let p = plan(node)?;
    let (x, w, ids, out) = (&ins[0], &ins[1], &ins[2], &outs[0]);
    check_aligned(OP, x, 4)?;
    check_aligned(OP, w, p.align)?;
    check_aligned(OP, ids, 4)?;
    check_aligned(OP, out, 4)?;
    if p.pairs == 0 || p.m == 0 || p.k == 0 {
        return Ok(());
    }
    if let Some(g) = grouped(k, node) {
        return g.launch(k, s, ins, out.ptr, scratch);
    }
    let (kernel, shared, astride) = match &p.d1 {
        Some((name, shared, astride)) if w.ptr % 16 == 0 => (name.as_str(), *shared, *astride),
        _ => (p.kernel.as_str(), p.shared, p.astride),
    };
    enqueue(
        s,
        k.fns.get(OP, kernel)?,
        p.grid,
        THREADS,
        shared as u32,
        &[
            Arg::Ptr(w.ptr),
            Arg::Ptr(x.ptr),
            Arg::Ptr(ids.ptr),
            Arg::Ptr(out.ptr),
            Arg::I32(p.m as i32),
            Arg::I32(p.k as i32),
            Arg::I32(p.pairs as i32),
            Arg::I32(p.slots as i32),
            Arg::I32(p.x_per_pair as i32),
            Arg::I32(p.experts as i32),
            Arg::U64((p.m * p.row_bytes) as u64),
            Arg::U64(p.row_bytes as u64),
            Arg::I32(p.rows_per_block as i32),
            Arg::I32(astride as i32),
        ],
        OP,
    )
}
