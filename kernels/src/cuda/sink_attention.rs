//! DeepSeek-V4 attention with sinks on CUDA (see sink_attention.cu and
//! sink_attention_attend.cu), with the CPU kernel's bits
//! (`cpu::sink_attention`) except the output rope.
//!
//! The CPU sums each dot product in column order in f32, the softmax
//! denominator and every output column in key order: none of these chains
//! splits across threads without changing bits. So parallelism comes from
//! (head, key) pairs for the scores and (head, column) pairs for the
//! output, in two kernels over a scratch of scores `f32 [rows, heads,
//! slots]`: `sink_scores` (one thread per (key, 3 heads), each dot product
//! one sequential chain; keys and queries staged 128 columns at a time in
//! shared memory, shared by the 12 heads of a block since K = V is one
//! head, the next chunk loading into registers while one is summed, every
//! row asked into L2 up front) and `sink_attend` (a block per (8 heads, 32
//! columns): the softmax of its heads over scores gathered into shared
//! memory, lane h of one warp summing head h's denominator in key order,
//! then one thread per (2 heads, column) summing over the keys in order,
//! value rows streamed through shared memory with asynchronous copies; the
//! output rope in the same kernel). Every attend block redoes its heads'
//! softmax (16 blocks share 8 heads at head_dim 512): cheaper than a third
//! launch. Both kernels run one warp per scheduler at decode sizes (the
//! dot products and sums are too few to fill more), so their loops read
//! their operands a step ahead by hand. Queries go in chunks of rows so
//! the scratch stays under [`SCRATCH_BUDGET`].
//!
//! The output rope computes the frequencies (`TailRopeParams::inv_freq`,
//! f64 `powf`/`ln`) and the angles' f64 `sin_cos` with CUDA's functions
//! (within 2 ulp of glibc in f64; rounded to f32 they almost always give
//! the same bits, but that is not guaranteed): the tests hold the rotated
//! columns to 1e-5 of `|cpu| + 0.01` (a one-ulp cos or sin moves a value
//! by about 6e-8 of its pair) and every other column to the CPU's bits.
//!
//! Step scalar: `q_position` (read from `step` when it is not 0).
//! Selection entries past the visible rows (an error on the CPU) and
//! all-visible rows past the rows given are skipped, never read.

use super::launch::{
    bad_call, check_aligned, check_arity, launch as enqueue, natural_alignment, unsupported, Arg,
};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::SinkAttentionParams;
use weft_ops::{DType, Op, OpError, OpNode, Tensor};

pub(super) const KERNELS: &[&str] = &["sink_scores", "sink_attend"];

const OP: &str = "sink_attention";

/// Scratch bytes a launch aims at (the query rows go in chunks that fit;
/// one row may need more).
const SCRATCH_BUDGET: usize = 8 << 20;

/// Slots and heads per scores block, threads per block of either kernel,
/// heads and columns per attend block (as in sink_attention.cu).
const SCORE_SLOTS: usize = 32;
const SCORE_HEADS: usize = 12;
const THREADS: u32 = 128;
const ATTEND_HEADS: usize = 8;
const ATTEND_COLS: usize = 32;

fn params(node: &OpNode) -> Result<&SinkAttentionParams, OpError> {
    match &node.op {
        Op::SinkAttention(p) => Ok(p),
        other => Err(bad_call(
            OP,
            format!("{} is not sink_attention", other.name()),
        )),
    }
}

/// Key slots per query: the window, then the compressed rows (the
/// selection's width, or every given row).
fn slots(p: &SinkAttentionParams, rows: &Tensor) -> usize {
    let compressed = if p.ratio == 0 {
        0
    } else if p.top_k > 0 {
        p.top_k
    } else {
        rows.rows()
    };
    p.window as usize + compressed
}

/// Query rows per chunk (at least 1, at most 65,535: the grid's z).
fn chunk_rows(p: &SinkAttentionParams, n: usize, slots: usize) -> usize {
    let per_row = (p.heads * slots * 4).max(1);
    (SCRATCH_BUDGET / per_row).clamp(1, n.clamp(1, 65_535))
}

pub(super) fn supports(node: &OpNode) -> Result<(), OpError> {
    let p = params(node)?;
    if node.inputs.len() != 4 + (p.top_k > 0) as usize || node.outputs.len() != 1 {
        return Err(bad_call(
            OP,
            format!(
                "{} inputs and {} outputs for top-{}",
                node.inputs.len(),
                node.outputs.len(),
                p.top_k
            ),
        ));
    }
    let (q, win, rows, sinks) = (
        &node.inputs[0],
        &node.inputs[1],
        &node.inputs[2],
        &node.inputs[3],
    );
    for (what, t, ok) in [
        ("queries", q, &[DType::F32][..]),
        ("window", win, &[DType::F32, DType::F16][..]),
        ("rows", rows, &[DType::F32, DType::F16][..]),
        ("sinks", sinks, &[DType::F32][..]),
        ("output", &node.outputs[0], &[DType::F32][..]),
    ] {
        if !ok.contains(&t.dtype) {
            return Err(unsupported(OP, format!("{what} of {}", t.dtype)));
        }
    }
    if let Some(sel) = node.inputs.get(4) {
        if sel.dtype != DType::I32 {
            return Err(unsupported(OP, format!("a selection of {}", sel.dtype)));
        }
    }
    let slots = slots(p, rows);
    let small = |v: usize| v <= i32::MAX as usize;
    if p.window == 0
        || !small(slots)
        || !small(p.head_dim)
        || !small(p.top_k)
        || !small(p.ring as usize + rows.rows())
        || p.heads.div_ceil(ATTEND_HEADS) > 65_535
    {
        return Err(unsupported(
            OP,
            format!(
                "{} heads of {}, {slots} key slots, a ring of {} and {} rows",
                p.heads,
                p.head_dim,
                p.ring,
                rows.rows()
            ),
        ));
    }
    if let Some(r) = p.out_rope {
        if r.n_dims > p.head_dim {
            return Err(unsupported(
                OP,
                format!("an output rope of {} of {} dims", r.n_dims, p.head_dim),
            ));
        }
    }
    Ok(())
}

pub(super) fn scratch_bytes(node: &OpNode) -> usize {
    let Ok(p) = params(node) else { return 0 };
    let n = node.inputs[0].rows();
    if n == 0 {
        return 0;
    }
    let slots = slots(p, &node.inputs[2]);
    chunk_rows(p, n, slots) * p.heads * slots * 4
}

pub(super) fn step_scalars(node: &OpNode) -> Vec<u32> {
    match params(node) {
        Ok(p) => vec![p.q_position],
        Err(_) => Vec::new(),
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
    let p = params(node)?;
    let want = 4 + (p.top_k > 0) as usize;
    check_arity(OP, ins, outs, want)?;
    for t in ins.iter().take(want).chain(&outs[..1]) {
        check_aligned(OP, t, natural_alignment(t.tensor.dtype))?;
    }
    if !scratch.is_multiple_of(4) {
        return Err(bad_call(
            OP,
            format!("scratch at {scratch:#x} is not 4-byte aligned"),
        ));
    }
    let (q, win, rows, sinks, out) = (&ins[0], &ins[1], &ins[2], &ins[3], &outs[0]);
    let sel = if p.top_k > 0 { ins[4].ptr } else { 0 };
    let n = q.tensor.rows();
    if n == 0 || p.heads == 0 || p.head_dim == 0 {
        return Ok(());
    }
    let slots = slots(p, &rows.tensor);
    let chunk = chunk_rows(p, n, slots);
    let flags =
        (win.tensor.dtype == DType::F16) as i32 | ((rows.tensor.dtype == DType::F16) as i32) << 1;
    let geometry = [
        Arg::U32(p.q_position),
        Arg::U32(p.window),
        Arg::U32(p.ring),
        Arg::U32(p.ratio),
        Arg::U32(rows.tensor.rows() as u32),
        Arg::I32(p.top_k as i32),
        Arg::I32(p.heads as i32),
        Arg::I32(p.head_dim as i32),
        Arg::I32(flags),
        Arg::I32(slots as i32),
    ];
    let rope = p.out_rope;
    let rope_dims = rope.map_or(0, |r| r.n_dims);
    let yarn = rope.and_then(|r| r.yarn);
    // Column chunks start `shift` columns early so rotated pairs never straddle two.
    let shift = (rope_dims > 0 && (p.head_dim - rope_dims) % 2 == 1) as usize;
    let col_chunks = (p.head_dim + shift).div_ceil(ATTEND_COLS) as u32;
    // Wide copies: every row (and chunk) starts on their size.
    let d = p.head_dim;
    let aligned = |t: &DeviceTensor, f32_bytes: u64, f16_bytes: u64| {
        t.ptr.is_multiple_of(match t.tensor.dtype {
            DType::F16 => f16_bytes,
            _ => f32_bytes,
        })
    };
    let vec = d.is_multiple_of(4)
        && q.ptr.is_multiple_of(16)
        && aligned(win, 16, 8)
        && aligned(rows, 16, 8);
    let vmode = (shift == 0 && d.is_multiple_of(4) && aligned(win, 16, 1) && aligned(rows, 16, 1))
        as i32
        | ((shift == 0 && d.is_multiple_of(2) && aligned(win, 1, 4) && aligned(rows, 1, 4)) as i32)
            << 1;
    let (scores_fn, attend_fn) = (k.fns.get(OP, "sink_scores")?, k.fns.get(OP, "sink_attend")?);
    let mut row0 = 0;
    while row0 < n {
        let count = chunk.min(n - row0) as u32;
        let mut args = vec![
            Arg::Ptr(q.ptr),
            Arg::Ptr(win.ptr),
            Arg::Ptr(rows.ptr),
            Arg::Ptr(sel),
            Arg::Ptr(scratch),
            Arg::Ptr(step),
        ];
        args.extend(geometry);
        args.extend([
            Arg::I32(row0 as i32),
            Arg::F32(p.scale),
            Arg::I32(vec as i32),
        ]);
        enqueue(
            s,
            scores_fn,
            (
                slots.div_ceil(SCORE_SLOTS) as u32,
                p.heads.div_ceil(SCORE_HEADS) as u32,
                count,
            ),
            THREADS,
            0,
            &args,
            OP,
        )?;
        let mut args = vec![
            Arg::Ptr(win.ptr),
            Arg::Ptr(rows.ptr),
            Arg::Ptr(sel),
            Arg::Ptr(sinks.ptr),
            Arg::Ptr(scratch),
            Arg::Ptr(out.ptr),
            Arg::Ptr(step),
        ];
        args.extend(geometry);
        args.extend([
            Arg::I32(row0 as i32),
            Arg::I32(shift as i32),
            Arg::I32(rope_dims as i32),
            Arg::F32(rope.map_or(0.0, |r| r.base)),
            Arg::I32(yarn.is_some() as i32),
            Arg::F32(yarn.map_or(1.0, |y| y.factor)),
            Arg::U32(yarn.map_or(0, |y| y.orig_ctx)),
            Arg::F32(yarn.map_or(0.0, |y| y.beta_fast)),
            Arg::F32(yarn.map_or(0.0, |y| y.beta_slow)),
            Arg::I32(rope.is_some_and(|r| r.inverse) as i32),
            Arg::I32(vmode),
        ]);
        enqueue(
            s,
            attend_fn,
            (col_chunks, p.heads.div_ceil(ATTEND_HEADS) as u32, count),
            THREADS,
            0,
            &args,
            OP,
        )?;
        row0 += count as usize;
    }
    Ok(())
}
