//! Quantized dot products in exactly the float order of llama.cpp's x86
//! CPU kernels, so weft's logits match llama.cpp's bit for bit.
//!
//! The integer part of a block dot product is exact anywhere; what decides
//! the last bits is how it is combined with the scales. ggml's AVX kernels
//! keep 8 f32 lanes, lane `k` holding the integer sum of elements
//! `4k..4k+3` of each 32-element block, accumulate `lane = fma(d_w * d_x,
//! lane_sum, lane)` block after block, and reduce the lanes with a fixed
//! tree (`hsum_float_8`). Any other order moves SmolLM2's logits by ~0.5,
//! because activations are re-quantized to 8 bits before every matmul and
//! one flipped rounding cascades.

use half::f16;

fn h(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// ggml's `hsum_float_8`: `(l0+l4 + l2+l6) + (l1+l5 + l3+l7)`.
pub fn hsum8(l: &[f32; 8]) -> f32 {
    let t = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// Lane sums of one block: lane k = sum of `w[e] * x[e]` for e in 4k..4k+4.
fn lane_sums(w: &[i32; 32], x: &[i8]) -> [f32; 8] {
    let mut out = [0f32; 8];
    for (k, o) in out.iter_mut().enumerate() {
        let s: i32 = (4 * k..4 * k + 4).map(|e| w[e] * x[e] as i32).sum();
        *o = s as f32;
    }
    out
}

/// Q4_1 weights (20-byte blocks) times Q8_1 activations (36-byte blocks).
pub fn q4_1_q8_1(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (wb, xb) in w.chunks_exact(20).zip(x.chunks_exact(36)) {
        let (d0, m0) = (h([wb[0], wb[1]]), h([wb[2], wb[3]]));
        let (d1, s1) = (h([xb[0], xb[1]]), h([xb[2], xb[3]]));
        summs = m0.mul_add(s1, summs);
        let dd = d0 * d1;
        let mut q = [0i32; 32];
        for j in 0..16 {
            q[j] = (wb[4 + j] & 0x0f) as i32;
            q[j + 16] = (wb[4 + j] >> 4) as i32;
        }
        let xs: &[i8] = bytemuck::cast_slice(&xb[4..36]);
        for (a, l) in acc.iter_mut().zip(lane_sums(&q, xs)) {
            *a = dd.mul_add(l, *a);
        }
    }
    hsum8(&acc) + summs
}

/// Q8_0 weights times Q8_0 activations (34-byte blocks).
pub fn q8_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (wb, xb) in w.chunks_exact(34).zip(x.chunks_exact(34)) {
        let dd = h([wb[0], wb[1]]) * h([xb[0], xb[1]]);
        let mut q = [0i32; 32];
        for (j, v) in wb[2..34].iter().enumerate() {
            q[j] = *v as i8 as i32;
        }
        let xs: &[i8] = bytemuck::cast_slice(&xb[2..34]);
        for (a, l) in acc.iter_mut().zip(lane_sums(&q, xs)) {
            *a = dd.mul_add(l, *a);
        }
    }
    hsum8(&acc)
}

/// Q5_0 weights (22-byte blocks) times Q8_0 activations.
pub fn q5_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (wb, xb) in w.chunks_exact(22).zip(x.chunks_exact(34)) {
        let dd = h([wb[0], wb[1]]) * h([xb[0], xb[1]]);
        let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
        let mut q = [0i32; 32];
        for j in 0..16 {
            let lo = (wb[6 + j] & 0x0f) as i32 | (((qh >> j) & 1) as i32) << 4;
            let hi = (wb[6 + j] >> 4) as i32 | (((qh >> (j + 16)) & 1) as i32) << 4;
            q[j] = lo - 16;
            q[j + 16] = hi - 16;
        }
        let xs: &[i8] = bytemuck::cast_slice(&xb[2..34]);
        for (a, l) in acc.iter_mut().zip(lane_sums(&q, xs)) {
            *a = dd.mul_add(l, *a);
        }
    }
    hsum8(&acc)
}
