//! Attention on CUDA in llama.cpp's CPU variants (see attention.cu): the
//! tiled kernel for blocks of 64 query rows inside a ubatch of 64 or more
//! rows, the one-chunk kernel for the rest, split KV for one query row over
//! a padded cache view of 512 cells or more (decided on the device, from the
//! step scalars, so a captured decode graph stays valid as the cache grows).

use super::launch::{
    bad_call, check_aligned, check_arity, launch as enqueue, natural_alignment, unsupported, Arg,
};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::{AttentionParams, DType, OpError, OpNode};

pub(super) const KERNELS: &[&str] = &[
    "attn_chunk_f16",
    "attn_chunk_f32",
    "attn_chunk_f16_q8_0",
    "attn_chunk_f32_q8_0",
    "attn_chunk_f16_q8_1",
    "attn_chunk_f32_q8_1",
    "attn_tiled_f16_g1",
    "attn_tiled_f16_g2",
    "attn_tiled_f16_g4",
    "attn_tiled_f32_g1",
    "attn_tiled_f32_g2",
    "attn_tiled_f32_g4",
];

/// Kernels whose shared-memory limit is raised at load.
pub(super) const LARGE_SHARED: &[&str] = KERNELS;

/// Query rows per tiled block (`GGML_FA_TILE_Q`).
const TILE: usize = 64;
/// llama.cpp's micro-batch: the tiled kernel applies per ubatch.
const UBATCH: usize = 512;
/// Query rows per block of the tiled kernel (`TILED_ROWS`).
const TILED_ROWS: usize = 16;
/// Threads per block of the tiled kernel (`TILED_THREADS`).
const TILED_THREADS: u32 = 128;
/// Largest head size the kernels take.
pub(super) const MAX_HEAD_DIM: usize = 256;

/// The CUDA-side parameters (layout of `AttnArgs` in attention.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnArgs {
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    n: i32,
    q_stride: i32,
    kv_stride: i32,
    out_stride: i32,
    row_offset: i32,
    scale: f32,
    softcap: f32,
    window: u32,
    ring: u32,
    kv_capacity: u32,
    q_position: u32,
    kv_rows: u32,
    /// attn_chunk: cells per part per pass; attn_tiled: 1 when f16 tiles
    /// go through the staging buffer.
    chunk: u32,
    /// scale / softcap (0 without a soft cap), divided here: in a kernel
    /// the compiler hoists the division out of its branch, and a division
    /// by a zero soft cap takes the slow path on every launch.
    softcap_scale: f32,
}

pub(super) fn supports(node: &OpNode, p: &AttentionParams) -> Result<(), OpError> {
    if !p.flash {
        return Err(unsupported(
            "attention",
            "flash attention off (the CPU backend has that path)".to_string(),
        ));
    }
    let (k, v) = (&node.inputs[1], &node.inputs[2]);
    if k.dtype != v.dtype || !matches!(k.dtype, DType::F16 | DType::F32) {
        return Err(unsupported(
            "attention",
            format!(
                "{} keys with {} values (f16/f16 or f32/f32)",
                k.dtype, v.dtype
            ),
        ));
    }
    if !p.head_dim.is_multiple_of(32) || p.head_dim > MAX_HEAD_DIM || p.head_dim == 0 {
        return Err(unsupported(
            "attention",
            format!(
                "head size {} (multiples of 32 up to {MAX_HEAD_DIM})",
                p.head_dim
            ),
        ));
    }
    if p.kv_heads == 0 || !p.heads.is_multiple_of(p.kv_heads) {
        return Err(unsupported(
            "attention",
            format!("{} query heads over {} kv heads", p.heads, p.kv_heads),
        ));
    }
    Ok(())
}

/// Attention then quantize (the fusion pass's `attention+quantize`): the
/// one-chunk kernel writes Q8_0 / Q8_1 blocks itself, so only for fewer
/// than 64 query rows (never the tiled kernel).
pub(super) fn supports_quantized(node: &OpNode, p: &AttentionParams) -> Result<(), OpError> {
    supports(node, p)?;
    let out = node.outputs[0].dtype;
    if !matches!(out, DType::Q8_0 | DType::Q8_1) {
        return Err(unsupported(
            "attention+quantize",
            format!("{out} output (Q8_0 or Q8_1)"),
        ));
    }
    if tiled_blocks(node.inputs[0].rows()) > 0 {
        return Err(unsupported(
            "attention+quantize",
            format!("{} query rows (the tiled kernel)", node.inputs[0].rows()),
        ));
    }
    Ok(())
}

/// `[q_position, rows of the cache view]`.
pub(super) fn step_scalars(node: &OpNode, p: &AttentionParams) -> Vec<u32> {
    vec![p.q_position, node.inputs[1].rows() as u32]
}

fn elem_bytes(kv: DType) -> usize {
    if kv == DType::F16 {
        2
    } else {
        4
    }
}

/// Dynamic shared memory of the tiled kernel (layout of attention.cu):
/// queries, probabilities, f32 keys (padded rows) and values, and for an
/// f16 cache whose tiles are `staged` the staging buffer of the next tile.
pub(super) fn tiled_shared_bytes(head_dim: usize, kv: DType, staged: bool) -> usize {
    let stage = if kv == DType::F16 && staged {
        2 * TILE * head_dim * 2
    } else {
        0
    };
    (TILED_ROWS * head_dim + TILE * TILED_ROWS + TILE * (head_dim + 4) + TILE * head_dim) * 4
        + stage
}

/// Cells per part per pass of the one-chunk kernel (its values are staged:
/// two parts of `chunk` rows within 64 KiB).
fn chunk_cells(head_dim: usize, kv: DType) -> usize {
    (32 * 1024 / (head_dim * elem_bytes(kv))).clamp(32, 256) / 32 * 32
}

/// Dynamic shared memory of the one-chunk kernel: the general body's
/// layout (attention.cu) or, when larger, the one-pass decode body's
/// (attn_decode.cu: staged keys and values, the query, the warps' maxima,
/// the factors, glibc_expf's table, the visible cells, their count and the
/// new-maximum bits).
fn chunk_shared_bytes(head_dim: usize, kv: DType, chunk: usize) -> usize {
    let general = 40 * chunk
        + (2 * chunk).next_multiple_of(16)
        + 2 * chunk * head_dim * elem_bytes(kv)
        + 12 * head_dim
        + 32;
    let decode = 4 * chunk * head_dim
        + 4 * head_dim
        + 256
        + 12 * chunk
        + 2 * chunk.next_multiple_of(2)
        + 4
        + chunk / 8;
    general.max(decode)
}

/// Leading 64-row blocks that take the tiled kernel: every block whose
/// ubatch holds 64 or more rows (only the last ubatch can be shorter).
fn tiled_blocks(n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    (0..n.div_ceil(TILE))
        .take_while(|b| {
            let start = b * TILE / UBATCH * UBATCH;
            (n - start).min(UBATCH) >= TILE
        })
        .count()
}

/// The kernels' arguments for `n` query rows of `q_cols` values over the
/// cache view `k` (its rows: the recorded extent), writing rows of
/// `out_cols`; `chunk` 0 (set per kernel).
fn attn_args(
    p: &AttentionParams,
    n: usize,
    q_cols: usize,
    k: &weft_ops::Tensor,
    out_cols: usize,
) -> AttnArgs {
    AttnArgs {
        heads: p.heads as i32,
        kv_heads: p.kv_heads as i32,
        head_dim: p.head_dim as i32,
        n: n as i32,
        q_stride: q_cols as i32,
        kv_stride: k.cols() as i32,
        out_stride: out_cols as i32,
        row_offset: 0,
        scale: p.scale,
        softcap: p.softcap,
        softcap_scale: if p.softcap != 0.0 {
            p.scale / p.softcap
        } else {
            0.0
        },
        window: p.window.unwrap_or(u32::MAX),
        ring: p.ring.unwrap_or(u32::MAX),
        kv_capacity: p.kv_capacity,
        q_position: p.q_position,
        kv_rows: k.rows() as u32,
        chunk: 0,
    }
}

/// The one-chunk kernel's arguments for one query row (a decode step) of
/// `q_cols` values over the f16 or f32 cache view `k`, writing rows of
/// `out_cols`, and its dynamic shared memory.
pub(super) fn one_row_args(
    p: &AttentionParams,
    q_cols: usize,
    k: &weft_ops::Tensor,
    out_cols: usize,
) -> (AttnArgs, usize) {
    let chunk = chunk_cells(p.head_dim, k.dtype);
    let args = AttnArgs {
        chunk: chunk as u32,
        ..attn_args(p, 1, q_cols, k, out_cols)
    };
    (args, chunk_shared_bytes(p.head_dim, k.dtype, chunk))
}

/// The arguments of a fast kernel's launch for `node` (three inputs: query,
/// keys, values; one output), after the checks every attention takes.
fn node_args(
    op: &'static str,
    node: &OpNode,
    p: &AttentionParams,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<AttnArgs, OpError> {
    check_arity(op, ins, outs, 3)?;
    supports(node, p)?;
    Ok(attn_args(
        p,
        ins[0].tensor.rows(),
        ins[0].tensor.cols(),
        &node.inputs[1],
        outs[0].tensor.cols(),
    ))
}

/// The split kernel of numerics `fast` ([`super::fast::attention`]) for a
/// decode step's few query rows.
///
/// # Safety
/// See [`CudaKernels::launch`]; `scratch` holds the shape's scratch bytes.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn launch_split(
    kernels: &CudaKernels,
    stream: &CudaStream,
    node: &OpNode,
    p: &AttentionParams,
    shape: super::fast::attention::SplitShape,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    scratch: u64,
    step: u64,
) -> Result<(), OpError> {
    const OP: &str = "attention";
    let args = node_args(OP, node, p, ins, outs)?;
    let (q, out) = (&ins[0], &outs[0]);
    check_aligned(OP, q, 4)?;
    super::fast::attention::launch(
        kernels, stream, OP, p, shape, args, q.ptr, &ins[1], &ins[2], out, scratch, step, false,
    )
}

/// The tensor-core prefill kernel of numerics `fast`
/// ([`super::fast::attention_prefill`]) for many query rows.
///
/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch_prefill_fast(
    kernels: &CudaKernels,
    stream: &CudaStream,
    node: &OpNode,
    p: &AttentionParams,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    step: u64,
) -> Result<(), OpError> {
    const OP: &str = "attention";
    let args = node_args(OP, node, p, ins, outs)?;
    let (q, out) = (&ins[0], &outs[0]);
    super::fast::attention_prefill::launch(
        kernels, stream, OP, p, args, q, &ins[1], &ins[2], out, step,
    )
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch(
    kernels: &CudaKernels,
    stream: &CudaStream,
    node: &OpNode,
    p: &AttentionParams,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    step: u64,
) -> Result<(), OpError> {
    const OP: &str = "attention";
    check_arity(OP, ins, outs, 3)?;
    supports(node, p)?;
    let (q, k, v, out) = (&ins[0], &ins[1], &ins[2], &outs[0]);
    check_aligned(OP, q, 4)?;
    check_aligned(OP, k, 16)?;
    check_aligned(OP, v, 16)?;
    // The output: f32 rows, or (fused with quantize) activation blocks.
    let quantized = match out.tensor.dtype {
        DType::F32 => "",
        DType::Q8_0 => "_q8_0",
        DType::Q8_1 => "_q8_1",
        other => return Err(bad_call(OP, format!("{other} output"))),
    };
    check_aligned(OP, out, natural_alignment(out.tensor.dtype))?;
    let n = q.tensor.rows();
    let d = p.head_dim;
    let kv = k.tensor.dtype;
    let suffix = if kv == DType::F16 { "f16" } else { "f32" };
    let mut args = attn_args(p, n, q.tensor.cols(), &node.inputs[1], out.tensor.cols());
    let ptrs = [
        Arg::Ptr(q.ptr),
        Arg::Ptr(k.ptr),
        Arg::Ptr(v.ptr),
        Arg::Ptr(out.ptr),
    ];
    let tiled = tiled_blocks(n);
    if tiled > 0 && !quantized.is_empty() {
        return Err(bad_call(
            OP,
            format!("a quantized output for {n} query rows (the tiled kernel)"),
        ));
    }
    if tiled > 0 {
        // f16 tiles through the staging buffer when it fits, else loaded
        // and widened in place.
        let limit = kernels.large_shared_limit;
        let staged = kv == DType::F16 && tiled_shared_bytes(d, kv, true) <= limit;
        let bytes = tiled_shared_bytes(d, kv, staged);
        args.chunk = staged as u32;
        check_aligned(OP, out, 16)?; // float4 stores
        if bytes > limit {
            return Err(bad_call(
                OP,
                format!("head size {d} needs {bytes} bytes of shared memory per block"),
            ));
        }
        let mut a = ptrs.to_vec();
        a.push(Arg::Attn(args));
        a.push(Arg::Ptr(step));
        let blocks = (tiled * TILE).min(n).div_ceil(TILED_ROWS);
        // Groups of four output dimensions per thread: 1, 2 or 4.
        let groups = d.div_ceil(64).next_power_of_two();
        let f = kernels
            .fns
            .get(OP, &format!("attn_tiled_{suffix}_g{groups}"))?;
        enqueue(
            stream,
            f,
            (p.heads as u32, blocks as u32, 1),
            TILED_THREADS,
            bytes as u32,
            &a,
            OP,
        )?;
    }
    let rest = n - (tiled * TILE).min(n);
    if rest > 0 {
        if rest > 65_535 {
            return Err(bad_call(OP, format!("{rest} query rows exceed one launch")));
        }
        args.row_offset = (tiled * TILE) as i32;
        let chunk = chunk_cells(d, kv);
        args.chunk = chunk as u32;
        let mut a = ptrs.to_vec();
        a.push(Arg::Attn(args));
        a.push(Arg::Ptr(step));
        let threads = (2 * d).max(256) as u32;
        let bytes = chunk_shared_bytes(d, kv, chunk);
        let f = kernels
            .fns
            .get(OP, &format!("attn_chunk_{suffix}{quantized}"))?;
        enqueue(
            stream,
            f,
            (p.heads as u32, rest as u32, 1),
            threads,
            bytes as u32,
            &a,
            OP,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_blocks_follow_llama_cpp_ubatches() {
        assert_eq!(tiled_blocks(1), 0);
        assert_eq!(tiled_blocks(63), 0);
        assert_eq!(tiled_blocks(64), 1);
        assert_eq!(tiled_blocks(100), 2);
        assert_eq!(tiled_blocks(512), 8);
        assert_eq!(tiled_blocks(520), 8); // the last ubatch has 8 rows: one chunk
        assert_eq!(tiled_blocks(600), 10); // 88 rows in the last ubatch: tiled
    }
}
