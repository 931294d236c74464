//! Split-K decode attention (flash-decoding, fast/attention.cu) for up to
//! [`MAX_ROWS`] query rows: the cached cells split over blocks, each
//! block's softmax state merged by log-sum-exp, so one step's attention
//! over 16k cells costs about what it costs over a few hundred.
//!
//! The grid is fixed when the node is launched (captured), from the
//! recorded view's rows (the whole cache for a decode replay); the cells a
//! step reads come from its step scalars, so the same graph serves every
//! step: splits beyond the step's extent return at once.

use super::super::attention::AttnArgs;
use super::super::launch::{bad_call, check_aligned, launch as enqueue, natural_alignment, Arg};
use super::super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::{AttentionParams, DType, OpError};

pub(in crate::cuda) const KERNELS: &[&str] = &[
    "attn_split_f16_h1",
    "attn_split_f16_h2",
    "attn_split_f16_h4",
    "attn_split_f32_h1",
    "attn_split_f32_h2",
    "attn_split_f32_h4",
    "attn_split_f16_h1_q8_0",
    "attn_split_f16_h2_q8_0",
    "attn_split_f16_h4_q8_0",
    "attn_split_f32_h1_q8_0",
    "attn_split_f32_h2_q8_0",
    "attn_split_f32_h4_q8_0",
    "attn_split_f16_h1_q8_1",
    "attn_split_f16_h2_q8_1",
    "attn_split_f16_h4_q8_1",
    "attn_split_f32_h1_q8_1",
    "attn_split_f32_h2_q8_1",
    "attn_split_f32_h4_q8_1",
];

/// Most query rows the split kernel takes (a decode step, or a few rows of
/// speculative or batched decoding); more rows run the exact kernels.
pub(in crate::cuda) const MAX_ROWS: usize = 4;
/// Threads per block (`FA_THREADS`).
const THREADS: u32 = 128;
/// Cells a lane group takes per pass (`FA_UNROLL`).
const UNROLL: usize = 4;
/// Splits merged at once (`FA_GROUP`): the last of a group of this many
/// consecutive splits merges them, the last group the groups.
const GROUP: usize = 16;
/// Most splits of one row and head block (`FA_MAX_SPLITS`): two levels of
/// [`GROUP`].
const MAX_SPLITS: usize = GROUP * GROUP;
/// Warps per block (`FA_WARPS`).
const WARPS: usize = 4;

/// How one node's split launch is shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::cuda) struct SplitShape {
    /// Query heads per block: 1, 2 or 4 (one kv head's group, or a part).
    heads_per_block: usize,
    /// Blocks per query row along x (kv heads x parts of each group).
    blocks_x: usize,
    splits: usize,
    rows: usize,
}

impl SplitShape {
    /// The shape for `rows` query rows over a view of `view_rows` cells on
    /// a device of `sms` multiprocessors: splits for the cache's whole
    /// capacity when it is larger (a decode graph captured early replays
    /// at every later position).
    pub(in crate::cuda) fn new(
        p: &AttentionParams,
        rows: usize,
        view_rows: usize,
        sms: usize,
    ) -> SplitShape {
        let group = p.heads / p.kv_heads.max(1);
        let heads_per_block = match group {
            1 => 1,
            2 => 2,
            _ => 4,
        };
        let blocks_x = p.kv_heads * group.div_ceil(heads_per_block);
        let per_row = (blocks_x * rows).max(1);
        // About two blocks per multiprocessor in all when the cells allow:
        // as many as stay resident at once (the f16 blocks take about 190
        // registers a thread), so no split waits for a second wave.
        let cap = (2 * sms / per_row).clamp(1, MAX_SPLITS);
        let cells = view_rows.max(p.kv_capacity as usize);
        let want = cells.div_ceil(split_min(p.head_dim)).max(1);
        SplitShape {
            heads_per_block,
            blocks_x,
            splits: cap.min(want),
            rows,
        }
    }

    /// Scratch bytes: every split's and every group's values and (max,
    /// sum) of every (row, head), then the arrival counters, one per group
    /// and one for the groups of each row and head block (zeroed at
    /// allocation, reset by each launch).
    pub(in crate::cuda) fn scratch_bytes(&self, p: &AttentionParams) -> usize {
        self.states_bytes(p) + self.rows * self.blocks_x * (self.groups() + 1) * 4
    }

    fn states_bytes(&self, p: &AttentionParams) -> usize {
        let entries = self.splits + self.groups();
        (self.rows * p.heads * entries * (p.head_dim + 2) * 4).next_multiple_of(256)
    }

    /// Groups of [`GROUP`] splits (the merge tree's first level).
    fn groups(&self) -> usize {
        self.splits.div_ceil(GROUP)
    }

    /// The block's lane-group states, then the arrival flag and the heads'
    /// maxima (fast/attention.cu's layout).
    fn shared_bytes(&self, head_dim: usize) -> usize {
        let states = WARPS * groups_per_warp(head_dim);
        states * self.heads_per_block * (head_dim + 2) * 4 + 32
    }
}

/// Lane groups per warp: L lanes per cell, eight dimensions each (L the
/// power of two at or above head_dim / 8), so 32 / L cells side by side.
fn groups_per_warp(head_dim: usize) -> usize {
    32 / head_dim.div_ceil(8).next_power_of_two().min(32)
}

/// Fewest cells a split takes: one of a block's passes (each lane group's
/// cells loaded at once), so at a few thousand cells the cells spread over
/// as many blocks as the grid has and each waits about one memory latency.
fn split_min(head_dim: usize) -> usize {
    WARPS * groups_per_warp(head_dim) * UNROLL
}

/// Whether the split kernel takes `rows` query rows of `p` (any head size
/// the exact kernels take, f16 or f32 caches).
pub(in crate::cuda) fn takes(p: &AttentionParams, rows: usize) -> bool {
    (1..=MAX_ROWS).contains(&rows) && p.head_dim <= 256 && p.head_dim.is_multiple_of(32)
}

/// Enqueues the split kernel. `q` holds the query rows (`args.q_stride`
/// values apart), `scratch` [`SplitShape::scratch_bytes`] bytes;
/// `after_proj`: the kernel follows a split `qkv+attention+quantize`
/// launch and returns where that one attended (the one-pass exact path).
///
/// # Safety
/// As [`CudaKernels::launch`]: every pointer covers what the grid touches.
#[allow(clippy::too_many_arguments)]
pub(in crate::cuda) unsafe fn launch(
    kernels: &CudaKernels,
    stream: &CudaStream,
    op: &'static str,
    p: &AttentionParams,
    shape: SplitShape,
    args: AttnArgs,
    q: u64,
    k: &DeviceTensor,
    v: &DeviceTensor,
    out: &DeviceTensor,
    scratch: u64,
    step: u64,
    after_proj: bool,
) -> Result<(), OpError> {
    if scratch == 0 {
        return Err(bad_call(op, "no scratch for the split states".into()));
    }
    check_aligned(op, k, 16)?;
    check_aligned(op, v, 16)?;
    check_aligned(op, out, natural_alignment(out.tensor.dtype))?;
    let kv = match (k.tensor.dtype, v.tensor.dtype) {
        (DType::F16, DType::F16) => "f16",
        (DType::F32, DType::F32) => "f32",
        (a, b) => return Err(bad_call(op, format!("{a} keys with {b} values"))),
    };
    let outf = match out.tensor.dtype {
        DType::F32 => "",
        DType::Q8_0 => "_q8_0",
        DType::Q8_1 => "_q8_1",
        other => return Err(bad_call(op, format!("a {other} output"))),
    };
    let counters = scratch + shape.states_bytes(p) as u64;
    let f = kernels.fns.get(
        op,
        &format!("attn_split_{kv}_h{}{outf}", shape.heads_per_block),
    )?;
    enqueue(
        stream,
        f,
        (
            shape.blocks_x as u32,
            shape.splits as u32,
            shape.rows as u32,
        ),
        THREADS,
        shape.shared_bytes(p.head_dim) as u32,
        &[
            Arg::Ptr(q),
            Arg::Ptr(k.ptr),
            Arg::Ptr(v.ptr),
            Arg::Ptr(out.ptr),
            Arg::Attn(args),
            Arg::Ptr(step),
            Arg::Ptr(scratch),
            Arg::Ptr(counters),
            Arg::U32(split_min(p.head_dim) as u32),
            Arg::U32(after_proj as u32),
        ],
        op,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(heads: usize, kv_heads: usize, head_dim: usize) -> AttentionParams {
        AttentionParams {
            heads,
            kv_heads,
            head_dim,
            scale: 0.125,
            q_position: 0,
            window: None,
            ring: None,
            softcap: 0.0,
            kv_capacity: 0,
            flash: true,
        }
    }

    #[test]
    fn shapes_follow_heads_and_cells() {
        // SmolLM2: 9 heads over 3, one block per kv head.
        let s = SplitShape::new(&params(9, 3, 64), 1, 8192, 132);
        assert_eq!((s.heads_per_block, s.blocks_x, s.splits), (4, 3, 88));
        // About two blocks per multiprocessor at the most.
        let s = SplitShape::new(&params(9, 3, 64), 1, 16384, 132);
        assert_eq!((s.splits, s.groups()), (88, 6));
        // A short view takes few splits, unless the cache is larger.
        let s = SplitShape::new(&params(9, 3, 64), 1, 300, 132);
        assert_eq!((s.splits, s.groups()), (5, 1));
        let mut p = params(9, 3, 64);
        p.kv_capacity = 4096;
        assert_eq!(SplitShape::new(&p, 1, 1, 132).splits, 64);
        // Gemma 3 270M: one kv head, the splits capped by the merge tree.
        let s = SplitShape::new(&params(4, 1, 256), 1, 16384, 132);
        assert_eq!((s.blocks_x, s.splits, s.groups()), (1, MAX_SPLITS, GROUP));
        // Seven heads per kv head: two blocks (4 + 3).
        let s = SplitShape::new(&params(14, 2, 64), 1, 4096, 132);
        assert_eq!((s.heads_per_block, s.blocks_x), (4, 4));
        // Multi-head attention: a block per head.
        let s = SplitShape::new(&params(8, 8, 128), 2, 4096, 132);
        assert_eq!((s.heads_per_block, s.blocks_x, s.splits), (1, 8, 16));
        // The shared memory of the widest state fits the default limit.
        let s = SplitShape::new(&params(4, 1, 256), 1, 4096, 132);
        assert!(s.shared_bytes(256) <= 48 * 1024);
        assert_eq!(
            (split_min(64), split_min(128), split_min(256)),
            (64, 32, 16)
        );
        let s = SplitShape::new(&params(4, 1, 32), 1, 4096, 132);
        assert!(s.shared_bytes(32) <= 48 * 1024);
    }
}
