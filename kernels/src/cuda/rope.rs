//! Rotary embedding on CUDA. The (cos, sin) pairs come from a per-parameter
//! table that `prepare` computes on the host with the CPU's own
//! `angle_cache` (glibc cosf/sinf of llama.cpp's iterated theta) for
//! positions `0..TABLE_POSITIONS`, so the rotation is bit-identical to
//! the CPU's; later positions fall back to CUDA's cosf/sinf (see rope.cu).

use super::launch::{
    bad_call, blocks_for, check_aligned, check_arity, launch as enqueue, Arg, BLOCK,
};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::Arc;
use weft_ops::{OpError, RopeMode, RopeParams};

pub(super) const KERNELS: &[&str] = &["rope_f32"];

/// Positions covered by a table.
pub const TABLE_POSITIONS: u32 = 32_768;

/// The CUDA-side parameters (layout of `RopeArgs` in rope.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RopeArgs {
    rows: i32,
    cols: i32,
    head_dim: i32,
    n_dims: i32,
    neox: i32,
    table_positions: u32,
    theta_scale: f32,
    freq_scale: f32,
    ext_factor: f32,
    mscale: f32,
    corr_low: f32,
    corr_high: f32,
}

/// What a table depends on (bit patterns of the angle parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct TableKey([u32; 8]);

pub(super) fn table_key(p: &RopeParams) -> TableKey {
    TableKey([
        p.n_dims as u32,
        p.base.to_bits(),
        p.freq_scale.to_bits(),
        p.ext_factor.to_bits(),
        p.attn_factor.to_bits(),
        p.beta_fast.to_bits(),
        p.beta_slow.to_bits(),
        p.orig_ctx,
    ])
}

/// A device table of `(cos, sin)` for every position and pair.
pub(super) struct Table {
    pub(super) data: CudaSlice<f32>,
    pub(super) positions: u32,
}

/// Builds and uploads the table for `p` (outside graph capture).
pub(super) fn build_table(stream: &Arc<CudaStream>, p: &RopeParams) -> Result<Table, OpError> {
    let positions = TABLE_POSITIONS;
    let half = p.n_dims / 2;
    let mut host = Vec::with_capacity(positions as usize * half * 2);
    let mut cache = Vec::with_capacity(half);
    for pos in 0..positions {
        crate::cpu::angle_cache(p, pos as f32, &mut cache);
        for (c, s) in &cache {
            host.push(*c);
            host.push(*s);
        }
    }
    let data = stream
        .clone_htod(&host)
        .map_err(|e| super::launch::driver_error("rope", "uploading the rope table", e))?;
    stream
        .synchronize()
        .map_err(|e| super::launch::driver_error("rope", "uploading the rope table", e))?;
    Ok(Table { data, positions })
}

/// llama.cpp's YaRN correction dimensions (as `cpu::rope`).
fn corr_dims(p: &RopeParams) -> (f32, f32) {
    let n = p.n_dims as f32;
    let dim = |rot: f32| {
        n * (p.orig_ctx as f32 / (rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * p.base.ln())
    };
    (
        dim(p.beta_fast).floor().max(0.0),
        dim(p.beta_slow).ceil().min(n - 1.0),
    )
}

/// The kernel parameters for `rows` rows of `cols` under `p`.
pub(super) fn rope_args(
    p: &RopeParams,
    rows: usize,
    cols: usize,
    table_positions: u32,
) -> RopeArgs {
    let (low, high) = corr_dims(p);
    let mut mscale = p.attn_factor;
    if p.ext_factor != 0.0 {
        mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
    }
    RopeArgs {
        rows: rows as i32,
        cols: cols as i32,
        head_dim: p.head_dim as i32,
        n_dims: p.n_dims as i32,
        neox: (p.mode == RopeMode::Neox) as i32,
        table_positions,
        theta_scale: p.base.powf(-2.0 / p.n_dims as f32),
        freq_scale: p.freq_scale,
        ext_factor: p.ext_factor,
        mscale,
        corr_low: low,
        corr_high: high,
    }
}

/// Threads of a rope launch: one per (row, head, pair or passed-through element).
pub(super) fn rope_threads(p: &RopeParams, rows: usize, cols: usize) -> u64 {
    let heads = cols / p.head_dim;
    (rows * heads * (p.n_dims / 2 + (p.head_dim - p.n_dims))) as u64
}

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch(
    kernels: &CudaKernels,
    stream: &CudaStream,
    p: &RopeParams,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    const OP: &str = "rope";
    check_arity(OP, ins, outs, 2)?;
    for t in ins.iter().chain(outs) {
        check_aligned(OP, t, 4)?;
    }
    let (table_ptr, table_len) = kernels.rope_table(p).ok_or_else(|| {
        bad_call(
            OP,
            "the rope table for these parameters is not prepared: call prepare() first".into(),
        )
    })?;
    let (x, pos, out) = (&ins[0], &ins[1], &outs[0]);
    let args = rope_args(p, x.tensor.rows(), x.tensor.cols(), table_len);
    let count = rope_threads(p, x.tensor.rows(), x.tensor.cols());
    enqueue(
        stream,
        kernels.fns.get(OP, "rope_f32")?,
        (blocks_for(count), 1, 1),
        BLOCK,
        0,
        &[
            Arg::Ptr(x.ptr),
            Arg::Ptr(pos.ptr),
            Arg::Ptr(out.ptr),
            Arg::Ptr(table_ptr),
            Arg::Rope(args),
        ],
        OP,
    )
}
