//! Small vector helpers whose summation order mirrors ggml's AVX-512 CPU
//! code (16-lane vectors, four accumulators, a fixed reduction tree), so
//! results match llama.cpp bit for bit where the inputs do.

use half::f16;

const LANES: usize = 16;
const STEP: usize = 4 * LANES;

/// Sum of 16 lanes in `_mm512_reduce_add_ps`'s order: halves, quarters, pairs.
pub fn reduce16(x: &[f32; LANES]) -> f32 {
    let mut t8 = [0f32; 8];
    for i in 0..8 {
        t8[i] = x[i] + x[i + 8];
    }
    let t4 = [t8[0] + t8[4], t8[1] + t8[5], t8[2] + t8[6], t8[3] + t8[7]];
    let (a, b) = (t4[0] + t4[2], t4[1] + t4[3]);
    a + b
}

/// `sum(a[i] * b[i])` accumulated like ggml's `vec_dot_f32`/`vec_dot_f16`:
/// fused multiply-adds into four 16-lane accumulators per 64 elements, the
/// accumulators folded (0+2, 1+3, then 0+1), reduced, and the tail added in f64.
fn dot_ggml(n: usize, product_lane: impl Fn(usize) -> (f32, f32)) -> f32 {
    let body = n - n % STEP;
    let mut acc = [[0f32; LANES]; 4];
    for base in (0..body).step_by(STEP) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, a) in lanes.iter_mut().enumerate() {
                let (x, y) = product_lane(base + j * LANES + l);
                *a = x.mul_add(y, *a);
            }
        }
    }
    let mut sum = 0f64;
    if body > 0 {
        for l in 0..LANES {
            acc[0][l] += acc[2][l];
            acc[1][l] += acc[3][l];
        }
        for l in 0..LANES {
            acc[0][l] += acc[1][l];
        }
        sum = reduce16(&acc[0]) as f64;
    }
    for i in body..n {
        let (x, y) = product_lane(i);
        sum += (x * y) as f64;
    }
    sum as f32
}

/// Dot product of two f16 vectors, ggml's way.
pub fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
    dot_ggml(a.len().min(b.len()), |i| (a[i].to_f32(), b[i].to_f32()))
}

/// Dot product of two f32 vectors, ggml's way.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot_ggml(a.len().min(b.len()), |i| (a[i], b[i]))
}

/// `y = f16(f32(y) * s)`.
pub fn scale_f16(y: &mut [f16], s: f32) {
    for v in y {
        *v = f16::from_f32(v.to_f32() * s);
    }
}

/// `y = f16(fma(x, s, y))`, ggml's `vec_mad_f16`.
pub fn mad_f16(y: &mut [f16], x: &[f16], s: f32) {
    for (v, xi) in y.iter_mut().zip(x) {
        *v = f16::from_f32(xi.to_f32().mul_add(s, v.to_f32()));
    }
}

/// `out = silu(gate) * up`, with silu(x) = x / (1 + exp(-x)) and exp as
/// ggml's AVX-512 `ggml_v_expf` computes it, so results match llama.cpp.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + v_expf(0.0 - g)) * u;
    }
}

/// ggml's AVX-512 `ggml_v_expf` for one lane: a degree-5 polynomial on the
/// reduced argument and an exact scaling by `2^n` (max error ~1.5 ulp).
pub fn v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    let b = (-n).mul_add(f32::from_bits(0x35bf_be8e), (-n).mul_add(f32::from_bits(0x3f31_7200), x));
    let u = b * b;
    let p = f32::from_bits(0x3c07_2010).mul_add(b, f32::from_bits(0x3d2b_9f17));
    let q = f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb));
    let j = p.mul_add(u, q).mul_add(u, f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    (j as f64 * (n as f64).exp2()) as f32
}
