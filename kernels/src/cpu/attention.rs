//! Attention, computed the way llama.cpp's CPU flash-attention kernels do,
//! so weft's logits track llama.cpp's bit for bit. llama.cpp picks one of
//! three kernels and weft mirrors the choice:
//!
//! - **one chunk** (fewer than 64 query rows in the ubatch): the query row
//!   is rounded to f16 (for an f16 cache), each score is an f16 x f16 dot
//!   product in ggml's AVX-512 lane order, and the online softmax keeps the
//!   running output in f16, rounded after every key;
//! - **tiled** (64 or more query rows): f32 queries, keys in tiles of 64, each
//!   score an in-order chain of fused multiply-adds, `ggml_v_expf` for the
//!   probabilities, an f32 output accumulated tile by tile;
//! - **split KV** (one query row and a padded cache view of 512 or more
//!   cells): the one-chunk kernel over two halves of the cache (llama.cpp's
//!   reference ran 2 threads), merged.
//!
//! With `flash` off in the params, attention follows llama.cpp with flash
//! attention off instead (`unfused`): f16 score and value matmuls around
//! `soft_max_ext`, over the cache view padded as llama.cpp pads it.
//!
//! Sliding windows and rings are masks: a cell is skipped unless it holds a
//! position the query may see.

use super::quant::{tinyblas_applies, tinyblas_dot_f16};
use super::simd::{
    accumulate, axpy, dot_f16, exp_tile64, mad_f16, reduce16, scale_f16, scores64, to_f16, v_expf,
};
use super::{HostTensor, WorkSplit};
use half::f16;
use std::ops::Range;
use weft_ops::{AttentionParams, DType, OpError};

/// llama.cpp's query and key tile (`GGML_FA_TILE_Q`, `GGML_FA_TILE_KV`).
const TILE: usize = 64;
/// llama.cpp's default micro-batch: the tiled kernel applies per ubatch.
const UBATCH: usize = 512;
/// Threads of the llama.cpp run weft's split-KV decode mirrors.
const SPLIT_THREADS: usize = 2;
/// llama.cpp pads the cache view to multiples of this (and at least this).
const KV_PAD: usize = 256;

/// Units are `(row block of 64, head)` pairs: the tiled kernel shares each
/// converted key tile across the rows of a block.
pub(super) fn split(q_rows: usize, p: &AttentionParams, threads: usize) -> WorkSplit {
    let total = q_rows.div_ceil(TILE) * p.heads;
    WorkSplit::new(total, total.div_ceil(threads * 4).max(1))
}

/// Position held by cache slot `slot` once positions `0..end` are written.
fn slot_position(slot: usize, end: usize, ring: Option<u32>) -> Option<usize> {
    match ring {
        None => (slot < end).then_some(slot),
        Some(r) => {
            let r = r as usize;
            (slot < r && slot < end).then(|| slot + (end - 1 - slot) / r * r)
        }
    }
}

/// Geometry shared by the kernels (the fast ones too).
pub(super) struct Ctx<'a> {
    pub(super) p: &'a AttentionParams,
    pub(super) k: &'a HostTensor,
    pub(super) v: &'a HostTensor,
    /// Positions written (visible to the last query).
    pub(super) end: usize,
    /// Cache slots to scan.
    pub(super) cells: usize,
    pub(super) kv_stride: usize,
}

/// Cache slots an attention over `q_rows` query rows scans.
pub(super) fn cells(q_rows: usize, k_rows: usize, p: &AttentionParams) -> usize {
    let end = p.q_position as usize + q_rows;
    match p.ring {
        Some(r) => (r as usize).min(k_rows),
        None => end.min(k_rows),
    }
}

impl<'a> Ctx<'a> {
    pub(super) fn new(
        p: &'a AttentionParams,
        q_rows: usize,
        k: &'a HostTensor,
        v: &'a HostTensor,
    ) -> Ctx<'a> {
        Ctx {
            p,
            k,
            v,
            end: p.q_position as usize + q_rows,
            cells: cells(q_rows, k.tensor.rows(), p),
            kv_stride: k.tensor.cols(),
        }
    }

    pub(super) fn visible(&self, slot: usize, pos: usize) -> bool {
        if self.p.ring.is_none() {
            return slot <= pos && self.p.window.is_none_or(|w| pos - slot < w as usize);
        }
        match slot_position(slot, self.end, self.p.ring) {
            Some(c) => c <= pos && self.p.window.is_none_or(|w| pos - c < w as usize),
            None => false,
        }
    }

    /// Key (or value) row of `slot` for kv head `kvh`, as f32.
    unsafe fn row_f32(&self, t: &HostTensor, slot: usize, kvh: usize, out: &mut [f32]) {
        let offset = slot * self.kv_stride + kvh * self.p.head_dim;
        let d = self.p.head_dim;
        if t.tensor.dtype == DType::F16 {
            let src = std::slice::from_raw_parts((t.ptr as *const f16).add(offset), d);
            half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, out);
        } else {
            out.copy_from_slice(std::slice::from_raw_parts(
                (t.ptr as *const f32).add(offset),
                d,
            ));
        }
    }

    unsafe fn row_f16<'b>(&self, t: &HostTensor, slot: usize, kvh: usize) -> &'b [f16] {
        let offset = slot * self.kv_stride + kvh * self.p.head_dim;
        std::slice::from_raw_parts((t.ptr as *const f16).add(offset), self.p.head_dim)
    }

    /// Does any query in `positions` see a cell of `tile`?
    pub(super) fn tile_seen(&self, tile: Range<usize>, positions: Range<usize>) -> bool {
        if self.p.ring.is_none() && !tile.is_empty() && !positions.is_empty() {
            let (first, last) = (positions.start, positions.end - 1);
            let newest_needed = tile.start <= last;
            let oldest_needed = self
                .p
                .window
                .is_none_or(|w| tile.end - 1 + w as usize > first);
            return newest_needed && oldest_needed;
        }
        tile.clone()
            .any(|c| positions.clone().any(|pos| self.visible(c, pos)))
    }

    /// Scores of a 64-wide tile: scaled (and capped) where the query at
    /// `pos` sees the cell, `-inf` elsewhere and past the tile's end.
    fn mask_and_scale(&self, kq: &mut [f32; TILE], tile: Range<usize>, pos: usize) {
        let plain = self.p.ring.is_none();
        let (lo, hi) = if plain {
            let hi = (pos + 1).saturating_sub(tile.start).min(tile.len());
            let oldest = self
                .p
                .window
                .map_or(0, |w| (pos + 1).saturating_sub(w as usize));
            (oldest.saturating_sub(tile.start).min(hi), hi)
        } else {
            (0, tile.len())
        };
        for (j, s) in kq.iter_mut().enumerate() {
            let seen = j >= lo && j < hi && (plain || self.visible(tile.start + j, pos));
            *s = if seen {
                self.scaled(*s)
            } else {
                f32::NEG_INFINITY
            };
        }
    }

    /// Score scale and soft-cap as ggml applies them (scale pre-divided by the cap).
    pub(super) fn scaled(&self, s: f32) -> f32 {
        if self.p.softcap != 0.0 {
            self.p.softcap * (s * (self.p.scale / self.p.softcap)).tanh()
        } else {
            s * self.p.scale
        }
    }
}

/// Running state of one query row: max, sum and unnormalised output.
struct Partial {
    m: f32,
    s: f32,
    out: Vec<f32>,
}

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn attention(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    out: &HostTensor,
    p: &AttentionParams,
    units: Range<usize>,
) -> Result<(), OpError> {
    if !p.flash
        && (k.tensor.dtype != DType::F16 || v.tensor.dtype != DType::F16 || p.softcap != 0.0)
    {
        return Err(OpError::Unsupported {
            op: "attention",
            what: format!(
                "flash attention off with {} keys, {} values and soft-cap {} (f16 keys and values, no soft-cap)",
                k.tensor.dtype, v.tensor.dtype, p.softcap
            ),
        });
    }
    let n = q.tensor.rows();
    let ctx = Ctx::new(p, n, k, v);
    let end = ctx.end;
    let padded = end.div_ceil(KV_PAD).max(1) * KV_PAD;
    let capacity = if p.kv_capacity > 0 {
        p.kv_capacity as usize
    } else {
        k.tensor.rows()
    };
    let n_kv = padded.min(capacity);
    let qv = q.f32s();
    let o = out.ptr as *mut f32;
    let d = p.head_dim;
    for unit in units {
        let (block, h) = (unit / p.heads, unit % p.heads);
        let rows = block * TILE..((block + 1) * TILE).min(n);
        let ubatch_start = rows.start / UBATCH * UBATCH;
        let ubatch_rows = (n - ubatch_start).min(UBATCH);
        let qrow = |t: usize| &qv[t * q.tensor.cols() + h * d..][..d];
        let results: Vec<Vec<f32>> = if !p.flash {
            let vt = values_transposed(&ctx, h, n_kv);
            rows.clone()
                .map(|t| {
                    let pos = p.q_position as usize + t;
                    unfused(&ctx, qrow(t), h, pos, n_kv, ubatch_rows, &vt)
                })
                .collect()
        } else if n == 1 && n_kv >= 512 {
            vec![split_kv(&ctx, qrow(0), h, n_kv)]
        } else if ubatch_rows >= TILE {
            tiled(&ctx, rows.clone(), &qrow, h)
        } else {
            rows.clone()
                .map(|t| {
                    let part = one_chunk(&ctx, qrow(t), h, p.q_position as usize + t, 0..ctx.cells);
                    normalise(part)
                })
                .collect()
        };
        for (t, values) in rows.zip(results) {
            let dst = o.add(t * out.tensor.cols() + h * d);
            std::ptr::copy_nonoverlapping(values.as_ptr(), dst, d);
        }
    }
    Ok(())
}

/// The values of kv head `h`'s group as llama.cpp's cache holds them with
/// flash attention off: transposed, `n_kv` cells per dimension, zero in
/// the cells nothing has written.
unsafe fn values_transposed(ctx: &Ctx<'_>, h: usize, n_kv: usize) -> Vec<f16> {
    let d = ctx.p.head_dim;
    let kvh = h / (ctx.p.heads / ctx.p.kv_heads);
    let mut vt = vec![f16::ZERO; d * n_kv];
    for slot in 0..ctx.cells.min(n_kv) {
        for (dim, &v) in ctx.row_f16(ctx.v, slot, kvh).iter().enumerate() {
            vt[dim * n_kv + slot] = v;
        }
    }
    vt
}

/// llama.cpp's attention with flash attention off, for the query at `pos`
/// of a ubatch of `n` rows: the query rounded to f16, the scores as an f16
/// matmul over the `n_kv` cells of the padded cache view, `soft_max_ext`
/// (scaled scores plus a mask of 0 or -inf, `ggml_v_expf` per 16 lanes, the
/// sum in f64, the probabilities scaled by its f32 reciprocal), then the
/// probabilities rounded to f16 and multiplied with the transposed values
/// `vt` ([`values_transposed`]). Each matmul sums in tinyBLAS's order for
/// two or more rows (`llamafile_sgemm`), in `ggml_vec_dot_f16`'s for one.
unsafe fn unfused(
    ctx: &Ctx<'_>,
    qrow: &[f32],
    h: usize,
    pos: usize,
    n_kv: usize,
    n: usize,
    vt: &[f16],
) -> Vec<f32> {
    let p = ctx.p;
    let d = p.head_dim;
    let kvh = h / (p.heads / p.kv_heads);
    let dot = |a: &[f16], b: &[f16], m: usize| -> f32 {
        if tinyblas_applies(DType::F16, a.len(), m, n) {
            tinyblas_dot_f16(bytemuck::cast_slice(a), bytemuck::cast_slice(b), a.len())
        } else {
            dot_f16(a, b)
        }
    };
    let mut q16 = vec![f16::ZERO; d];
    to_f16(qrow, &mut q16);
    let mut w = vec![f32::NEG_INFINITY; n_kv];
    for (slot, s) in w.iter_mut().enumerate().take(ctx.cells) {
        if ctx.visible(slot, pos) {
            // The mask adds 0 where the query sees the cell.
            *s = dot(ctx.row_f16(ctx.k, slot, kvh), &q16, n_kv) * p.scale + 0.0;
        }
    }
    let max = w.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let mut sum = 0f64;
    let mut chunks = w.chunks_exact_mut(16);
    for c in &mut chunks {
        let mut lanes = [0f32; 16];
        for (l, x) in lanes.iter_mut().zip(c.iter_mut()) {
            *x = v_expf(*x - max);
            *l = *x;
        }
        sum += reduce16(&lanes) as f64;
    }
    for x in chunks.into_remainder() {
        *x = (*x - max).exp();
        sum += *x as f64;
    }
    let inv = (1.0 / sum) as f32;
    let mut p16 = vec![f16::ZERO; n_kv];
    for (o, &x) in p16.iter_mut().zip(&w) {
        *o = f16::from_f32(x * inv);
    }
    vt.chunks_exact(n_kv).map(|row| dot(row, &p16, d)).collect()
}

/// `out / s` (zero when nothing was visible).
fn normalise(mut part: Partial) -> Vec<f32> {
    let inv = if part.s == 0.0 { 0.0 } else { 1.0 / part.s };
    part.out.iter_mut().for_each(|x| *x *= inv);
    part.out
}

/// llama.cpp's one-chunk kernel over `cells` for the query at `pos`.
unsafe fn one_chunk(
    ctx: &Ctx<'_>,
    qrow: &[f32],
    h: usize,
    pos: usize,
    cells: Range<usize>,
) -> Partial {
    let p = ctx.p;
    let d = p.head_dim;
    let kvh = h / (p.heads / p.kv_heads);
    let half_k = ctx.k.tensor.dtype == DType::F16;
    let half_v = ctx.v.tensor.dtype == DType::F16;
    let mut q16 = vec![f16::ZERO; d];
    to_f16(qrow, &mut q16);
    let mut acc16 = vec![f16::ZERO; d];
    let mut acc32 = vec![0f32; d];
    let mut row = vec![0f32; d];
    let (mut m, mut s_sum) = (f32::NEG_INFINITY, 0f32);
    for slot in cells {
        if !ctx.visible(slot, pos) {
            continue;
        }
        let raw = if half_k {
            dot_f16(ctx.row_f16(ctx.k, slot, kvh), &q16)
        } else {
            ctx.row_f32(ctx.k, slot, kvh, &mut row);
            super::simd::dot_f32(&row, qrow)
        };
        let s = ctx.scaled(raw);
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            ms = (m - s).exp();
            m = s;
            if half_v {
                scale_f16(&mut acc16, ms);
            } else {
                acc32.iter_mut().for_each(|a| *a *= ms);
            }
        } else {
            vs = (s - m).exp();
        }
        if half_v {
            mad_f16(&mut acc16, ctx.row_f16(ctx.v, slot, kvh), vs);
        } else {
            ctx.row_f32(ctx.v, slot, kvh, &mut row);
            axpy(&mut acc32, vs, &row);
        }
        s_sum = s_sum.mul_add(ms, vs);
    }
    if half_v {
        acc32
            .iter_mut()
            .zip(&acc16)
            .for_each(|(a, x)| *a = x.to_f32());
    }
    Partial {
        m,
        s: s_sum,
        out: acc32,
    }
}

/// llama.cpp's split-KV decode: one-chunk partials over equal slices of the
/// padded view, merged in order.
unsafe fn split_kv(ctx: &Ctx<'_>, qrow: &[f32], h: usize, n_kv: usize) -> Vec<f32> {
    let pos = ctx.end - 1;
    let chunk = n_kv.div_ceil(SPLIT_THREADS);
    let d = ctx.p.head_dim;
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    let mut acc = vec![0f32; d];
    for c in 0..SPLIT_THREADS {
        let start = c * chunk;
        if start >= n_kv {
            continue;
        }
        let cells = start.min(ctx.cells)..((c + 1) * chunk).min(n_kv).min(ctx.cells);
        let part = one_chunk(ctx, qrow, h, pos, cells);
        if part.s == 0.0 {
            continue;
        }
        let m_new = m.max(part.m);
        let (so, sn) = ((m - m_new).exp(), (part.m - m_new).exp());
        for (a, x) in acc.iter_mut().zip(&part.out) {
            *a = a.mul_add(so, x * sn);
        }
        s = s.mul_add(so, part.s * sn);
        m = m_new;
    }
    normalise(Partial { m, s, out: acc })
}

/// llama.cpp's tiled kernel for the query rows `rows` of head `h`.
unsafe fn tiled<'q>(
    ctx: &Ctx<'_>,
    rows: Range<usize>,
    qrow: &impl Fn(usize) -> &'q [f32],
    h: usize,
) -> Vec<Vec<f32>> {
    let p = ctx.p;
    let d = p.head_dim;
    let kvh = h / (p.heads / p.kv_heads);
    let nq = rows.len();
    let mut m = vec![f32::NEG_INFINITY; nq];
    let mut s = vec![0f32; nq];
    let mut acc = vec![vec![0f32; d]; nq];
    // Keys transposed (`[d][64]`), values row by row, as llama.cpp packs them.
    let mut keys_t = vec![0f32; TILE * d];
    let mut vals = vec![0f32; TILE * d];
    let mut row = vec![0f32; d];
    let mut kq = [0f32; TILE];
    let positions = p.q_position as usize + rows.start..p.q_position as usize + rows.end;
    for tile_start in (0..ctx.cells).step_by(TILE) {
        let tile = tile_start..(tile_start + TILE).min(ctx.cells);
        // A tile no row of the block sees is skipped (it would add nothing).
        if !ctx.tile_seen(tile.clone(), positions.clone()) {
            continue;
        }
        keys_t.fill(0.0);
        for (j, c) in tile.clone().enumerate() {
            ctx.row_f32(ctx.k, c, kvh, &mut row);
            for (dd, x) in row.iter().enumerate() {
                keys_t[dd * TILE + j] = *x;
            }
            ctx.row_f32(ctx.v, c, kvh, &mut vals[j * d..(j + 1) * d]);
        }
        for (i, t) in rows.clone().enumerate() {
            let pos = p.q_position as usize + t;
            scores64(qrow(t), &keys_t, &mut kq);
            ctx.mask_and_scale(&mut kq, tile.clone(), pos);
            let tile_max = kq.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b));
            if tile_max == f32::NEG_INFINITY {
                continue;
            }
            let m_new = m[i].max(tile_max);
            if m_new > m[i] {
                let ms = (m[i] - m_new).exp();
                acc[i].iter_mut().for_each(|a| *a *= ms);
                s[i] *= ms;
            }
            m[i] = m_new;
            s[i] = (s[i] as f64 + exp_tile64(&mut kq, m_new)) as f32;
            accumulate(&mut acc[i], &kq, &vals, tile.len());
        }
    }
    acc.into_iter()
        .zip(s)
        .map(|(out, s)| normalise(Partial { m: 0.0, s, out }))
        .collect()
}
