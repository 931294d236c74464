//! Decode attention, fast numerics: flash-decoding on the CPU.
//!
//! The cached cells are cut into chunks of [`CHUNK`] cells, and one work
//! item is one (KV head, chunk) pair: the query heads that share the KV head
//! read its cells together, and a long context spreads over every thread
//! instead of one thread per head. Below [`SHARED_FROM`] cells, where there
//! are few chunks, an item is one (query head, chunk) pair instead, so
//! short contexts still spread over the threads. Each item keeps, per query head and
//! row, its running max, sum and f32 output over its chunk (scores in
//! tiles of 64, exponentials by ggml's vector `exp`); the item that
//! finishes last combines the chunks by log-sum-exp, in chunk order. The
//! chunking depends on the cell count alone, so a result does not depend on
//! the thread count or on which thread ran which chunk.
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
/// Cells per chunk.
const CHUNK: usize = 256;
/// Cells from which an item takes all the query heads of a KV head.
const SHARED_FROM: usize = 1024;
/// Cells per score tile.
const TILE: usize = 64;

/// The per-chunk partial results of one attention node while it runs:
/// for each (KV head, chunk) item, for each of its query heads and rows,
/// the running max, sum and `head_dim` outputs.
pub(crate) struct Partials {
    chunks: usize,
    items: usize,
    /// Query heads per item: the whole group of a KV head, or one.
    heads: usize,
    /// Floats per item: `heads * rows * (head_dim + 2)`.
    stride: usize,
    values: Mutex<Vec<f32>>,
    done: AtomicUsize,
}

impl std::fmt::Debug for Partials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partials")
            .field("chunks", &self.chunks)
            .field("items", &self.items)
            .finish()
    }
}

/// Does this kernel take an attention over `q_rows` query rows?
pub(crate) fn applies(q_rows: usize, p: &AttentionParams) -> bool {
    q_rows <= MAX_ROWS && p.kv_heads > 0 && p.heads.is_multiple_of(p.kv_heads)
}

/// One item per (KV head, chunk of the scanned cells), or per (query
/// head, chunk) below [`SHARED_FROM`] cells.
pub(crate) fn split(q_rows: usize, k_rows: usize, p: &AttentionParams) -> WorkSplit {
    let cells = cells(q_rows, k_rows, p);
    let chunks = cells.div_ceil(CHUNK).max(1);
    let heads = if cells >= SHARED_FROM {
        p.heads / p.kv_heads
    } else {
        1
    };
    let items = p.heads / heads * chunks;
    let stride = heads * q_rows * (p.head_dim + 2);
    let partials = Partials {
        chunks,
        items,
        heads,
        stride,
        values: Mutex::new(vec![0.0; items * stride]),
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
    for item in items {
        let (head_block, chunk) = (item / parts.chunks, item % parts.chunks);
        let cells = (chunk * CHUNK).min(ctx.cells)..((chunk + 1) * CHUNK).min(ctx.cells);
        let mut local = vec![0f32; parts.stride];
        let heads = head_block * parts.heads..(head_block + 1) * parts.heads;
        chunk_partials(&ctx, q, heads, cells, &mut local);
        {
            let mut values = parts.values.lock().map_err(|_| {
                OpError::Record(
                    "fast attention: a thread panicked while holding its partial results".into(),
                )
            })?;
            values[item * parts.stride..][..parts.stride].copy_from_slice(&local);
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

/// Partials of query `heads` (all of one KV head's) over `cells`, written
/// as `[head][row] -> (max, sum, out[d])`.
unsafe fn chunk_partials(
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
                kq.fill(f32::NEG_INFINITY);
                for (j, c) in tile.clone().enumerate() {
                    if ctx.visible(c, pos) {
                        kq[j] = ctx.scaled(dot(ctx, ctx.k, c, kvh, qrow));
                    }
                }
                let tile_max = kq.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b));
                if tile_max == f32::NEG_INFINITY {
                    continue;
                }
                let a = &mut acc[slot * d..(slot + 1) * d];
                if tile_max > m[slot] {
                    let rescale = (m[slot] - tile_max).exp();
                    a.iter_mut().for_each(|x| *x *= rescale);
                    s[slot] *= rescale;
                    m[slot] = tile_max;
                }
                s[slot] += exp_tile64(&mut kq, m[slot]) as f32;
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
        let (block, g) = (h / parts.heads, h % parts.heads);
        for t in 0..n {
            let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
            acc.fill(0.0);
            for chunk in 0..parts.chunks {
                let item = block * parts.chunks + chunk;
                let part = &values[item * parts.stride + (g * n + t) * (d + 2)..][..d + 2];
                let (pm, ps) = (part[0], part[1]);
                if ps == 0.0 {
                    continue;
                }
                let m_new = m.max(pm);
                let (a, b) = ((m - m_new).exp(), (pm - m_new).exp());
                for (x, y) in acc.iter_mut().zip(&part[2..]) {
                    *x = x.mul_add(a, y * b);
                }
                s = s.mul_add(a, ps * b);
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
    let d = q.len();
    if t.tensor.dtype == DType::F16 {
        let row = (t.ptr as *const f16).add(offset);
        #[cfg(target_arch = "x86_64")]
        if x86::available() && d.is_multiple_of(16) {
            return x86::dot_f16_f32(row, q.as_ptr(), d);
        }
        let row = std::slice::from_raw_parts(row, d);
        row.iter().zip(q).map(|(k, q)| k.to_f32() * q).sum()
    } else {
        let row = std::slice::from_raw_parts((t.ptr as *const f32).add(offset), d);
        row.iter().zip(q).map(|(k, q)| k * q).sum()
    }
}

/// `acc += w * value(slot)` in f32.
unsafe fn axpy(ctx: &Ctx<'_>, t: &HostTensor, slot: usize, kvh: usize, w: f32, acc: &mut [f32]) {
    let offset = row_offset(ctx, slot, kvh);
    let d = acc.len();
    if t.tensor.dtype == DType::F16 {
        let row = (t.ptr as *const f16).add(offset);
        #[cfg(target_arch = "x86_64")]
        if x86::available() && d.is_multiple_of(16) {
            return x86::axpy_f16(acc.as_mut_ptr(), w, row, d);
        }
        let row = std::slice::from_raw_parts(row, d);
        for (a, x) in acc.iter_mut().zip(row) {
            *a = x.to_f32().mul_add(w, *a);
        }
    } else {
        let row = std::slice::from_raw_parts((t.ptr as *const f32).add(offset), d);
        for (a, x) in acc.iter_mut().zip(row) {
            *a = x.mul_add(w, *a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    pub(super) fn available() -> bool {
        super::super::avx512()
    }

    /// `sum(f32(k[i]) * q[i])` over `d` (a multiple of 16) elements.
    #[target_feature(enable = "avx512f,f16c,fma")]
    pub(super) unsafe fn dot_f16_f32(k: *const f16, q: *const f32, d: usize) -> f32 {
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i < d {
            let kv = _mm512_cvtph_ps(_mm256_loadu_si256(k.add(i) as *const __m256i));
            acc = _mm512_fmadd_ps(kv, _mm512_loadu_ps(q.add(i)), acc);
            i += 16;
        }
        _mm512_reduce_add_ps(acc)
    }

    /// `acc[i] += w * f32(v[i])` over `d` (a multiple of 16) elements.
    #[target_feature(enable = "avx512f,f16c,fma")]
    pub(super) unsafe fn axpy_f16(acc: *mut f32, w: f32, v: *const f16, d: usize) {
        let wv = _mm512_set1_ps(w);
        let mut i = 0;
        while i < d {
            let x = _mm512_cvtph_ps(_mm256_loadu_si256(v.add(i) as *const __m256i));
            let a = acc.add(i);
            _mm512_storeu_ps(a, _mm512_fmadd_ps(x, wv, _mm512_loadu_ps(a)));
            i += 16;
        }
    }
}
