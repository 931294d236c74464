//! Prefill attention, fast numerics: flash attention over blocks of 64
//! query rows, the query heads that share a KV head taking each key and
//! value tile together.
//!
//! One work item is one (block of 64 query rows, KV head) pair, the
//! heaviest blocks (the latest rows, which see the most cells) first.
//! Each tile of 64 cells is widened to f32 once for every query head of
//! the group; the block's queries are kept transposed (`[d][64]`), so the
//! 64 rows' scores against one key are one broadcast multiply-add chain
//! per dimension and the softmax runs across rows, a register of lanes at
//! a time (16 with AVX-512, 8 with AVX2), with ggml's vector `exp`. Values
//! accumulate in f32.
//!
//! Error bound: f32 dot products over `d` terms and an online softmax in
//! f32 with a 1.5-ulp `exp`; against the f64 reference each output is
//! within about `(d + cells / 64) * 2^-24` of the largest value magnitude
//! (tested at 1e-4 relative in `kernels/tests/ops_vs_reference.rs`). The
//! exact kernel's order (keys in tiles summed per row as llama.cpp does)
//! is not kept.

use super::super::attention::Ctx;
use super::super::{HostTensor, WorkSplit};
use half::f16;
use std::ops::Range;
use weft_ops::{AttentionParams, DType};

/// Query rows (and cells) per block.
const TILE: usize = 64;

/// Items: (row block, KV head) pairs.
pub(crate) fn split(q_rows: usize, p: &AttentionParams) -> WorkSplit {
    WorkSplit::new(q_rows.div_ceil(TILE) * p.kv_heads, 1)
}

/// # Safety
/// See [`super::super::run_item`].
pub(crate) unsafe fn attention(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    out: &HostTensor,
    p: &AttentionParams,
    items: Range<usize>,
) {
    let n = q.tensor.rows();
    let ctx = Ctx::new(p, n, k, v);
    let blocks = n.div_ceil(TILE);
    let mut work = Block::new(p.head_dim, p.heads / p.kv_heads);
    for item in items {
        let (rev_block, kvh) = (item / p.kv_heads, item % p.kv_heads);
        let block = blocks - 1 - rev_block;
        let rows = block * TILE..((block + 1) * TILE).min(n);
        work.run(&ctx, q, out, kvh, rows);
    }
}

/// Scratch of one item: the group's transposed queries, the tile's keys
/// and values in f32, scores, and each row's running max, sum and output.
struct Block {
    d: usize,
    group: usize,
    q_t: Vec<f32>,
    keys: Vec<f32>,
    vals: Vec<f32>,
    scores: Vec<f32>,
    m: Vec<f32>,
    s: Vec<f32>,
    acc: Vec<f32>,
}

impl Block {
    fn new(d: usize, group: usize) -> Block {
        Block {
            d,
            group,
            q_t: vec![0.0; group * d * TILE],
            keys: vec![0.0; TILE * d],
            vals: vec![0.0; TILE * d],
            scores: vec![0.0; TILE * TILE],
            m: vec![0.0; group * TILE],
            s: vec![0.0; group * TILE],
            acc: vec![0.0; group * TILE * d],
        }
    }

    unsafe fn run(
        &mut self,
        ctx: &Ctx<'_>,
        q: &HostTensor,
        out: &HostTensor,
        kvh: usize,
        rows: Range<usize>,
    ) {
        let p = ctx.p;
        let (d, group) = (self.d, self.group);
        let qv = q.f32s();
        self.q_t.fill(0.0);
        for g in 0..group {
            let h = kvh * group + g;
            for (i, t) in rows.clone().enumerate() {
                let row = &qv[t * q.tensor.cols() + h * d..][..d];
                for (dd, x) in row.iter().enumerate() {
                    self.q_t[(g * d + dd) * TILE + i] = *x;
                }
            }
        }
        self.m.fill(f32::NEG_INFINITY);
        self.s.fill(0.0);
        self.acc.fill(0.0);
        let first = p.q_position as usize + rows.start;
        let positions = first..p.q_position as usize + rows.end;
        for tile_start in (0..ctx.cells).step_by(TILE) {
            let tile = tile_start..(tile_start + TILE).min(ctx.cells);
            if !ctx.tile_seen(tile.clone(), positions.clone()) {
                continue;
            }
            for (j, c) in tile.clone().enumerate() {
                widen(ctx, ctx.k, c, kvh, &mut self.keys[j * d..(j + 1) * d]);
                widen(ctx, ctx.v, c, kvh, &mut self.vals[j * d..(j + 1) * d]);
            }
            for g in 0..group {
                self.tile(ctx, g, tile.clone(), first, rows.len());
            }
        }
        let o = out.ptr as *mut f32;
        for g in 0..group {
            let h = kvh * group + g;
            for (i, t) in rows.clone().enumerate() {
                let slot = g * TILE + i;
                let inv = if self.s[slot] == 0.0 {
                    0.0
                } else {
                    1.0 / self.s[slot]
                };
                let dst = std::slice::from_raw_parts_mut(o.add(t * out.tensor.cols() + h * d), d);
                for (x, a) in dst.iter_mut().zip(&self.acc[slot * d..(slot + 1) * d]) {
                    *x = a * inv;
                }
            }
        }
    }

    /// One key tile for query head `g` of the group: scores, masks, the
    /// online softmax across rows and the value sums.
    unsafe fn tile(
        &mut self,
        ctx: &Ctx<'_>,
        g: usize,
        tile: Range<usize>,
        first: usize,
        nr: usize,
    ) {
        let d = self.d;
        let q_t = &self.q_t[g * d * TILE..(g + 1) * d * TILE];
        scores(q_t, &self.keys, d, tile.len(), &mut self.scores);
        // Every row sees every cell of a tile wholly before the block (in
        // a window that reaches it): only the diagonal and the window's
        // edge need the per-cell mask.
        let p = ctx.p;
        let all_seen = p.ring.is_none()
            && tile.end <= first + 1
            && p.window
                .is_none_or(|w| first + nr - 1 - tile.start < w as usize);
        for (j, c) in tile.clone().enumerate() {
            let row = &mut self.scores[j * TILE..(j + 1) * TILE];
            if all_seen {
                row[..nr].iter_mut().for_each(|x| *x = ctx.scaled(*x));
                row[nr..].fill(f32::NEG_INFINITY);
                continue;
            }
            for (i, x) in row.iter_mut().enumerate() {
                *x = if i < nr && ctx.visible(c, first + i) {
                    ctx.scaled(*x)
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
        let m = &mut self.m[g * TILE..(g + 1) * TILE];
        let s = &mut self.s[g * TILE..(g + 1) * TILE];
        let acc = &mut self.acc[g * TILE * d..(g + 1) * TILE * d];
        let mut tile_max = [f32::NEG_INFINITY; TILE];
        for j in 0..tile.len() {
            for (t, x) in tile_max
                .iter_mut()
                .zip(&self.scores[j * TILE..(j + 1) * TILE])
            {
                *t = t.max(*x);
            }
        }
        // The maxima the exponentials subtract: a row that has seen
        // nothing yet subtracts 0 (its scores are all -inf, so exp gives 0).
        let mut base = [0f32; TILE];
        for i in 0..nr {
            let m_new = m[i].max(tile_max[i]);
            if m_new > m[i] && m[i] > f32::NEG_INFINITY {
                let r = (m[i] - m_new).exp();
                acc[i * d..(i + 1) * d].iter_mut().for_each(|a| *a *= r);
                s[i] *= r;
            }
            m[i] = m_new;
            base[i] = if m_new == f32::NEG_INFINITY {
                0.0
            } else {
                m_new
            };
        }
        exp_rows(&mut self.scores[..tile.len() * TILE], &base);
        for j in 0..tile.len() {
            for (x, p) in s.iter_mut().zip(&self.scores[j * TILE..(j + 1) * TILE]) {
                *x += p;
            }
        }
        accumulate(&self.scores, &self.vals, d, tile.len(), nr, acc);
    }
}

/// Row `slot`'s key or value for KV head `kvh`, as f32.
unsafe fn widen(ctx: &Ctx<'_>, t: &HostTensor, slot: usize, kvh: usize, dst: &mut [f32]) {
    let offset = slot * ctx.kv_stride + kvh * ctx.p.head_dim;
    let d = dst.len();
    if t.tensor.dtype == DType::F16 {
        let src = std::slice::from_raw_parts((t.ptr as *const f16).add(offset), d);
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst);
    } else {
        dst.copy_from_slice(std::slice::from_raw_parts(
            (t.ptr as *const f32).add(offset),
            d,
        ));
    }
}

/// `scores[j][i] = sum_d q_t[d][i] * keys[j][d]` for `keys` keys and 64 rows.
fn scores(q_t: &[f32], keys: &[f32], d: usize, n_keys: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::avx512() {
        // SAFETY: AVX-512F is available; q_t holds d * 64 values, keys
        // n_keys * d, out 64 * 64.
        return unsafe {
            x86::avx512::scores(q_t.as_ptr(), keys.as_ptr(), d, n_keys, out.as_mut_ptr())
        };
    }
    #[cfg(target_arch = "x86_64")]
    if super::avx2() {
        // SAFETY: AVX2 and FMA are available; sizes as above.
        return unsafe {
            x86::avx2::scores(q_t.as_ptr(), keys.as_ptr(), d, n_keys, out.as_mut_ptr())
        };
    }
    for j in 0..n_keys {
        let row = &mut out[j * TILE..(j + 1) * TILE];
        row.fill(0.0);
        for dd in 0..d {
            let k = keys[j * d + dd];
            for (x, qv) in row.iter_mut().zip(&q_t[dd * TILE..(dd + 1) * TILE]) {
                *x += qv * k;
            }
        }
    }
}

/// `x[j][i] = exp(x[j][i] - base[i])` with ggml's vector `exp`.
fn exp_rows(x: &mut [f32], base: &[f32; TILE]) {
    #[cfg(target_arch = "x86_64")]
    if super::avx512() {
        // SAFETY: AVX-512F is available; x holds whole rows of 64.
        return unsafe { x86::avx512::exp_rows(x.as_mut_ptr(), x.len() / TILE, base.as_ptr()) };
    }
    #[cfg(target_arch = "x86_64")]
    if super::avx2() {
        // SAFETY: AVX2 and FMA are available; x holds whole rows of 64.
        return unsafe { x86::avx2::exp_rows(x.as_mut_ptr(), x.len() / TILE, base.as_ptr()) };
    }
    for row in x.chunks_exact_mut(TILE) {
        for (v, b) in row.iter_mut().zip(base) {
            *v = super::super::simd::v_expf(*v - b);
        }
    }
}

/// `acc[i] += sum_j p[j][i] * vals[j]` for the first `nr` rows.
fn accumulate(p: &[f32], vals: &[f32], d: usize, n_keys: usize, nr: usize, acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::avx512() && d.is_multiple_of(16) && d <= 256 {
        // SAFETY: AVX-512F is available; p holds n_keys rows of 64, vals
        // n_keys * d values, acc nr * d.
        return unsafe {
            x86::avx512::accumulate(p.as_ptr(), vals.as_ptr(), d, n_keys, nr, acc.as_mut_ptr())
        };
    }
    #[cfg(target_arch = "x86_64")]
    if super::avx2() && d.is_multiple_of(8) {
        // SAFETY: AVX2 and FMA are available; sizes as above.
        return unsafe {
            x86::avx2::accumulate(p.as_ptr(), vals.as_ptr(), d, n_keys, nr, acc.as_mut_ptr())
        };
    }
    for i in 0..nr {
        let a = &mut acc[i * d..(i + 1) * d];
        for j in 0..n_keys {
            let w = p[j * TILE + i];
            if w != 0.0 {
                for (x, v) in a.iter_mut().zip(&vals[j * d..(j + 1) * d]) {
                    *x += v * w;
                }
            }
        }
    }
}

/// The three loops on vector registers, written once over [`Lanes`] and
/// compiled for each width by the entry points in `avx512` and `avx2`.
/// Each lane does the same operations in the same order at either width.
///
/// [`Lanes`]: crate::cpu::fast::lanes::Lanes
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::lanes::{Avx2, Avx512, Lanes};
    use super::TILE;

    /// Registers that hold a row of [`TILE`] values at the narrowest width
    /// (8 lanes).
    const ROW_REGS: usize = TILE / 8;

    /// The most registers of one output row that [`accumulate`] holds at
    /// once: half of AVX-512's register file (AVX2 holds half of its, 8).
    const ACC_REGS: usize = 16;

    /// `scores`, `exp_rows` and `accumulate` compiled with the target
    /// features of `$lanes`, in a module `$name`.
    macro_rules! entry_points {
        ($name:ident, $lanes:ident, $features:literal) => {
            pub(super) mod $name {
                use super::$lanes as L;

                /// # Safety
                /// As for `super::scores`; the CPU has the target features.
                #[target_feature(enable = $features)]
                pub(in super::super) unsafe fn scores(
                    q_t: *const f32,
                    keys: *const f32,
                    d: usize,
                    n_keys: usize,
                    out: *mut f32,
                ) {
                    super::scores::<L>(q_t, keys, d, n_keys, out)
                }

                /// # Safety
                /// As for `super::exp_rows`; the CPU has the target features.
                #[target_feature(enable = $features)]
                pub(in super::super) unsafe fn exp_rows(
                    x: *mut f32,
                    rows: usize,
                    base: *const f32,
                ) {
                    super::exp_rows::<L>(x, rows, base)
                }

                /// # Safety
                /// As for `super::accumulate`; the CPU has the target features.
                #[target_feature(enable = $features)]
                pub(in super::super) unsafe fn accumulate(
                    p: *const f32,
                    vals: *const f32,
                    d: usize,
                    n_keys: usize,
                    nr: usize,
                    acc: *mut f32,
                ) {
                    super::accumulate::<L>(p, vals, d, n_keys, nr, acc)
                }
            }
        };
    }

    entry_points!(avx512, Avx512, "avx512f,fma");
    entry_points!(avx2, Avx2, "avx2,fma");

    /// `out[j][i] = sum_d q_t[d][i] * keys[j][d]`: one key's 64 scores in
    /// registers, one multiply-add per dimension.
    ///
    /// # Safety
    /// `L`'s target features are enabled in the caller; `q_t` holds
    /// `d * 64` values, `keys` `n_keys * d`, `out` `n_keys * 64`.
    #[inline(always)]
    unsafe fn scores<L: Lanes>(
        q_t: *const f32,
        keys: *const f32,
        d: usize,
        n_keys: usize,
        out: *mut f32,
    ) {
        let regs = TILE / L::LANES;
        const { assert!(TILE / L::LANES <= ROW_REGS) };
        for j in 0..n_keys {
            let mut acc = [L::zero(); ROW_REGS];
            let k = keys.add(j * d);
            for dd in 0..d {
                let kv = L::splat(*k.add(dd));
                let qrow = q_t.add(dd * TILE);
                for (c, a) in acc.iter_mut().enumerate().take(regs) {
                    *a = L::fmadd(L::load(qrow.add(L::LANES * c)), kv, *a);
                }
            }
            for (c, a) in acc.iter().enumerate().take(regs) {
                L::store(out.add(j * TILE + L::LANES * c), *a);
            }
        }
    }

    /// `x[j][i] = exp(x[j][i] - base[i])` over `rows` rows of 64.
    ///
    /// # Safety
    /// `L`'s target features are enabled in the caller; `x` holds
    /// `rows * 64` values, `base` 64.
    #[inline(always)]
    unsafe fn exp_rows<L: Lanes>(x: *mut f32, rows: usize, base: *const f32) {
        for c in 0..TILE / L::LANES {
            let b = L::load(base.add(L::LANES * c));
            for j in 0..rows {
                let p = x.add(j * TILE + L::LANES * c);
                L::store(p, L::exp(L::sub(L::load(p), b)));
            }
        }
    }

    /// `acc[i] += sum_j p[j][i] * vals[j]` row by row, up to half the
    /// register file of the row's outputs in registers at a time (on
    /// AVX-512 a whole row of up to 256).
    ///
    /// # Safety
    /// `L`'s target features are enabled in the caller; `d` is a multiple
    /// of `L::LANES`; `p` holds `n_keys` rows of 64, `vals` `n_keys * d`
    /// values, `acc` `nr * d`.
    #[inline(always)]
    unsafe fn accumulate<L: Lanes>(
        p: *const f32,
        vals: *const f32,
        d: usize,
        n_keys: usize,
        nr: usize,
        acc: *mut f32,
    ) {
        let most = L::REGISTERS / 2;
        const { assert!(L::REGISTERS / 2 <= ACC_REGS) };
        for i in 0..nr {
            let mut c0 = 0;
            while c0 < d {
                let regs = ((d - c0) / L::LANES).min(most);
                let a = acc.add(i * d + c0);
                let mut r = [L::zero(); ACC_REGS];
                for (c, x) in r.iter_mut().enumerate().take(regs) {
                    *x = L::load(a.add(L::LANES * c));
                }
                for j in 0..n_keys {
                    let w = *p.add(j * TILE + i);
                    if w == 0.0 {
                        continue;
                    }
                    let wv = L::splat(w);
                    let v = vals.add(j * d + c0);
                    for (c, x) in r.iter_mut().enumerate().take(regs) {
                        *x = L::fmadd(L::load(v.add(L::LANES * c)), wv, *x);
                    }
                }
                for (c, x) in r.iter().enumerate().take(regs) {
                    L::store(a.add(L::LANES * c), *x);
                }
                c0 += L::LANES * regs;
            }
        }
    }
}
