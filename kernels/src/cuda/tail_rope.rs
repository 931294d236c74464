//! DeepSeek-V4's tail rope on CUDA (see tail_rope.cu): the CPU's own
//! frequencies ([`TailRopeParams::inv_freq`], computed here on the host and
//! passed by value, so no table and no `prepare`), one f32 product per
//! angle as the CPU, then CUDA's f64 `sincos` where the CPU calls glibc's:
//! the (cos, sin) pairs round to the same f32 except within ~2^-52 of a
//! rounding midpoint, so this op is checked against a tolerance, not bit
//! for bit: every rotated element within 2^-21 (|a| + |b|) of the CPU's
//! (a, b: its input pair), pass-through elements exact.

use super::launch::{bad_call, check_aligned, check_arity, launch as enqueue, unsupported, Arg};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::TailRopeParams;
use weft_ops::{DType, Op, OpError, OpNode};

pub(super) const KERNELS: &[&str] = &["tail_rope_f32"];

/// Frequencies the kernel takes by value (`TROPE_MAX_PAIRS` in tail_rope.cu):
/// two per u64 argument.
const MAX_PAIRS: usize = 64;
const FREQ_WORDS: usize = MAX_PAIRS / 2;

/// Threads per block, and units (elements or pairs) each thread covers.
const THREADS: u32 = 256;
const UNITS_PER_THREAD: usize = 4;

fn params(node: &OpNode) -> Result<&TailRopeParams, OpError> {
    match &node.op {
        Op::TailRope(p) => Ok(p),
        other => Err(bad_call(other.name(), "not a tail_rope node".into())),
    }
}

pub(super) fn supports(node: &OpNode) -> Result<(), OpError> {
    let op = node.op.name();
    let p = params(node)?;
    let dtypes = [
        node.inputs.first().map(|t| t.dtype),
        node.inputs.get(1).map(|t| t.dtype),
        node.outputs.first().map(|t| t.dtype),
    ];
    if dtypes != [Some(DType::F32), Some(DType::I32), Some(DType::F32)] {
        return Err(unsupported(
            op,
            format!("inputs/output of types {dtypes:?} (expects f32 x, i32 positions, f32 out)"),
        ));
    }
    if p.n_dims / 2 > MAX_PAIRS {
        return Err(unsupported(
            op,
            format!(
                "{} rotated dimensions (at most {})",
                p.n_dims,
                2 * MAX_PAIRS
            ),
        ));
    }
    if p.head_dim == 0 || p.n_dims > p.head_dim || !p.n_dims.is_multiple_of(2) {
        return Err(unsupported(
            op,
            format!("{} of {} rotated dimensions", p.n_dims, p.head_dim),
        ));
    }
    let cols = node.inputs[0].cols();
    if cols > i32::MAX as usize || !cols.is_multiple_of(p.head_dim) {
        return Err(unsupported(
            op,
            format!("rows of {cols} with heads of {}", p.head_dim),
        ));
    }
    Ok(())
}

/// The frequencies packed for the kernel: pair `2q` in the low half of
/// word `q`, pair `2q + 1` in the high half.
fn freq_words(p: &TailRopeParams) -> [u64; FREQ_WORDS] {
    let mut words = [0u64; FREQ_WORDS];
    for (i, f) in p.inv_freq().iter().enumerate().take(MAX_PAIRS) {
        words[i / 2] |= (f.to_bits() as u64) << (32 * (i % 2));
    }
    words
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch(
    k: &CudaKernels,
    s: &CudaStream,
    node: &OpNode,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    let op = node.op.name();
    let p = params(node)?;
    check_arity(op, ins, outs, 2)?;
    for t in ins.iter().take(2).chain(&outs[..1]) {
        check_aligned(op, t, 4)?;
    }
    supports(node)?;
    let (x, pos, out) = (&ins[0], &ins[1], &outs[0]);
    let (rows, cols) = (x.tensor.rows(), x.tensor.cols());
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let units = (cols / p.head_dim) * (p.head_dim - p.n_dims / 2);
    let per_block = THREADS as usize * UNITS_PER_THREAD;
    let blocks = units.div_ceil(per_block).clamp(1, 65_535) as u32;
    let mut args = vec![
        Arg::Ptr(x.ptr),
        Arg::Ptr(pos.ptr),
        Arg::Ptr(out.ptr),
        Arg::I32(cols as i32),
        Arg::I32(p.head_dim as i32),
        Arg::I32(p.n_dims as i32),
        Arg::I32(p.inverse as i32),
    ];
    args.extend(freq_words(p).map(Arg::U64));
    enqueue(
        s,
        k.fns.get(op, "tail_rope_f32")?,
        (rows as u32, blocks, 1),
        THREADS,
        0,
        &args,
        op,
    )
}
