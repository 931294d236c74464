//! Decode attention, fast numerics: flash-decoding on the CPU.
//!
//! The cached cells are cut into chunks, and one work item is one chunk
//! for every head (or, where there are fewer chunks than threads, for a
//! group of KV heads): an item reads its cells' cache rows front to back
//! (all KV heads of a cell are adjacent), so the cache streams at the
//! memory's sequential pace, and the query heads that share a KV head read
//! its keys and values together. The chunk size depends on the cell count
//! alone (about [`ITEMS`] chunks of whole tiles, between one tile and
//! [`MAX_CHUNK`] cells), so a long context spreads over every thread and a
//! result does not depend on the thread count or on which thread ran which
//! chunk. Each item keeps, per query head and row, its running max, sum
//! and f32 output over its chunk (scores in tiles of 64, exponentials by
//! ggml's vector `exp`); the item that finishes last combines the chunks by
//! log-sum-exp, in chunk order.
//!
//! Error bound: f32 dot products and sums with a 1.5-ulp `exp`; against
//! the reference (f64), each output is within about `(d + cells / 64 +
//! chunks) * 2^-24` of the largest value magnitude, well under 1e-4
//! relative at the sizes tested (`kernels/tests/ops_vs_reference.rs`).
//! The exact kernel's f16 rounding of the query and of the running output
//! (llama.cpp's order) is not reproduced.

use super::super::attention::{cells, Ctx};
use super::super::simd::exp_tile64;
use super::super::{HostTensor, WorkSplit};
use half::f16;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use weft_ops::{AttentionParams, DType, OpError};

/// Query rows up to which a step takes this kernel (decode and short
/// speculative batches); longer steps take the exact tiled kernel, which
/// is f32 already and shares each key tile across 64 query rows.
pub(crate) const MAX_ROWS: usize = 4;
/// Cells per score tile.
const TILE: usize = 64;
/// Chunks a long context is cut into.
const ITEMS: usize = 32;
/// Most cells per chunk.
const MAX_CHUNK: usize = 512;

/// The per-chunk partial results of one attention node while it runs:
/// for each chunk, for each query head and row, the running max, sum and
/// `head_dim` outputs.
pub(crate) struct Partials {
    /// Cells per chunk.
    chunk: usize,
    chunks: usize,
    /// KV heads per item: all of them, or fewer where the chunks alone
    /// would leave threads idle (heads are independent, so the grouping
    /// never changes a result).
    kv_group: usize,
    /// Items: `chunks` times the KV head groups.
    items: usize,
    /// Floats per chunk: `heads * rows * (head_dim + 2)`.
    stride: usize,
    values: Mutex<Vec<f32>>,
    done: AtomicUsize,
}

impl std::fmt::Debug for Partials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partials")
            .field("chunk", &self.chunk)
            .field("chunks", &self.chunks)
            .finish()
    }
}

/// Does this kernel take an attention over `q_rows` query rows?
pub(crate) fn applies(q_rows: usize, p: &AttentionParams) -> bool {
    q_rows <= MAX_ROWS && p.kv_heads > 0 && p.heads.is_multiple_of(p.kv_heads)
}

/// Cells per chunk for a scan of `cells` cells: whole tiles, about
/// [`ITEMS`] chunks, at most [`MAX_CHUNK`] cells.
fn chunk_cells(cells: usize) -> usize {
    cells
        .div_ceil(ITEMS)
        .next_multiple_of(TILE)
        .clamp(TILE, MAX_CHUNK)
}

/// One item per chunk of the scanned cells and group of KV heads, the
/// groups as large as `threads` allows.
pub(crate) fn split(
    q_rows: usize,
    k_rows: usize,
    p: &AttentionParams,
    threads: usize,
) -> WorkSplit {
    let cells = cells(q_rows, k_rows, p);
    let chunk = chunk_cells(cells);
    let chunks = cells.div_ceil(chunk).max(1);
    let groups = threads.max(1).div_ceil(chunks).clamp(1, p.kv_heads.max(1));
    let kv_group = p.kv_heads.div_ceil(groups).max(1);
    let items = chunks * p.kv_heads.div_ceil(kv_group).max(1);
    let stride = p.heads * q_rows * (p.head_dim + 2);
    let partials = Partials {
        chunk,
        chunks,
        kv_group,
        items,
        stride,
        values: Mutex::new(vec![0.0; chunks * stride]),
        done: AtomicUsize::new(0),
    };
    WorkSplit::with_partials(items, Arc::new(partials))
}

/// # Safety
/// See [`super::super::run_item`]; `parts` is the split's, made by [`split`]
/// for this node.
pub(crate) unsafe fn attention(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    out: &HostTensor,
    p: &AttentionParams,
    parts: &Partials,
    items: Range<usize>,
) -> Result<(), OpError> {
    let n = q.tensor.rows();
    let ctx = Ctx::new(p, n, k, v);
    let d = p.head_dim;
    let groups = parts.items / parts.chunks;
    // Floats of one KV head's query heads and rows.
    let per_kv_head = parts.stride / p.kv_heads.max(1);
    for item in items {
        let (chunk, group) = (item / groups, item % groups);
        let cells =
            (chunk * parts.chunk).min(ctx.cells)..((chunk + 1) * parts.chunk).min(ctx.cells);
        let kv_heads = (group * parts.kv_group).min(p.kv_heads)
            ..((group + 1) * parts.kv_group).min(p.kv_heads);
        let mut local = vec![0f32; kv_heads.len() * per_kv_head];
        chunk_partials(&ctx, q, cells, kv_heads.clone(), &mut local);
        {
            let mut values = parts.values.lock().map_err(|_| {
                OpError::Record(
                    "fast attention: a thread panicked while holding its partial results".into(),
                )
            })?;
            values[chunk * parts.stride + kv_heads.start * per_kv_head..][..local.len()]
                .copy_from_slice(&local);
        }
        if parts.done.fetch_add(1, Ordering::AcqRel) + 1 == parts.items {
            let values = parts.values.lock().map_err(|_| {
                OpError::Record(
                    "fast attention: a thread panicked while holding its partial results".into(),
                )
            })?;
            combine(&values, parts, p, n, d, out);
            parts.done.store(0, Ordering::Release);
        }
    }
    Ok(())
}

/// Partials over `cells` of the query heads of `kv_heads`, written as
/// `[head][row] -> (max, sum, out[d])`.
unsafe fn chunk_partials(
    ctx: &Ctx<'_>,
    q: &HostTensor,
    cells: Range<usize>,
    kv_heads: Range<usize>,
    local: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(vector) = x86::kernel(ctx.p.head_dim) {
        return vector(ctx, q, cells, kv_heads, local);
    }
    let p = ctx.p;
    let group = p.heads / p.kv_heads;
    let per_kv_head = group * q.tensor.rows() * (p.head_dim + 2);
    for (kvh, local) in kv_heads.zip(local.chunks_exact_mut(per_kv_head)) {
        group_partials(ctx, q, kvh * group..(kvh + 1) * group, cells.clone(), local);
    }
}

/// [`chunk_partials`] of query `heads` (all of one KV head's), one cell at
/// a time: the path for head sizes and machines without the vector kernel.
unsafe fn group_partials(
    ctx: &Ctx<'_>,
    q: &HostTensor,
    heads: Range<usize>,
    cells: Range<usize>,
    local: &mut [f32],
) {
    let p = ctx.p;
    let d = p.head_dim;
    let n = q.tensor.rows();
    let qv = q.f32s();
    let kvh = heads.start / (p.heads / p.kv_heads);
    let slots = heads.len() * n;
    let mut m = vec![f32::NEG_INFINITY; slots];
    let mut s = vec![0f32; slots];
    let mut acc = vec![0f32; slots * d];
    let mut kq = [0f32; TILE];
    let first_pos = p.q_position as usize;
    for tile_start in cells.clone().step_by(TILE) {
        let tile = tile_start..(tile_start + TILE).min(cells.end);
        if !ctx.tile_seen(tile.clone(), first_pos..first_pos + n) {
            continue;
        }
        for (g, h) in heads.clone().enumerate() {
            for t in 0..n {
                let slot = g * n + t;
                let pos = first_pos + t;
                let qrow = &qv[t * q.tensor.cols() + h * d..][..d];
                for (j, c) in tile.clone().enumerate() {
                    kq[j] = dot(ctx, ctx.k, c, kvh, qrow);
                }
                mask_and_scale(ctx, &mut kq, tile.clone(), pos);
                let tile_max = kq.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b));
                let a = &mut acc[slot * d..(slot + 1) * d];
                if !softmax_step(&mut kq, tile_max, &mut m[slot], &mut s[slot], a) {
                    continue;
                }
                for (j, c) in tile.clone().enumerate() {
                    if kq[j] > 0.0 {
                        axpy(ctx, ctx.v, c, kvh, kq[j], a);
                    }
                }
            }
        }
    }
    for slot in 0..slots {
        let dst = &mut local[slot * (d + 2)..(slot + 1) * (d + 2)];
        dst[0] = m[slot];
        dst[1] = s[slot];
        dst[2..].copy_from_slice(&acc[slot * d..(slot + 1) * d]);
    }
}

/// One tile's step of the online softmax of a query head and row: the
/// running max `m` raised to the tile's (rescaling the running sum `s` and
/// output `acc`), the scores `kq` turned into weights and added to `s`.
/// False, with nothing changed, when the row sees no cell of the tile.
fn softmax_step(
    kq: &mut [f32; TILE],
    tile_max: f32,
    m: &mut f32,
    s: &mut f32,
    acc: &mut [f32],
) -> bool {
    if tile_max == f32::NEG_INFINITY {
        return false;
    }
    if tile_max > *m {
        let rescale = (*m - tile_max).exp();
        acc.iter_mut().for_each(|x| *x *= rescale);
        *s *= rescale;
        *m = tile_max;
    }
    *s += exp_tile64(kq, *m) as f32;
    true
}

/// Scales (and caps) the raw scores of `tile` where the query at `pos`
/// sees the cell and sets the rest, and the lanes past the tile, to `-inf`.
fn mask_and_scale(ctx: &Ctx<'_>, kq: &mut [f32; TILE], tile: Range<usize>, pos: usize) {
    if ctx.p.ring.is_none() {
        let hi = (pos + 1).saturating_sub(tile.start).min(tile.len());
        let oldest = ctx
            .p
            .window
            .map_or(0, |w| (pos + 1).saturating_sub(w as usize));
        let lo = oldest.saturating_sub(tile.start).min(hi);
        kq[..lo].fill(f32::NEG_INFINITY);
        kq[hi..].fill(f32::NEG_INFINITY);
        if ctx.p.softcap != 0.0 {
            kq[lo..hi].iter_mut().for_each(|x| *x = ctx.scaled(*x));
        } else {
            let scale = ctx.p.scale;
            kq[lo..hi].iter_mut().for_each(|x| *x *= scale);
        }
        return;
    }
    for (j, c) in tile.clone().enumerate() {
        kq[j] = if ctx.visible(c, pos) {
            ctx.scaled(kq[j])
        } else {
            f32::NEG_INFINITY
        };
    }
    kq[tile.len()..].fill(f32::NEG_INFINITY);
}

/// Combines the chunks of every query head and row by log-sum-exp, in
/// chunk order, and writes the normalised outputs.
unsafe fn combine(
    values: &[f32],
    parts: &Partials,
    p: &AttentionParams,
    n: usize,
    d: usize,
    out: &HostTensor,
) {
    let o = out.ptr as *mut f32;
    let mut acc = vec![0f32; d];
    for h in 0..p.heads {
        for t in 0..n {
            let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
            acc.fill(0.0);
            for chunk in 0..parts.chunks {
                let part = &values[chunk * parts.stride + (h * n + t) * (d + 2)..][..d + 2];
                let (pm, ps) = (part[0], part[1]);
                if ps == 0.0 {
                    continue;
                }
                let m_new = m.max(pm);
                let (a, b) = ((m - m_new).exp(), (pm - m_new).exp());
                for (x, y) in acc.iter_mut().zip(&part[2..]) {
                    *x = *x * a + y * b;
                }
                s = s * a + ps * b;
                m = m_new;
            }
            let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
            let dst = std::slice::from_raw_parts_mut(o.add(t * out.tensor.cols() + h * d), d);
            for (x, y) in dst.iter_mut().zip(&acc) {
                *x = y * inv;
            }
        }
    }
}

/// Start of the row of `slot` for KV head `kvh` in `t`, in elements.
fn row_offset(ctx: &Ctx<'_>, slot: usize, kvh: usize) -> usize {
    slot * ctx.kv_stride + kvh * ctx.p.head_dim
}

/// `q . key(slot)` in f32.
unsafe fn dot(ctx: &Ctx<'_>, t: &HostTensor, slot: usize, kvh: usize, q: &[f32]) -> f32 {
    let offset = row_offset(ctx, slot, kvh);
    if t.tensor.dtype == DType::F16 {
        let row = std::slice::from_raw_parts((t.ptr as *const f16).add(offset), q.len());
        row.iter().zip(q).map(|(k, q)| k.to_f32() * q).sum()
    } else {
        let row = std::slice::from_raw_parts((t.ptr as *const f32).add(offset), q.len());
        row.iter().zip(q).map(|(k, q)| k * q).sum()
    }
}

/// `acc += w * value(slot)` in f32 (a multiply and an add: without the
/// `fma` target feature `mul_add` is a library call per element).
unsafe fn axpy(ctx: &Ctx<'_>, t: &HostTensor, slot: usize, kvh: usize, w: f32, acc: &mut [f32]) {
    let offset = row_offset(ctx, slot, kvh);
    let d = acc.len();
    if t.tensor.dtype == DType::F16 {
        let row = std::slice::from_raw_parts((t.ptr as *const f16).add(offset), d);
        for (a, x) in acc.iter_mut().zip(row) {
            *a += x.to_f32() * w;
        }
    } else {
        let row = std::slice::from_raw_parts((t.ptr as *const f32).add(offset), d);
        for (a, x) in acc.iter_mut().zip(row) {
            *a += x * w;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;
