//! Attention on CUDA in llama.cpp's CPU variants (see attention.cu): the
//! tiled kernel for blocks of 64 query rows inside a ubatch of 64 or more
//! rows, the one-chunk kernel for the rest, split KV for one query row over
//! a padded cache view of 512 cells or more (decided on the device, from the
//! step scalars, so a captured decode graph stays valid as the cache grows).

use super::launch::{bad_call, check_aligned, check_arity, launch as enqueue, unsupported, Arg};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::{AttentionParams, DType, OpError, OpNode};

pub(super) const KERNELS: &[&str] = &[
    "attn_chunk_f16",
    "attn_chunk_f32",
    "attn_tiled_f16",
    "attn_tiled_f32",
];

/// Query rows per tiled block (`GGML_FA_TILE_Q`).
const TILE: usize = 64;
/// llama.cpp's micro-batch: the tiled kernel applies per ubatch.
const UBATCH: usize = 512;
/// Bytes of `ChunkShared` in attention.cu.
const CHUNK_SHARED_BYTES: usize = 2 * 256 * 4 * 2 + 2 * 256 + 16;
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
}

pub(super) fn supports(node: &OpNode, p: &AttentionParams) -> Result<(), OpError> {
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

/// `[q_position, rows of the cache view]`.
pub(super) fn step_scalars(node: &OpNode, p: &AttentionParams) -> Vec<u32> {
    vec![p.q_position, node.inputs[1].rows() as u32]
}

/// Dynamic shared memory of the tiled kernel.
pub(super) fn tiled_shared_bytes(head_dim: usize, kv: DType) -> usize {
    let esz = if kv == DType::F16 { 2 } else { 4 };
    (TILE * head_dim + TILE * TILE) * 4 + 2 * TILE * head_dim * esz
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
    check_aligned(OP, out, 4)?;
    let n = q.tensor.rows();
    let d = p.head_dim;
    let kv = k.tensor.dtype;
    let suffix = if kv == DType::F16 { "f16" } else { "f32" };
    let mut args = AttnArgs {
        heads: p.heads as i32,
        kv_heads: p.kv_heads as i32,
        head_dim: d as i32,
        n: n as i32,
        q_stride: q.tensor.cols() as i32,
        kv_stride: k.tensor.cols() as i32,
        out_stride: out.tensor.cols() as i32,
        row_offset: 0,
        scale: p.scale,
        softcap: p.softcap,
        window: p.window.unwrap_or(u32::MAX),
        ring: p.ring.unwrap_or(u32::MAX),
        kv_capacity: p.kv_capacity,
        q_position: p.q_position,
        kv_rows: node.inputs[1].rows() as u32,
    };
    let ptrs = [
        Arg::Ptr(q.ptr),
        Arg::Ptr(k.ptr),
        Arg::Ptr(v.ptr),
        Arg::Ptr(out.ptr),
    ];
    let tiled = tiled_blocks(n);
    if tiled > 0 {
        let bytes = tiled_shared_bytes(d, kv);
        if bytes > kernels.tiled_shared_limit {
            return Err(bad_call(
                OP,
                format!("head size {d} needs {bytes} bytes of shared memory per block"),
            ));
        }
        let mut a = ptrs.to_vec();
        a.push(Arg::Attn(args));
        a.push(Arg::Ptr(step));
        let f = kernels.fns.get(OP, &format!("attn_tiled_{suffix}"))?;
        enqueue(
            stream,
            f,
            (p.heads as u32, tiled as u32, 1),
            512,
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
        let mut a = ptrs.to_vec();
        a.push(Arg::Attn(args));
        a.push(Arg::Ptr(step));
        let threads = (2 * d).max(256) as u32;
        let bytes = CHUNK_SHARED_BYTES + 3 * d * 4;
        let f = kernels.fns.get(OP, &format!("attn_chunk_{suffix}"))?;
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
