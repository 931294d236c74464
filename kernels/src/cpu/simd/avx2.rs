//! The AVX2 (with FMA and F16C) versions of the helpers above: the same
//! bits as their scalar specifications and their AVX-512 versions. Each
//! 16-lane register of those is two 8-lane registers here, every lane
//! computing the same fused operations in the same order; reductions run
//! on the stored lanes in the specification's order. Without them an
//! AVX2 machine ran the scalar specifications, where every `mul_add` is a
//! library call.

use half::f16;
use std::arch::x86_64::*;

#[inline(always)]
unsafe fn load_f16(p: *const f16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[inline(always)]
unsafe fn store_f16(p: *mut f16, x: __m256) {
    _mm_storeu_si128(
        p as *mut __m128i,
        _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x),
    )
}

/// ggml's AVX-512 `vec_dot_f16` order: four 16-lane accumulators (here
/// `acc[2j]` and `acc[2j + 1]` are accumulator `j`'s lanes 0-7 and 8-15),
/// folded 0+2, 1+3, then 0+1, reduced, the tail added in f64.
#[target_feature(enable = "avx2,f16c,fma")]
pub unsafe fn dot_f16(a: *const f16, b: *const f16, n: usize) -> f32 {
    let body = n - n % 64;
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut i = 0;
    while i < body {
        for (k, s) in acc.iter_mut().enumerate() {
            let at = i + 8 * k;
            *s = _mm256_fmadd_ps(load_f16(a.add(at)), load_f16(b.add(at)), *s);
        }
        i += 64;
    }
    let mut lanes = [0f32; 16];
    for h in 0..2 {
        let s0 = _mm256_add_ps(acc[h], acc[4 + h]);
        let s1 = _mm256_add_ps(acc[2 + h], acc[6 + h]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * h), _mm256_add_ps(s0, s1));
    }
    let mut sum = super::reduce16(&lanes) as f64;
    for k in body..n {
        sum += ((*a.add(k)).to_f32() * (*b.add(k)).to_f32()) as f64;
    }
    sum as f32
}

/// `y = f16(f32(y) * s)`.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn scale_f16(y: *mut f16, n: usize, s: f32) {
    let body = n - n % 8;
    let v = _mm256_set1_ps(s);
    let mut i = 0;
    while i < body {
        store_f16(y.add(i), _mm256_mul_ps(load_f16(y.add(i)), v));
        i += 8;
    }
    for k in body..n {
        *y.add(k) = f16::from_f32((*y.add(k)).to_f32() * s);
    }
}

/// `y = f16(fma(x, s, y))`.
#[target_feature(enable = "avx2,f16c,fma")]
pub unsafe fn mad_f16(y: *mut f16, x: *const f16, n: usize, s: f32) {
    let body = n - n % 8;
    let v = _mm256_set1_ps(s);
    let mut i = 0;
    while i < body {
        let r = _mm256_fmadd_ps(load_f16(x.add(i)), v, load_f16(y.add(i)));
        store_f16(y.add(i), r);
        i += 8;
    }
    for k in body..n {
        *y.add(k) = f16::from_f32((*x.add(k)).to_f32().mul_add(s, (*y.add(k)).to_f32()));
    }
}

/// `2^k` for integral `k` in [-126, 127], from the exponent bits.
#[inline(always)]
unsafe fn pow2(k: __m256i) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        k,
        _mm256_set1_epi32(127),
    )))
}

/// `j * 2^n` for integral `n` in [-192, 192], rounded once (as
/// `vscalefps` and the scalar `scalef`): `j` (between 0.5 and 2) is first
/// scaled exactly by `2^±96` where `2^n` alone is not a normal float, so
/// only the second product rounds.
#[inline(always)]
unsafe fn scalef(j: __m256, n: __m256) -> __m256 {
    let ni = _mm256_cvtps_epi32(n);
    let high = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127));
    let low = _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), ni);
    let k1 = _mm256_or_si256(
        _mm256_and_si256(high, _mm256_set1_epi32(96)),
        _mm256_and_si256(low, _mm256_set1_epi32(-96)),
    );
    let k2 = _mm256_sub_epi32(ni, k1);
    _mm256_mul_ps(_mm256_mul_ps(j, pow2(k1)), pow2(k2))
}

/// ggml's AVX-512 `ggml_v_expf`, lane for lane (see `super::v_expf`).
#[inline(always)]
pub(crate) unsafe fn v_expf(x: __m256) -> __m256 {
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let r = c(0x4b40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
    let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let big = _mm256_cmp_ps::<_CMP_GT_OQ>(abs, _mm256_set1_ps(192.0));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
    );
    let res = scalef(j, n);
    if _mm256_movemask_ps(big) == 0 {
        return res;
    }
    let le0 = _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps());
    let alt = _mm256_blendv_ps(_mm256_set1_ps(f32::INFINITY), _mm256_setzero_ps(), le0);
    _mm256_blendv_ps(res, alt, big)
}

/// `out = silu(g) * u` over `n` (a multiple of 8) elements.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn silu_mul(g: *const f32, u: *const f32, out: *mut f32, n: usize) {
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i < n {
        let x = _mm256_loadu_ps(g.add(i));
        let e = v_expf(_mm256_sub_ps(_mm256_setzero_ps(), x));
        let s = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.add(i))));
        i += 8;
    }
}

/// `kq[j] = v_expf(kq[j] - max)` for 64 values; the sum of each 16
/// reduced, added in f64.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn exp_tile64(kq: *mut f32, max: f32) -> f64 {
    let m = _mm256_set1_ps(max);
    let mut sum = 0f64;
    for c in 0..4 {
        let mut lanes = [0f32; 16];
        for h in 0..2 {
            let p = kq.add(16 * c + 8 * h);
            let v = v_expf(_mm256_sub_ps(_mm256_loadu_ps(p), m));
            _mm256_storeu_ps(p, v);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * h), v);
        }
        sum += super::reduce16(&lanes) as f64;
    }
    sum
}

/// `acc[c] = fma(p[j], vals[j][c], acc[c])` for j in order, `d` (a multiple
/// of 8) columns, 64 columns kept in registers at a time.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn accumulate(acc: *mut f32, d: usize, p: *const f32, vals: *const f32, keys: usize) {
    let mut c0 = 0;
    while c0 < d {
        let regs = ((d - c0) / 8).min(8);
        let mut r = [_mm256_setzero_ps(); 8];
        for (k, reg) in r.iter_mut().enumerate().take(regs) {
            *reg = _mm256_loadu_ps(acc.add(c0 + 8 * k));
        }
        for j in 0..keys {
            let pj = _mm256_set1_ps(*p.add(j));
            let row = vals.add(j * d + c0);
            for (k, reg) in r.iter_mut().enumerate().take(regs) {
                *reg = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(8 * k)), pj, *reg);
            }
        }
        for (k, reg) in r.iter().enumerate().take(regs) {
            _mm256_storeu_ps(acc.add(c0 + 8 * k), *reg);
        }
        c0 += 8 * regs;
    }
}

/// `acc = fma(v, p, acc)` over `n` (a multiple of 8) elements.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn axpy(acc: *mut f32, p: f32, v: *const f32, n: usize) {
    let pv = _mm256_set1_ps(p);
    let mut i = 0;
    while i < n {
        let a = _mm256_loadu_ps(acc.add(i));
        _mm256_storeu_ps(
            acc.add(i),
            _mm256_fmadd_ps(_mm256_loadu_ps(v.add(i)), pv, a),
        );
        i += 8;
    }
}

/// `out[j] = chain of fma(q[k], kt[k * 64 + j], .)` over k, for 64 keys.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scores64(q: *const f32, d: usize, kt: *const f32, out: *mut f32) {
    let mut acc = [_mm256_setzero_ps(); 8];
    for k in 0..d {
        let qv = _mm256_set1_ps(*q.add(k));
        for (r, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(_mm256_loadu_ps(kt.add(k * 64 + r * 8)), qv, *a);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(out.add(r * 8), *a);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{dot_ggml, reduce16, v_expf as scalar_expf};
    use half::f16;

    fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// A fixed pseudo-random sequence in [-scale, scale).
    fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    /// Every helper gives its scalar specification's bits.
    #[test]
    fn avx2_helpers_match_the_scalar_specifications() {
        if !available() {
            eprintln!("skipping: this machine has no AVX2 with FMA and F16C");
            return;
        }
        let h = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
        for n in [0, 8, 63, 64, 130, 256, 301] {
            let (a, b) = (h(&values(n, 1, 2.0)), h(&values(n, 2, 3.0)));
            // SAFETY: AVX2, FMA and F16C are available; both hold n values.
            let got = unsafe { super::dot_f16(a.as_ptr(), b.as_ptr(), n) };
            let want = dot_ggml(n, |i| (a[i].to_f32(), b[i].to_f32()));
            assert_eq!(got.to_bits(), want.to_bits(), "dot_f16 n={n}");

            let (mut y1, mut y2) = (a.clone(), a.clone());
            // SAFETY: as above.
            unsafe { super::mad_f16(y1.as_mut_ptr(), b.as_ptr(), n, 0.37) };
            for (v, x) in y2.iter_mut().zip(&b) {
                *v = f16::from_f32(x.to_f32().mul_add(0.37, v.to_f32()));
            }
            assert_eq!(y1, y2, "mad_f16 n={n}");
            // SAFETY: as above.
            unsafe { super::scale_f16(y1.as_mut_ptr(), n, 0.71) };
            y2.iter_mut()
                .for_each(|v| *v = f16::from_f32(v.to_f32() * 0.71));
            assert_eq!(y1, y2, "scale_f16 n={n}");
        }
        for d in [8, 64, 80, 256] {
            let keys = 37;
            let (p, vals) = (values(keys, 3, 1.0), values(keys * d, 4, 1.0));
            let (mut a1, mut a2) = (values(d, 5, 1.0), values(d, 5, 1.0));
            // SAFETY: as above; vals holds keys * d values.
            unsafe { super::accumulate(a1.as_mut_ptr(), d, p.as_ptr(), vals.as_ptr(), keys) };
            for j in 0..keys {
                for (a, x) in a2.iter_mut().zip(&vals[j * d..(j + 1) * d]) {
                    *a = p[j].mul_add(*x, *a);
                }
            }
            assert_eq!(a1, a2, "accumulate d={d}");
            // SAFETY: as above.
            unsafe { super::axpy(a1.as_mut_ptr(), 0.3, vals.as_ptr(), d) };
            for (a, x) in a2.iter_mut().zip(&vals) {
                *a = 0.3f32.mul_add(*x, *a);
            }
            assert_eq!(a1, a2, "axpy d={d}");
            let (q, kt) = (values(d, 6, 1.0), values(d * 64, 7, 1.0));
            let mut got = [0f32; 64];
            // SAFETY: as above; kt holds d * 64 values.
            unsafe { super::scores64(q.as_ptr(), d, kt.as_ptr(), got.as_mut_ptr()) };
            let mut want = [0f32; 64];
            for (k, qk) in q.iter().enumerate() {
                for (j, s) in want.iter_mut().enumerate() {
                    *s = qk.mul_add(kt[k * 64 + j], *s);
                }
            }
            assert_eq!(got, want, "scores64 d={d}");
        }
    }

    /// The exponential, lane for lane, over ordinary arguments, results
    /// near and past f32's range (subnormal, overflow, the `|n| > 192`
    /// cut-offs), infinities and NaN; then silu and the tile sums.
    #[test]
    fn avx2_exponential_matches_the_scalar_one() {
        if !available() {
            eprintln!("skipping: this machine has no AVX2 with FMA and F16C");
            return;
        }
        let mut xs: Vec<f32> = (0..8192).map(|i| (i as f32 - 4096.0) * 0.0317).collect();
        xs.extend(values(4096, 8, 120.0));
        xs.extend([
            -87.3,
            -88.7,
            -89.4,
            -95.0,
            -103.2,
            -103.9,
            -104.0,
            -126.0,
            -133.0,
            -140.0,
            -150.0,
            88.2,
            88.72,
            88.73,
            89.0,
            90.0,
            133.0,
            135.0,
            -0.0,
            0.0,
            1e-30,
            -1e-30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN,
        ]);
        while !xs.len().is_multiple_of(64) {
            xs.push(0.5);
        }
        let up = values(xs.len(), 9, 2.0);
        let mut got = vec![0f32; xs.len()];
        // SAFETY: AVX2 and FMA are available; all hold xs.len() values.
        unsafe { super::silu_mul(xs.as_ptr(), up.as_ptr(), got.as_mut_ptr(), xs.len()) };
        for (i, &x) in xs.iter().enumerate() {
            let want = x / (1.0 + scalar_expf(0.0 - x)) * up[i];
            assert_eq!(got[i].to_bits(), want.to_bits(), "silu({x})");
        }
        for tile in xs.chunks_exact(64) {
            for max in [0.0f32, 3.5, -20.0] {
                let mut kq: [f32; 64] = tile.try_into().unwrap();
                let mut want = kq;
                // SAFETY: as above; kq holds 64 values.
                let sum = unsafe { super::exp_tile64(kq.as_mut_ptr(), max) };
                let mut want_sum = 0f64;
                for chunk in want.chunks_exact_mut(16) {
                    chunk.iter_mut().for_each(|x| *x = scalar_expf(*x - max));
                    want_sum += reduce16(&(&*chunk).try_into().unwrap()) as f64;
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&kq), bits(&want), "exp tile at max {max}");
                assert_eq!(
                    sum.to_bits(),
                    want_sum.to_bits(),
                    "exp tile sum at max {max}"
                );
            }
        }
    }
}
