//! The vector paths of the fast decode attention on x86-64: one kernel,
//! written once over a register type ([`Lanes`]), compiled for AVX-512
//! (16 lanes) and for AVX2 with FMA and F16C (8 lanes). The two differ in
//! how many cells' scores one transpose tree reduces and in their float
//! order, not in what they compute; each is within the bound the module
//! above states.

use super::{mask_and_scale, row_offset, softmax_step, Ctx, HostTensor, Range, TILE};
use half::f16;
use std::arch::x86_64::*;
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

/// A vector register of f32 lanes and the operations the kernel needs.
/// Every method is inlined into a caller compiled with the register's
/// target features (the two entry points above).
trait Lanes {
    type V: Copy;
    const LANES: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, x: Self::V);
    /// `a * b + c`, one rounding.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn reduce_max(x: Self::V) -> f32;
    /// `LANES` f16 values as f32.
    unsafe fn widen(p: *const f16) -> Self::V;
    /// Lane `i` of the result is the sum of the lanes of `x[i]`, for the
    /// first `LANES` entries of `x`.
    unsafe fn sum_lanes(x: &[Self::V; 16]) -> Self::V;
}

struct Avx512;

impl Lanes for Avx512 {
    type V = __m512;
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, x: __m512) {
        _mm512_storeu_ps(p, x)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn reduce_max(x: __m512) -> f32 {
        _mm512_reduce_max_ps(x)
    }
    #[inline(always)]
    unsafe fn widen(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn sum_lanes(x: &[__m512; 16]) -> __m512 {
        // Pairs: each 128-bit lane holds two cells' partial sums, interleaved.
        let mut pairs = [_mm512_setzero_ps(); 8];
        for (i, pair) in pairs.iter_mut().enumerate() {
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            *pair = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        }
        // Quads: each 128-bit lane holds four consecutive cells.
        let mut quads = [_mm512_setzero_ps(); 4];
        for (i, quad) in quads.iter_mut().enumerate() {
            let (a, b) = (pairs[2 * i], pairs[2 * i + 1]);
            *quad = _mm512_add_ps(
                _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
                _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
            );
        }
        // `[a0 + a1, a2 + a3, b0 + b1, b2 + b3]` of the 128-bit lanes.
        let fold = |a, b| {
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
            )
        };
        fold(fold(quads[0], quads[1]), fold(quads[2], quads[3]))
    }
}

struct Avx2;

impl Lanes for Avx2 {
    type V = __m256;
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, x: __m256) {
        _mm256_storeu_ps(p, x)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        _mm256_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn reduce_max(x: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m)))
    }
    #[inline(always)]
    unsafe fn widen(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn sum_lanes(x: &[__m256; 16]) -> __m256 {
        // Pairs, then quads, within each 128-bit half (as for AVX-512);
        // then the halves of two quads added across.
        let mut pairs = [_mm256_setzero_ps(); 4];
        for (i, pair) in pairs.iter_mut().enumerate() {
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            *pair = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
        }
        let quad = |a, b| {
            _mm256_add_ps(
                _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
                _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
            )
        };
        let (lo, hi) = (quad(pairs[0], pairs[1]), quad(pairs[2], pairs[3]));
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(lo, hi),
            _mm256_permute2f128_ps::<0x31>(lo, hi),
        )
    }
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
