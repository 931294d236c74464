//! The vector paths of the fast decode attention on x86-64: one kernel,
//! written once over a register type ([`Lanes`]), compiled for AVX-512
//! (16 lanes) and for AVX2 with FMA and F16C (8 lanes). The two differ in
//! how many cells' scores one transpose tree reduces and in their float
//! order, not in what they compute; each is within the bound the module
//! above states.

use super::super::lanes::{Avx2, Avx512, Lanes};
use super::{mask_and_scale, row_offset, softmax_step, Ctx, HostTensor, Range, TILE};
use half::f16;
use weft_ops::DType;

/// The vector path for head size `d` on this machine, if any: AVX-512
/// where the head is whole 16-lane vectors, else AVX2 where it is whole
/// 8-lane vectors (both follow the process's instruction-set choice).
pub(super) fn kernel(d: usize) -> Option<Kernel> {
    let isa = crate::cpu::quant::Isa::detect().ok()?;
    use crate::cpu::quant::Isa;
    match isa {
        Isa::Avx512 if d.is_multiple_of(Avx512::LANES) => Some(avx512_partials),
        Isa::Avx512 | Isa::Avx2 if d.is_multiple_of(Avx2::LANES) => Some(avx2_partials),
        _ => None,
    }
}

/// [`super::chunk_partials`] on vectors.
pub(super) type Kernel = unsafe fn(&Ctx<'_>, &HostTensor, Range<usize>, Range<usize>, &mut [f32]);

/// # Safety
/// AVX-512F, FMA and F16C are available; `head_dim` is a multiple of 16.
#[target_feature(enable = "avx512f,f16c,fma")]
unsafe fn avx512_partials(
    ctx: &Ctx<'_>,
    q: &HostTensor,
    cells: Range<usize>,
    kv_heads: Range<usize>,
    local: &mut [f32],
) {
    chunk_partials::<Avx512>(ctx, q, cells, kv_heads, local)
}

/// # Safety
/// AVX2, FMA and F16C are available; `head_dim` is a multiple of 8.
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn avx2_partials(
    ctx: &Ctx<'_>,
    q: &HostTensor,
    cells: Range<usize>,
    kv_heads: Range<usize>,
    local: &mut [f32],
) {
    chunk_partials::<Avx2>(ctx, q, cells, kv_heads, local)
}

/// Query heads that read one widened key or value row together.
const HEAD_PASS: usize = 4;

/// `(first head, heads)` of each pass over `heads` query heads, `group`
/// to a KV head: at most [`HEAD_PASS`] heads, never two KV heads'.
fn head_passes(heads: usize, group: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..heads).step_by(group).flat_map(move |first| {
        (first..first + group)
            .step_by(HEAD_PASS)
            .map(move |i0| (i0, HEAD_PASS.min(first + group - i0)))
    })
}

/// [`super::chunk_partials`] tile by tile: each tile's keys, then its
/// values, are widened to f32 once (every KV head's, reading each cell's
/// row front to back) and shared by the query heads and rows of their KV
/// head; the scores of `LANES` cells are reduced together (one transpose
/// tree instead of `LANES` horizontal sums), and the weighted values
/// accumulate in registers across the tile.
///
/// # Safety
/// The target features of `S` are enabled in the caller; `head_dim` is a
/// multiple of `S::LANES`; the tensors are the node's.
#[inline(always)]
unsafe fn chunk_partials<S: Lanes>(
    ctx: &Ctx<'_>,
    q: &HostTensor,
    cells: Range<usize>,
    kv_heads: Range<usize>,
    local: &mut [f32],
) {
    let p = ctx.p;
    let d = p.head_dim;
    let n = q.tensor.rows();
    let qv = q.f32s();
    let group = p.heads / p.kv_heads;
    let heads = kv_heads.start * group..kv_heads.end * group;
    let slots = heads.len() * n;
    let mut m = vec![f32::NEG_INFINITY; slots];
    let mut s = vec![0f32; slots];
    let mut acc = vec![0f32; slots * d];
    // One tile of widened rows, `[kv head][cell][d]`.
    let mut rows = vec![0f32; kv_heads.len() * TILE * d];
    let mut weights = vec![[0f32; TILE]; slots];
    let mut live = vec![false; slots];
    let first_pos = p.q_position as usize;
    for tile_start in cells.clone().step_by(TILE) {
        let tile = tile_start..(tile_start + TILE).min(cells.end);
        if !ctx.tile_seen(tile.clone(), first_pos..first_pos + n) {
            continue;
        }
        widen_rows::<S>(ctx, ctx.k, tile.clone(), kv_heads.clone(), &mut rows);
        // Query heads of one KV head, up to HEAD_PASS at a time, read each
        // widened key once; then each head's softmax step.
        for (i0, count) in head_passes(heads.len(), group) {
            let keys = rows.as_ptr().add(i0 / group * TILE * d);
            for t in 0..n {
                let row =
                    |i: usize| qv[t * q.tensor.cols() + (heads.start + i) * d..][..d].as_ptr();
                let qs: [*const f32; HEAD_PASS] =
                    std::array::from_fn(|g| row(i0 + g.min(count - 1)));
                let rows_out = weights.as_mut_ptr();
                let outs: [*mut f32; HEAD_PASS] = std::array::from_fn(|g| {
                    rows_out.add((i0 + g.min(count - 1)) * n + t) as *mut f32
                });
                match count {
                    1 => scores::<S, 1>(keys, tile.len(), d, &qs[..1], &outs[..1]),
                    2 => scores::<S, 2>(keys, tile.len(), d, &qs[..2], &outs[..2]),
                    3 => scores::<S, 3>(keys, tile.len(), d, &qs[..3], &outs[..3]),
                    _ => scores::<S, 4>(keys, tile.len(), d, &qs, &outs),
                }
                for i in i0..i0 + count {
                    let slot = i * n + t;
                    let kq = &mut weights[slot];
                    mask_and_scale(ctx, kq, tile.clone(), first_pos + t);
                    let tile_max = max_of_tile::<S>(kq);
                    let a = &mut acc[slot * d..(slot + 1) * d];
                    live[slot] = softmax_step(kq, tile_max, &mut m[slot], &mut s[slot], a);
                    if !live[slot] {
                        kq.fill(0.0);
                    }
                }
            }
        }
        widen_rows::<S>(ctx, ctx.v, tile.clone(), kv_heads.clone(), &mut rows);
        for (i0, count) in head_passes(heads.len(), group) {
            let values = rows.as_ptr().add(i0 / group * TILE * d);
            for t in 0..n {
                // The heads of one query row see the same cells.
                if !live[i0 * n + t] {
                    continue;
                }
                let ws: [*const f32; HEAD_PASS] =
                    std::array::from_fn(|g| weights[(i0 + g.min(count - 1)) * n + t].as_ptr());
                let accs: [*mut f32; HEAD_PASS] = std::array::from_fn(|g| {
                    acc.as_mut_ptr()
                        .add((i0 + g.min(count - 1)) * n * d + t * d)
                });
                match count {
                    1 => weighted_values::<S, 1>(values, tile.len(), d, &ws[..1], &accs[..1]),
                    2 => weighted_values::<S, 2>(values, tile.len(), d, &ws[..2], &accs[..2]),
                    3 => weighted_values::<S, 3>(values, tile.len(), d, &ws[..3], &accs[..3]),
                    _ => weighted_values::<S, 4>(values, tile.len(), d, &ws, &accs),
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

/// The rows of `cells` for `kv_heads`, as f32, into `out` laid out
/// `[kv head][cell][d]` with [`TILE`] cells per head.
#[inline(always)]
unsafe fn widen_rows<S: Lanes>(
    ctx: &Ctx<'_>,
    t: &HostTensor,
    cells: Range<usize>,
    kv_heads: Range<usize>,
    out: &mut [f32],
) {
    let d = ctx.p.head_dim;
    for (j, c) in cells.enumerate() {
        for (i, kvh) in kv_heads.clone().enumerate() {
            let offset = row_offset(ctx, c, kvh);
            let dst = out.as_mut_ptr().add((i * TILE + j) * d);
            if t.tensor.dtype == DType::F16 {
                let row = (t.ptr as *const f16).add(offset);
                for i in (0..d).step_by(S::LANES) {
                    S::store(dst.add(i), S::widen(row.add(i)));
                }
            } else {
                std::ptr::copy_nonoverlapping((t.ptr as *const f32).add(offset), dst, d);
            }
        }
    }
}

/// The largest of a tile's scores.
#[inline(always)]
unsafe fn max_of_tile<S: Lanes>(kq: &[f32; TILE]) -> f32 {
    let p = kq.as_ptr();
    let mut m = S::load(p);
    for i in (S::LANES..TILE).step_by(S::LANES) {
        m = S::max(m, S::load(p.add(i)));
    }
    S::reduce_max(m)
}

/// `out[g][j] = k[j] . q[g]` for the `count` (at most 64) rows of `k`, `d`
/// apart, and the `G` query rows `q`; each `out[g]` holds 64.
// The indices run over several arrays at once (each head's query,
// accumulator and output).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn scores<S: Lanes, const G: usize>(
    k: *const f32,
    count: usize,
    d: usize,
    q: &[*const f32],
    out: &[*mut f32],
) {
    for group in (0..count).step_by(S::LANES) {
        let mut sums = [[S::zero(); 16]; G];
        for c in 0..(count - group).min(S::LANES) {
            let row = k.add((group + c) * d);
            let mut acc = [S::zero(); G];
            for i in (0..d).step_by(S::LANES) {
                let kv = S::load(row.add(i));
                for g in 0..G {
                    acc[g] = S::fmadd(kv, S::load(q[g].add(i)), acc[g]);
                }
            }
            for g in 0..G {
                sums[g][c] = acc[g];
            }
        }
        for g in 0..G {
            S::store(out[g].add(group), S::sum_lanes(&sums[g]));
        }
    }
}

/// `acc[g][0..d] += w[g][j] * v[j]` over the `count` rows of `v`, `d`
/// apart, for `G` weight rows that are zero at the same cells (the heads
/// of one query row); each value row is read once for the `G` heads, four
/// registers of outputs of each at a time kept in registers, then one.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn weighted_values<S: Lanes, const G: usize>(
    v: *const f32,
    count: usize,
    d: usize,
    w: &[*const f32],
    acc: &[*mut f32],
) {
    let skip = |j: usize| *w[0].add(j) == 0.0 && (1..G).all(|g| *w[g].add(j) == 0.0);
    let block = 4 * S::LANES;
    let mut r0 = 0;
    while r0 + block <= d {
        let mut a = [[S::zero(); 4]; G];
        for g in 0..G {
            for (l, a) in a[g].iter_mut().enumerate() {
                *a = S::load(acc[g].add(r0 + S::LANES * l));
            }
        }
        for j in 0..count {
            if skip(j) {
                continue;
            }
            let row = v.add(j * d + r0);
            let x: [S::V; 4] = std::array::from_fn(|l| S::load(row.add(S::LANES * l)));
            for g in 0..G {
                let wv = S::splat(*w[g].add(j));
                for l in 0..4 {
                    a[g][l] = S::fmadd(x[l], wv, a[g][l]);
                }
            }
        }
        for g in 0..G {
            for (l, a) in a[g].iter().enumerate() {
                S::store(acc[g].add(r0 + S::LANES * l), *a);
            }
        }
        r0 += block;
    }
    while r0 < d {
        let mut a = [S::zero(); G];
        for g in 0..G {
            a[g] = S::load(acc[g].add(r0));
        }
        for j in 0..count {
            if skip(j) {
                continue;
            }
            let x = S::load(v.add(j * d + r0));
            for g in 0..G {
                a[g] = S::fmadd(x, S::splat(*w[g].add(j)), a[g]);
            }
        }
        for g in 0..G {
            S::store(acc[g].add(r0), a[g]);
        }
        r0 += S::LANES;
    }
}
