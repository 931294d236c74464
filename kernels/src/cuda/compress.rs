//! The DeepSeek-V4 KV compressor ([`Op::Compress`]) and the lightning
//! indexer's top-k ([`Op::IndexerTopK`]) on CUDA (kernels in `compress.cu`).
//!
//! Both follow the CPU kernels' order of operations (`cpu/compress.rs`):
//!
//! - `compress_rows`, one block per pooled row: the gated softmax runs per
//!   channel in f32 over the slots in the CPU's order (glibc's `expf`), the
//!   row's f64 sum of squares is reproduced exactly (`seq_sum_finish`), and
//!   the norm is the CPU's f32 arithmetic. Bit-exact except the rotated
//!   tail: its frequencies (`powf` in f64) and angles (`sin_cos` in f64) use
//!   CUDA's `pow` and `sincos` where the CPU calls glibc, then round to f32
//!   as the CPU does. Those agree on the f32 bits unless the f64 results
//!   lie within a couple of f64 ulp of an f32 rounding boundary (about one
//!   value in 10^8); the tests allow 1e-6 of the pair's norm there.
//!   The YaRN ramp's ends come from the host (the CPU's own expressions).
//! - `indexer_scores` (a block per 32 key rows and query; lanes are rows,
//!   warps heads) computes each score exactly as the CPU: f32 dots in index
//!   order, `max(0, .)`, f64 products summed over heads in order, rounded to
//!   f32. It stores them in device scratch as u32 keys in `f32::total_cmp`'s
//!   order. `indexer_select` (a block per query) finds the `top_k`-th
//!   largest key by a 4-pass radix select, then writes the rows above it and
//!   the lowest rows equal to it in one ordered pass: the CPU's selection
//!   (ties to the lower row, ascending output, `-1` padding), bit for bit.
//!   Queries go in chunks so the scratch stays under [`INDEXER_SCRATCH_CAP`]
//!   whatever the number of rows.
//!
//! Step scalars: `Compress` reads `[first_row]` and `IndexerTopK`
//! `[q_position]` from `step` when it is not null.

use super::launch::{
    bad_call, check_aligned, check_arity, launch as enqueue, unsupported, Arg, F64_SUM_BOUNDED,
};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::{CompressParams, IndexerParams, TailRopeParams};
use weft_ops::{DType, Op, OpError, OpNode};

pub(super) const KERNELS: &[&str] = &["compress_rows", "indexer_scores", "indexer_select"];

/// Threads of a `compress_rows` block (`COMPRESS_THREADS` in compress.cu).
const COMPRESS_THREADS: usize = 512;
/// Dynamic shared memory `compress_rows` may use: the pooled row (`dc`
/// floats) and two slot tables (`2 ratio` u32 each), beside the 12 KiB of
/// `SeqSumScratch` in the 48 KiB a block gets without opting in.
const COMPRESS_SHARED_LIMIT: usize = 35 * 1024;
/// Key rows per `indexer_scores` block (`INDEXER_TILE`).
const INDEXER_TILE: usize = 32;
const INDEXER_SCORE_THREADS: u32 = 256;
const INDEXER_SELECT_THREADS: u32 = 1024;
/// Shared memory per block without opting in.
const SHARED_LIMIT: usize = 48 * 1024;
/// Bytes of score scratch a launch may use: queries are scored and
/// selected in chunks of `INDEXER_SCRATCH_CAP / (4 rows)` (at least one).
pub(super) const INDEXER_SCRATCH_CAP: usize = 32 << 20;

pub(super) fn supports(node: &OpNode) -> Result<(), OpError> {
    let name = node.op.name();
    match &node.op {
        Op::Compress(p) => {
            expect_dtypes(node, 4, DType::F32)?;
            let dc = node.outputs[0].cols();
            let width = node.inputs[0].cols();
            if p.ratio == 0 || p.ring == 0 {
                return Err(unsupported(
                    name,
                    format!("ratio {} with a ring of {}", p.ratio, p.ring),
                ));
            }
            if compress_shared(dc, p.ratio) > COMPRESS_SHARED_LIMIT {
                return Err(unsupported(
                    name,
                    format!("rows of {dc} channels pooling {} tokens", p.ratio),
                ));
            }
            if (p.ring as u64) * (width as u64) > u32::MAX as u64 {
                return Err(unsupported(
                    name,
                    format!("rings of {} x {width} values", p.ring),
                ));
            }
            Ok(())
        }
        Op::IndexerTopK(p) => {
            expect_dtypes(node, 3, DType::I32)?;
            let keys = node.inputs[2].rows();
            if p.heads == 0 || p.head_dim == 0 || p.ratio == 0 {
                return Err(unsupported(
                    name,
                    format!("{} heads of {} (ratio {})", p.heads, p.head_dim, p.ratio),
                ));
            }
            let (stride, _) = tile_stride(p.head_dim, true);
            if score_shared(p, stride) > SHARED_LIMIT
                || score_shared(p, tile_stride(p.head_dim, false).0) > SHARED_LIMIT
            {
                return Err(unsupported(
                    name,
                    format!("{} indexer heads of {}", p.heads, p.head_dim),
                ));
            }
            if keys > i32::MAX as usize || p.top_k > i32::MAX as usize {
                return Err(unsupported(
                    name,
                    format!("{keys} key rows with top-{}", p.top_k),
                ));
            }
            Ok(())
        }
        _ => Err(unsupported(name, "this op".into())),
    }
}

/// Inputs all f32, `n` of them; the output f32 (`Compress`) or i32.
fn expect_dtypes(node: &OpNode, n: usize, out: DType) -> Result<(), OpError> {
    let name = node.op.name();
    if node.inputs.len() != n || node.outputs.len() != 1 {
        return Err(bad_call(
            name,
            format!(
                "expected {n} inputs and 1 output, got {} and {}",
                node.inputs.len(),
                node.outputs.len()
            ),
        ));
    }
    if let Some(t) = node.inputs.iter().find(|t| t.dtype != DType::F32) {
        return Err(unsupported(name, format!("{} inputs", t.dtype)));
    }
    if node.outputs[0].dtype != out {
        return Err(unsupported(
            name,
            format!("{} outputs", node.outputs[0].dtype),
        ));
    }
    Ok(())
}

fn compress_shared(dc: usize, ratio: u32) -> usize {
    dc * 4 + 2 * (2 * ratio as usize) * 4
}

/// The key tile's row stride (floats) and whether the float4 path is
/// usable: odd strides (or odd multiples of 4 for float4 loads) put the 32
/// lanes' rows on distinct banks.
fn tile_stride(head_dim: usize, vec4: bool) -> (usize, bool) {
    if vec4 && head_dim.is_multiple_of(4) {
        let s = if (head_dim / 4) % 2 == 1 {
            head_dim
        } else {
            head_dim + 4
        };
        (s, true)
    } else {
        (head_dim | 1, false)
    }
}

fn score_shared(p: &IndexerParams, stride: usize) -> usize {
    (INDEXER_TILE * stride + INDEXER_TILE * p.heads) * 4
}

/// Queries scored and selected per chunk.
fn indexer_chunk(queries: usize, key_rows: usize) -> usize {
    let fit = INDEXER_SCRATCH_CAP
        .checked_div(key_rows * 4)
        .unwrap_or(queries);
    fit.min(queries).clamp(1, 65535)
}

pub(super) fn scratch_bytes(node: &OpNode) -> usize {
    match &node.op {
        Op::IndexerTopK(_) if node.inputs.len() == 3 => {
            let (n, rows) = (node.inputs[0].rows(), node.inputs[2].rows());
            indexer_chunk(n, rows) * rows * 4
        }
        _ => 0,
    }
}

pub(super) fn step_scalars(node: &OpNode) -> Vec<u32> {
    match &node.op {
        Op::Compress(p) => vec![p.first_row],
        Op::IndexerTopK(p) => vec![p.q_position],
        _ => Vec::new(),
    }
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
    step: u64,
) -> Result<(), OpError> {
    match &node.op {
        Op::Compress(p) => compress(k, s, p, ins, outs, step),
        Op::IndexerTopK(p) => indexer_topk(k, s, p, ins, outs, scratch, step),
        other => Err(unsupported(other.name(), "this op".into())),
    }
}

/// The ends `(lo, hi)` of the YaRN ramp, as `TailRopeParams::inv_freq`
/// computes them (`(0, 1)` without YaRN; unused then).
fn yarn_ramp(p: &TailRopeParams) -> (f64, f64) {
    let Some(y) = p.yarn else { return (0.0, 1.0) };
    let r = p.n_dims as f64;
    let base = p.base as f64;
    let corr = |beta: f64| {
        r * (y.orig_ctx as f64 / (2.0 * std::f64::consts::PI * beta)).ln() / (2.0 * base.ln())
    };
    let lo = corr(y.beta_fast as f64).floor().max(0.0);
    let mut hi = corr(y.beta_slow as f64).ceil().min(r - 1.0);
    if lo == hi {
        hi = lo + 0.001;
    }
    (lo, hi)
}

unsafe fn compress(
    k: &CudaKernels,
    s: &CudaStream,
    p: &CompressParams,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    step: u64,
) -> Result<(), OpError> {
    const OP: &str = "compress";
    check_arity(OP, ins, outs, 4)?;
    for t in ins.iter().chain(outs) {
        check_aligned(OP, t, 4)?;
    }
    let (kv, gate, ape, norm, out) = (&ins[0], &ins[1], &ins[2], &ins[3], &outs[0]);
    let (rows, table) = (p.rows as usize, out.tensor.rows());
    let (dc, width) = (out.tensor.cols(), kv.tensor.cols());
    if p.ratio == 0 || p.ring == 0 || compress_shared(dc, p.ratio) > COMPRESS_SHARED_LIMIT {
        return Err(unsupported(
            OP,
            format!("{dc} channels, ratio {}, ring {}", p.ratio, p.ring),
        ));
    }
    if rows == 0 || dc == 0 {
        return Ok(());
    }
    let threads = dc.next_multiple_of(32).clamp(32, COMPRESS_THREADS) as u32;
    let (lo, hi) = yarn_ramp(&p.rope);
    let (yarn, factor) = match p.rope.yarn {
        Some(y) => (1, y.factor),
        None => (0, 1.0),
    };
    enqueue(
        s,
        k.fns.get(OP, "compress_rows")?,
        (rows as u32, 1, 1),
        threads,
        compress_shared(dc, p.ratio) as u32,
        &[
            Arg::Ptr(kv.ptr),
            Arg::Ptr(gate.ptr),
            Arg::Ptr(ape.ptr),
            Arg::Ptr(norm.ptr),
            Arg::Ptr(out.ptr),
            Arg::Ptr(step),
            Arg::I32(rows as i32),
            Arg::U32(table as u32),
            Arg::I32(dc as i32),
            Arg::I32(width as i32),
            Arg::U32(p.ratio),
            Arg::I32(p.overlap as i32),
            Arg::U32(p.first_row),
            Arg::U32(p.ring),
            Arg::F32(p.eps),
            Arg::I32(p.rope.n_dims as i32),
            Arg::F32(p.rope.base),
            Arg::I32(p.rope.inverse as i32),
            Arg::I32(yarn),
            Arg::F32(factor),
            Arg::U64(lo.to_bits()),
            Arg::U64(hi.to_bits()),
            Arg::I32(F64_SUM_BOUNDED),
        ],
        OP,
    )
}

unsafe fn indexer_topk(
    k: &CudaKernels,
    s: &CudaStream,
    p: &IndexerParams,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    scratch: u64,
    step: u64,
) -> Result<(), OpError> {
    const OP: &str = "indexer_topk";
    check_arity(OP, ins, outs, 3)?;
    for t in ins.iter().chain(outs) {
        check_aligned(OP, t, 4)?;
    }
    let (q, weights, keys, out) = (&ins[0], &ins[1], &ins[2], &outs[0]);
    let (n, key_rows) = (q.tensor.rows(), keys.tensor.rows());
    let (stride, vec4) = tile_stride(p.head_dim, q.ptr.is_multiple_of(16));
    let shared = score_shared(p, stride);
    if shared > SHARED_LIMIT || key_rows > i32::MAX as usize || p.ratio == 0 {
        return Err(unsupported(
            OP,
            format!("{} heads of {} over {key_rows} rows", p.heads, p.head_dim),
        ));
    }
    let chunk = indexer_chunk(n, key_rows);
    if key_rows > 0 && scratch == 0 {
        return Err(bad_call(OP, "no scratch for the scores".into()));
    }
    for q0 in (0..n).step_by(chunk) {
        let count = chunk.min(n - q0);
        if key_rows > 0 {
            enqueue(
                s,
                k.fns.get(OP, "indexer_scores")?,
                (key_rows.div_ceil(INDEXER_TILE) as u32, count as u32, 1),
                INDEXER_SCORE_THREADS,
                shared as u32,
                &[
                    Arg::Ptr(q.ptr),
                    Arg::Ptr(weights.ptr),
                    Arg::Ptr(keys.ptr),
                    Arg::Ptr(scratch),
                    Arg::Ptr(step),
                    Arg::I32(p.heads as i32),
                    Arg::I32(p.head_dim as i32),
                    Arg::I32(key_rows as i32),
                    Arg::U32(p.ratio),
                    Arg::U32(p.q_position),
                    Arg::I32(q0 as i32),
                    Arg::I32(stride as i32),
                    Arg::I32(vec4 as i32),
                ],
                OP,
            )?;
        }
        enqueue(
            s,
            k.fns.get(OP, "indexer_select")?,
            (count as u32, 1, 1),
            INDEXER_SELECT_THREADS,
            0,
            &[
                Arg::Ptr(scratch),
                Arg::Ptr(out.ptr),
                Arg::Ptr(step),
                Arg::I32(key_rows as i32),
                Arg::I32(p.top_k as i32),
                Arg::U32(p.ratio),
                Arg::U32(p.q_position),
                Arg::I32(q0 as i32),
            ],
            OP,
        )?;
    }
    Ok(())
}
