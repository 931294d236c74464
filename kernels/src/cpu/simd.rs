//! Small vector helpers whose results match ggml's AVX-512 CPU code bit for
//! bit (16-lane vectors, four accumulators, a fixed reduction tree; exact
//! fused multiply-adds), so weft's attention and activations equal
//! llama.cpp's where the inputs do.
//!
//! Each helper has a scalar definition (the specification, and the path
//! for CPUs without AVX2), an AVX-512 version and an AVX2 version
//! ([`avx2`]), all computing the same bits.

#[cfg(target_arch = "x86_64")]
use super::quant::Isa;
use half::f16;

const LANES: usize = 16;
const STEP: usize = 4 * LANES;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

/// True when the AVX-512 paths run (decided once per process).
#[cfg(target_arch = "x86_64")]
fn avx512() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| matches!(Isa::detect(), Ok(Isa::Avx512)))
}

/// True when the AVX2 paths run: AVX2 with FMA and F16C, but not AVX-512
/// (decided once per process).
#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX2.get_or_init(|| matches!(Isa::detect(), Ok(Isa::Avx2)))
}

/// Sum of 16 lanes in `_mm512_reduce_add_ps`'s order: halves, quarters, pairs.
#[inline(always)]
pub fn reduce16(x: &[f32; LANES]) -> f32 {
    let mut t8 = [0f32; 8];
    for i in 0..8 {
        t8[i] = x[i] + x[i + 8];
    }
    let t4 = [t8[0] + t8[4], t8[1] + t8[5], t8[2] + t8[6], t8[3] + t8[7]];
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

/// Folds ggml's four 16-lane accumulators (0+2, 1+3, then 0+1) and reduces.
fn fold4(acc: &[[f32; LANES]; 4]) -> f32 {
    let lanes: [f32; LANES] =
        std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    reduce16(&lanes)
}

/// `sum(a[i] * b[i])` like ggml's `vec_dot_f32`/`vec_dot_f16`: fused
/// multiply-adds into four 16-lane accumulators per 64 elements, folded and
/// reduced, the tail added in f64.
fn dot_ggml(n: usize, lane: impl Fn(usize) -> (f32, f32)) -> f32 {
    let body = n - n % STEP;
    let mut acc = [[0f32; LANES]; 4];
    for base in (0..body).step_by(STEP) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, a) in lanes.iter_mut().enumerate() {
                let (x, y) = lane(base + j * LANES + l);
                *a = x.mul_add(y, *a);
            }
        }
    }
    let mut sum = if body > 0 { fold4(&acc) as f64 } else { 0.0 };
    for i in body..n {
        let (x, y) = lane(i);
        sum += (x * y) as f64;
    }
    sum as f32
}

/// Dot product of two f16 vectors, ggml's way.
pub fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
    let n = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    if avx512() && n >= STEP {
        // SAFETY: AVX-512F is available (checked above); both slices hold n elements.
        return unsafe { x86::dot_f16(a.as_ptr(), b.as_ptr(), n) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2, FMA and F16C are available; both slices hold n elements.
        return unsafe { avx2::dot_f16(a.as_ptr(), b.as_ptr(), n) };
    }
    dot_ggml(n, |i| (a[i].to_f32(), b[i].to_f32()))
}

/// Dot product of two f32 vectors, ggml's way.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot_ggml(a.len().min(b.len()), |i| (a[i], b[i]))
}

/// `y = f16(f32(y) * s)`.
pub fn scale_f16(y: &mut [f16], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F is available; the pointer covers y.len() elements.
        return unsafe { x86::scale_f16(y.as_mut_ptr(), y.len(), s) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 and F16C are available; the pointer covers y.len() elements.
        return unsafe { avx2::scale_f16(y.as_mut_ptr(), y.len(), s) };
    }
    for v in y {
        *v = f16::from_f32(v.to_f32() * s);
    }
}

/// `y = f16(fma(x, s, y))`, ggml's `vec_mad_f16`.
pub fn mad_f16(y: &mut [f16], x: &[f16], s: f32) {
    let n = y.len().min(x.len());
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F is available; both pointers cover n elements.
        return unsafe { x86::mad_f16(y.as_mut_ptr(), x.as_ptr(), n, s) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2, FMA and F16C are available; both pointers cover n elements.
        return unsafe { avx2::mad_f16(y.as_mut_ptr(), x.as_ptr(), n, s) };
    }
    for (v, xi) in y[..n].iter_mut().zip(&x[..n]) {
        *v = f16::from_f32(xi.to_f32().mul_add(s, v.to_f32()));
    }
}

/// f32 to f16, round to nearest even.
pub fn to_f16(src: &[f32], dst: &mut [f16]) {
    half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src);
}

/// `out = silu(gate) * up`, silu(x) = x / (1 + exp(-x)) with exp as ggml's
/// AVX-512 `ggml_v_expf`.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len().min(up.len()).min(out.len());
    #[cfg(target_arch = "x86_64")]
    let start = if avx512() {
        let start = n - n % LANES;
        // SAFETY: AVX-512F is available; the slices hold at least `start` elements.
        unsafe { x86::silu_mul(gate.as_ptr(), up.as_ptr(), out.as_mut_ptr(), start) };
        start
    } else if avx2() {
        let start = n - n % 8;
        // SAFETY: AVX2 and FMA are available; the slices hold at least `start` elements.
        unsafe { avx2::silu_mul(gate.as_ptr(), up.as_ptr(), out.as_mut_ptr(), start) };
        start
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let start = 0;
    for i in start..n {
        let g = gate[i];
        out[i] = g / (1.0 + v_expf(0.0 - g)) * up[i];
    }
}

/// ggml's AVX-512 `ggml_v_expf` for one lane: a degree-5 polynomial on the
/// reduced argument and an exact scaling by `2^n` (max error ~1.5 ulp).
#[inline(always)]
pub fn v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),
        (-n).mul_add(f32::from_bits(0x3f31_7200), x),
    );
    let u = b * b;
    let p = f32::from_bits(0x3c07_2010).mul_add(b, f32::from_bits(0x3d2b_9f17));
    let q = f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb));
    let j = p
        .mul_add(u, q)
        .mul_add(u, f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scalef(j, n)
}

/// `j * 2^n` for integral `n` in [-192, 192], rounded once (as `vscalefps`).
#[inline(always)]
fn scalef(j: f32, n: f32) -> f32 {
    let n = n as i32;
    // Two exact power-of-two factors keep every step in f64's range.
    let half = n / 2;
    let p1 = f64::from_bits(((1023 + half) as u64) << 52);
    let p2 = f64::from_bits(((1023 + n - half) as u64) << 52);
    (j as f64 * p1 * p2) as f32
}

/// `acc[d] = fma(p, v[d], acc[d])` for every d (one step of `simd_gemm`).
pub fn axpy(acc: &mut [f32], p: f32, v: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx512() && acc.len().is_multiple_of(LANES) {
        // SAFETY: AVX-512F is available; both slices hold acc.len() elements.
        return unsafe { x86::axpy(acc.as_mut_ptr(), p, v.as_ptr(), acc.len()) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2() && acc.len().is_multiple_of(8) && v.len() >= acc.len() {
        // SAFETY: AVX2 and FMA are available; both slices hold acc.len() elements.
        return unsafe { avx2::axpy(acc.as_mut_ptr(), p, v.as_ptr(), acc.len()) };
    }
    for (a, x) in acc.iter_mut().zip(v) {
        *a = p.mul_add(*x, *a);
    }
}

/// `acc[d] = fma(p[j], v[j][d], acc[d])` for j in `0..keys`, in order: the
/// value half of one `simd_gemm` tile row, with `acc` kept in registers.
pub fn accumulate(acc: &mut [f32], p: &[f32], vals: &[f32], keys: usize) {
    let d = acc.len();
    #[cfg(target_arch = "x86_64")]
    if avx512() && d.is_multiple_of(LANES) && d <= 256 {
        // SAFETY: AVX-512F is available; vals holds keys * d values, p holds keys.
        return unsafe { x86::accumulate(acc.as_mut_ptr(), d, p.as_ptr(), vals.as_ptr(), keys) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2() && d.is_multiple_of(8) {
        // SAFETY: AVX2 and FMA are available; vals holds keys * d values, p holds keys.
        return unsafe { avx2::accumulate(acc.as_mut_ptr(), d, p.as_ptr(), vals.as_ptr(), keys) };
    }
    for j in 0..keys {
        for (a, x) in acc.iter_mut().zip(&vals[j * d..(j + 1) * d]) {
            *a = p[j].mul_add(*x, *a);
        }
    }
}

/// `kq[j] = chain of fma(q[d], kt[d][j], .)` over d, from 0, for 64 keys
/// stored transposed (`kt[d * 64 + j]`): one row of `simd_gemm`.
pub fn scores64(q: &[f32], kt: &[f32], kq: &mut [f32; 64]) {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F is available; kt holds q.len() * 64 values.
        return unsafe { x86::scores64(q.as_ptr(), q.len(), kt.as_ptr(), kq.as_mut_ptr()) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 and FMA are available; kt holds q.len() * 64 values.
        return unsafe { avx2::scores64(q.as_ptr(), q.len(), kt.as_ptr(), kq.as_mut_ptr()) };
    }
    kq.fill(0.0);
    for (d, qd) in q.iter().enumerate() {
        for (j, s) in kq.iter_mut().enumerate() {
            *s = qd.mul_add(kt[d * 64 + j], *s);
        }
    }
}

/// `kq[j] = v_expf(kq[j] - max)` for a 64-wide tile; returns the sum as
/// ggml's `vec_soft_max_f32` forms it (each 16 lanes reduced, added in f64).
pub fn exp_tile64(kq: &mut [f32; 64], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F is available; kq holds 64 values.
        return unsafe { x86::exp_tile64(kq.as_mut_ptr(), max) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 and FMA are available; kq holds 64 values.
        return unsafe { avx2::exp_tile64(kq.as_mut_ptr(), max) };
    }
    let mut sum = 0f64;
    for chunk in kq.chunks_exact_mut(LANES) {
        let mut lanes = [0f32; LANES];
        for (l, x) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *x = v_expf(*x - max);
            *l = *x;
        }
        sum += reduce16(&lanes) as f64;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    /// ggml's AVX-512 `vec_dot_f16` body plus the scalar f64 tail.
    #[target_feature(enable = "avx512f,f16c,fma")]
    pub unsafe fn dot_f16(a: *const f16, b: *const f16, n: usize) -> f32 {
        let body = n - n % 64;
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        while i < body {
            for (j, s) in acc.iter_mut().enumerate() {
                let x = _mm512_cvtph_ps(_mm256_loadu_si256(a.add(i + 16 * j) as *const __m256i));
                let y = _mm512_cvtph_ps(_mm256_loadu_si256(b.add(i + 16 * j) as *const __m256i));
                *s = _mm512_fmadd_ps(x, y, *s);
            }
            i += 64;
        }
        let s0 = _mm512_add_ps(acc[0], acc[2]);
        let s1 = _mm512_add_ps(acc[1], acc[3]);
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), _mm512_add_ps(s0, s1));
        let mut sum = super::reduce16(&lanes) as f64;
        for k in body..n {
            sum += ((*a.add(k)).to_f32() * (*b.add(k)).to_f32()) as f64;
        }
        sum as f32
    }

    #[target_feature(enable = "avx512f,f16c")]
    pub unsafe fn scale_f16(y: *mut f16, n: usize, s: f32) {
        let body = n - n % 16;
        let v = _mm512_set1_ps(s);
        let mut i = 0;
        while i < body {
            let p = y.add(i) as *mut __m256i;
            let r = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(p)), v);
            _mm256_storeu_si256(p, _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
            i += 16;
        }
        for k in body..n {
            *y.add(k) = f16::from_f32((*y.add(k)).to_f32() * s);
        }
    }

    #[target_feature(enable = "avx512f,f16c,fma")]
    pub unsafe fn mad_f16(y: *mut f16, x: *const f16, n: usize, s: f32) {
        let body = n - n % 16;
        let v = _mm512_set1_ps(s);
        let mut i = 0;
        while i < body {
            let p = y.add(i) as *mut __m256i;
            let xv = _mm512_cvtph_ps(_mm256_loadu_si256(x.add(i) as *const __m256i));
            let r = _mm512_fmadd_ps(xv, v, _mm512_cvtph_ps(_mm256_loadu_si256(p)));
            _mm256_storeu_si256(p, _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
            i += 16;
        }
        for k in body..n {
            *y.add(k) = f16::from_f32((*x.add(k)).to_f32().mul_add(s, (*y.add(k)).to_f32()));
        }
    }

    /// ggml's AVX-512 `ggml_v_expf`.
    #[target_feature(enable = "avx512f,fma")]
    pub(crate) unsafe fn v_expf(x: __m512) -> __m512 {
        let c = |bits: u32| _mm512_set1_ps(f32::from_bits(bits));
        let r = c(0x4b40_0000);
        let z = _mm512_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(n, c(0x35bf_be8e), _mm512_fnmadd_ps(n, c(0x3f31_7200), x));
        let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm512_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm512_fmadd_ps(c(0x3f7f_fff6), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        if big == 0 {
            return res;
        }
        let le0 = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
        let alt = _mm512_mask_blend_ps(le0, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
        _mm512_mask_blend_ps(big, res, alt)
    }

    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn silu_mul(g: *const f32, u: *const f32, out: *mut f32, n: usize) {
        let one = _mm512_set1_ps(1.0);
        let mut i = 0;
        while i < n {
            let x = _mm512_loadu_ps(g.add(i));
            let e = v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x));
            let s = _mm512_div_ps(x, _mm512_add_ps(one, e));
            _mm512_storeu_ps(out.add(i), _mm512_mul_ps(s, _mm512_loadu_ps(u.add(i))));
            i += 16;
        }
    }

    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn exp_tile64(kq: *mut f32, max: f32) -> f64 {
        let m = _mm512_set1_ps(max);
        let mut sum = 0f64;
        for c in 0..4 {
            let p = kq.add(16 * c);
            let v = v_expf(_mm512_sub_ps(_mm512_loadu_ps(p), m));
            _mm512_storeu_ps(p, v);
            let mut lanes = [0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), v);
            sum += super::reduce16(&lanes) as f64;
        }
        sum
    }

    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn accumulate(
        acc: *mut f32,
        d: usize,
        p: *const f32,
        vals: *const f32,
        keys: usize,
    ) {
        let regs = d / 16;
        let mut r = [_mm512_setzero_ps(); 16];
        for (k, reg) in r.iter_mut().enumerate().take(regs) {
            *reg = _mm512_loadu_ps(acc.add(16 * k));
        }
        for j in 0..keys {
            let pj = _mm512_set1_ps(*p.add(j));
            let row = vals.add(j * d);
            for (k, reg) in r.iter_mut().enumerate().take(regs) {
                *reg = _mm512_fmadd_ps(_mm512_loadu_ps(row.add(16 * k)), pj, *reg);
            }
        }
        for (k, reg) in r.iter().enumerate().take(regs) {
            _mm512_storeu_ps(acc.add(16 * k), *reg);
        }
    }

    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn axpy(acc: *mut f32, p: f32, v: *const f32, n: usize) {
        let pv = _mm512_set1_ps(p);
        let mut i = 0;
        while i < n {
            let a = _mm512_loadu_ps(acc.add(i));
            _mm512_storeu_ps(
                acc.add(i),
                _mm512_fmadd_ps(_mm512_loadu_ps(v.add(i)), pv, a),
            );
            i += 16;
        }
    }

    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn scores64(q: *const f32, d: usize, kt: *const f32, out: *mut f32) {
        let mut acc = [_mm512_setzero_ps(); 4];
        for k in 0..d {
            let qv = _mm512_set1_ps(*q.add(k));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(kt.add(k * 64 + r * 16)), qv, *a);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add(r * 16), *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_expf_vector_and_scalar_agree_and_track_exp() {
        let xs: Vec<f32> = (0..4096)
            .map(|i| (i as f32 - 2048.0) * 0.0517)
            .chain([-200.0, 200.0, -88.0, 88.0, 0.0])
            .collect();
        for &x in &xs {
            let e = v_expf(x);
            let want = (x as f64).exp();
            if want < 1e30 && want > 1e-30 {
                assert!(
                    ((e as f64 - want) / want).abs() < 5e-7,
                    "{x}: {e} vs {want}"
                );
            }
        }
        let up = vec![1.0f32; xs.len()];
        let mut fast = vec![0f32; xs.len()];
        silu_mul(&xs, &up, &mut fast);
        for (i, &x) in xs.iter().enumerate() {
            let slow = x / (1.0 + v_expf(0.0 - x));
            assert_eq!(fast[i].to_bits(), slow.to_bits(), "silu({x})");
        }
    }

    #[test]
    fn f16_helpers_match_their_scalar_definitions() {
        let a: Vec<f16> = (0..200)
            .map(|i| f16::from_f32(((i * 37) % 101) as f32 / 50.0 - 1.0))
            .collect();
        let b: Vec<f16> = (0..200)
            .map(|i| f16::from_f32(((i * 53) % 97) as f32 / 40.0 - 1.2))
            .collect();
        for n in [64, 128, 130, 200] {
            assert_eq!(
                dot_f16(&a[..n], &b[..n]).to_bits(),
                dot_ggml(n, |i| (a[i].to_f32(), b[i].to_f32())).to_bits()
            );
        }
        let mut y1 = a.clone();
        let mut y2 = a.clone();
        mad_f16(&mut y1, &b, 0.37);
        for (v, x) in y2.iter_mut().zip(&b) {
            *v = f16::from_f32(x.to_f32().mul_add(0.37, v.to_f32()));
        }
        assert_eq!(y1, y2);
        scale_f16(&mut y1, 0.71);
        y2.iter_mut()
            .for_each(|v| *v = f16::from_f32(v.to_f32() * 0.71));
        assert_eq!(y1, y2);
    }
}
