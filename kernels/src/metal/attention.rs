//! `Attention` on weft's `weft_attention_f32kv` / `weft_attention_f16kv`.
//!
//! mlx-native's attention kernels (`sdpa`, `flash_attn_vec`,
//! `flash_attn_prefill`) take head-major caches (`[kv_heads, capacity,
//! head_dim]`), and `sdpa` f32 K/V only, `flash_attn_vec` head sizes 256 or
//! 512 only; none reads weft's token-major cache rows (`[rows, kv_heads *
//! head_dim]`, f16 or f32) with ring slots, so weft runs its own kernel
//! rather than transposing the cache every step.

use super::{dim, unsupported, Ctx, MetalTensor, MlxDType, Route};
use bytemuck::{Pod, Zeroable};
use mlx_native::{KernelArg, MTLSize};
use weft_ops::{AttentionParams, DType, OpError, OpNode, Tensor};

/// Largest head the kernel holds in registers (8 values per lane).
const MAX_HEAD_DIM: usize = 256;
/// Simdgroups per threadgroup (the kernel's `WEFT_ATTN_SIMDGROUPS`).
const SIMDGROUPS: u64 = 4;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n_q: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    kv_rows: u32,
    q_position: u32,
    window: u32,
    ring: u32,
    scale: f32,
    softcap: f32,
}

pub(super) fn route(
    node: &OpNode,
    p: &AttentionParams,
    k: &Tensor,
    v: &Tensor,
) -> Result<Route, OpError> {
    if !p.flash {
        return Err(unsupported(
            node,
            "flash attention off (the CPU backend has that path)".to_string(),
        ));
    }
    if k.dtype != v.dtype {
        return Err(unsupported(
            node,
            format!("{} keys with {} values", k.dtype, v.dtype),
        ));
    }
    if p.head_dim > MAX_HEAD_DIM {
        return Err(unsupported(
            node,
            format!("heads of {} (at most {MAX_HEAD_DIM})", p.head_dim),
        ));
    }
    Ok(Route::Weft(match k.dtype {
        DType::F16 => "weft_attention_f16kv",
        _ => "weft_attention_f32kv",
    }))
}

pub(super) fn attention(
    cx: &mut Ctx<'_>,
    node: &OpNode,
    ins: &[MetalTensor],
    out: &MetalTensor,
    p: &AttentionParams,
) -> Result<(), OpError> {
    let (q, k, v) = (&ins[0], &ins[1], &ins[2]);
    let kernel = match route(node, p, &k.tensor, &v.tensor)? {
        Route::Weft(name) | Route::MlxNative(name) => name,
    };
    let params = Params {
        n_q: dim(node, "query rows", q.tensor.rows())?,
        heads: dim(node, "heads", p.heads)?,
        kv_heads: dim(node, "kv heads", p.kv_heads)?,
        head_dim: dim(node, "head size", p.head_dim)?,
        kv_rows: dim(node, "cache rows", k.tensor.rows())?,
        q_position: p.q_position,
        window: p.window.unwrap_or(0),
        ring: p.ring.unwrap_or(0),
        scale: p.scale,
        softcap: p.softcap,
    };
    let kv_type = if k.tensor.dtype == DType::F16 {
        MlxDType::F16
    } else {
        MlxDType::F32
    };
    let (qv, kv, vv, ov) = (
        q.view(MlxDType::F32)?,
        k.view(kv_type)?,
        v.view(kv_type)?,
        out.view(MlxDType::F32)?,
    );
    cx.weft(
        kernel,
        &[
            (0, KernelArg::Buffer(&qv)),
            (1, KernelArg::Buffer(&kv)),
            (2, KernelArg::Buffer(&vv)),
            (3, KernelArg::Buffer(&ov)),
            (4, KernelArg::Bytes(bytemuck::bytes_of(&params))),
        ],
        MTLSize::new(u64::from(params.heads), u64::from(params.n_q), 1),
        MTLSize::new(32 * SIMDGROUPS, 1, 1),
    )
}
