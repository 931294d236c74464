//! The scalar path, and the *specification* of the numerics every path
//! follows: llama.cpp's x86 CPU kernels, lane by lane.
//!
//! ggml's AVX2 dot products (`ggml_vec_dot_*`, [`DotOrder::VecDot`]) keep
//! eight f32 accumulator lanes; lane `l` receives, per block, the exact
//! integer sum over elements `4l..4l+3` of each 32-element chunk (what
//! `maddubs`+`madd` or `vpdpbusd` produce), converted to f32 and
//! accumulated with a fused multiply-add by the block's combined scale; the
//! lanes are reduced in `hsum_float_8`'s order at the end. Q4_K and Q6_K
//! products also come in llama.cpp's other orders (the repacked Q4_K
//! gemv/gemm and the tiled matmul, chosen per call as `order.rs`
//! describes): the same exact integers per super-block, added into one f32
//! accumulator in the order each kernel uses.
//! Reproducing those orders makes weft's logits bit-identical to
//! llama.cpp's where the inputs are, which matters when two logits differ
//! by 0.005. The reference dot products in `weft_ops::quant` follow ggml's
//! *generic* C code instead (another order); they agree to f32 rounding.
//!
//! Inputs are validated by the caller (`mod.rs`): whole blocks, matching
//! lengths.
//!
//! [`DotOrder::VecDot`]: super::DotOrder::VecDot

use super::formats::{act_bytes, act_qs, kq, Block32};
use super::DotOrder;
use weft_ops::quant::{bf16_to_f32, f16_to_f32, unpack_q4k_scales_mins};

/// ggml's `hsum_float_8`: `((x0+x4) + (x2+x6)) + ((x1+x5) + (x3+x7))`.
pub(crate) fn hsum8(x: &[f32; 8]) -> f32 {
    let s = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}

/// Exact integer lane sums of one 32-element chunk:
/// `lanes[l] = sum((u[e] - offset) * y[e])` over `e` in `4l..4l+4`.
fn chunk_lanes(u: &[u8], y: &[i8], offset: i32) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (e, (&c, &v)) in u.iter().zip(y).enumerate() {
        lanes[e / 4] += (c as i32 - offset) * v as i32;
    }
    lanes
}

fn act_quants(block: &[u8]) -> &[i8] {
    bytemuck::cast_slice(block)
}

/// `weight_row . act_row` for a 32-element format (`nb` blocks), in
/// ggml's `ggml_vec_dot_q{4,5,8}_{0,1}_q8_{0,1}` AVX2 order.
pub(crate) fn dot_block32<F: Block32>(w: &[u8], a: &[u8], nb: usize) -> f32 {
    let ab = act_bytes(F::HAS_MIN);
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (wb, yb) in w.chunks_exact(F::BYTES).zip(a.chunks_exact(ab)).take(nb) {
        let q = act_quants(&yb[act_qs(F::HAS_MIN)..act_qs(F::HAS_MIN) + 32]);
        let lanes = chunk_lanes(&F::codes(wb), q, F::OFFSET);
        let d = F::d(wb) * f16_to_f32([yb[0], yb[1]]);
        for (a, &l) in acc.iter_mut().zip(&lanes) {
            *a = d.mul_add(l as f32, *a);
        }
        if F::HAS_MIN {
            summs = F::m(wb).mul_add(f16_to_f32([yb[2], yb[3]]), summs);
        }
    }
    if F::HAS_MIN {
        hsum8(&acc) + summs
    } else {
        hsum8(&acc)
    }
}

fn q8k_d(y: &[u8]) -> f32 {
    f32::from_le_bytes([y[0], y[1], y[2], y[3]])
}

fn q8k_bsum(y: &[u8], j: usize) -> i32 {
    let o = kq::Q8K_BSUMS + 2 * j;
    i16::from_le_bytes([y[o], y[o + 1]]) as i32
}

/// Q4_K's 256 unsigned codes in element order.
pub(crate) fn q4k_codes(x: &[u8]) -> [u8; 256] {
    let mut u = [0u8; 256];
    for c in 0..4 {
        for l in 0..32 {
            let byte = x[kq::Q4K_QS + 32 * c + l];
            u[64 * c + l] = byte & 0x0f;
            u[64 * c + 32 + l] = byte >> 4;
        }
    }
    u
}

/// `ggml_vec_dot_q4_K_q8_K` (AVX2): per super-block, lane `l` sums
/// `sc[c] * dot(chunk c, elements 4l..4l+3)` over the eight 32-element
/// chunks; the minimums go through four lanes of `m * bsums`.
pub(crate) fn dot_q4k(w: &[u8], a: &[u8], nb: usize) -> f32 {
    let mut acc = [0f32; 8];
    let mut acc_m = [0f32; 4];
    for (x, y) in w
        .chunks_exact(kq::Q4K_BYTES)
        .zip(a.chunks_exact(kq::Q8K_BYTES))
        .take(nb)
    {
        let scales: &[u8; 12] = x[4..16].try_into().unwrap_or(&[0; 12]);
        let (sc, m) = unpack_q4k_scales_mins(scales);
        let u = q4k_codes(x);
        let yq = act_quants(&y[kq::Q8K_QS..kq::Q8K_QS + 256]);
        let mut sumi = [0i32; 8];
        for c in 0..8 {
            let lanes = chunk_lanes(&u[32 * c..32 * c + 32], &yq[32 * c..32 * c + 32], 0);
            for (s, l) in sumi.iter_mut().zip(lanes) {
                *s += sc[c] as i32 * l;
            }
        }
        let yd = q8k_d(y);
        let d = yd * f16_to_f32([x[0], x[1]]);
        let dmin = -yd * f16_to_f32([x[2], x[3]]);
        for (a, s) in acc.iter_mut().zip(sumi) {
            *a = d.mul_add(s as f32, *a);
        }
        for (k, am) in acc_m.iter_mut().enumerate() {
            let bs = |i: usize| q8k_bsum(y, 2 * i) + q8k_bsum(y, 2 * i + 1);
            let prod = m[2 * k] as i32 * bs(2 * k) + m[2 * k + 1] as i32 * bs(2 * k + 1);
            *am = dmin.mul_add(prod as f32, *am);
        }
    }
    hsum8(&acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
}

/// Q4_K's exact integer sums of one super-block, per 64-element pair of
/// chunks `p` (chunks `2p`, `2p + 1`): `sum(sc[c] * dot_c)` and
/// `sum(m[c] * (bsum[2c] + bsum[2c + 1]))`, with `dot_c` chunk `c`'s code
/// times activation dot product.
pub(crate) fn q4k_pair_sums(x: &[u8], y: &[u8]) -> ([i32; 4], [i32; 4]) {
    let scales: &[u8; 12] = x[4..16].try_into().unwrap_or(&[0; 12]);
    let (sc, m) = unpack_q4k_scales_mins(scales);
    let u = q4k_codes(x);
    let yq = act_quants(&y[kq::Q8K_QS..kq::Q8K_QS + 256]);
    let (mut isum, mut imin) = ([0i32; 4], [0i32; 4]);
    for c in 0..8 {
        let dot: i32 = (32 * c..32 * c + 32)
            .map(|e| u[e] as i32 * yq[e] as i32)
            .sum();
        isum[c / 2] += sc[c] as i32 * dot;
        imin[c / 2] += m[c] as i32 * (q8k_bsum(y, 2 * c) + q8k_bsum(y, 2 * c + 1));
    }
    (isum, imin)
}

/// Q4_K repacked (`ggml_gemv_q4_K_8x8_q8_K` / `ggml_gemm_...`): two
/// accumulators, `acc += f32(isum) * (d_w d_a)` and `accm += f32(imin) *
/// (dmin_w d_a)` with fused multiply-adds, once per super-block (gemv,
/// `GEMM = false`) or once per 64-element pair (gemm); `acc - accm`.
pub(crate) fn dot_q4k_repack<const GEMM: bool>(w: &[u8], a: &[u8], nb: usize) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for (x, y) in w
        .chunks_exact(kq::Q4K_BYTES)
        .zip(a.chunks_exact(kq::Q8K_BYTES))
        .take(nb)
    {
        let (isum, imin) = q4k_pair_sums(x, y);
        let yd = q8k_d(y);
        let dd = f16_to_f32([x[0], x[1]]) * yd;
        let dm = f16_to_f32([x[2], x[3]]) * yd;
        if GEMM {
            for (&s, &m) in isum.iter().zip(&imin) {
                acc = (s as f32).mul_add(dd, acc);
                accm = (m as f32).mul_add(dm, accm);
            }
        } else {
            acc = (isum.iter().sum::<i32>() as f32).mul_add(dd, acc);
            accm = (imin.iter().sum::<i32>() as f32).mul_add(dm, accm);
        }
    }
    acc - accm
}

/// Q4_K in the tiled order: per super-block `r = fma(-dmin_w, f32(imin),
/// f32(isum) * d_w)` (`_mm512_fnmadd_ps`), then `acc = fma(r, d_a, acc)`.
pub(crate) fn dot_q4k_tiled(w: &[u8], a: &[u8], nb: usize) -> f32 {
    let mut acc = 0f32;
    for (x, y) in w
        .chunks_exact(kq::Q4K_BYTES)
        .zip(a.chunks_exact(kq::Q8K_BYTES))
        .take(nb)
    {
        let (isum, imin) = q4k_pair_sums(x, y);
        let (s, m) = (isum.iter().sum::<i32>(), imin.iter().sum::<i32>());
        let r = (-f16_to_f32([x[2], x[3]])).mul_add(m as f32, s as f32 * f16_to_f32([x[0], x[1]]));
        acc = r.mul_add(q8k_d(y), acc);
    }
    acc
}

/// One Q4_K / Q6_K product in `order` (`order.rs`).
pub(crate) fn dot_kquant(order: DotOrder, q6: bool, w: &[u8], a: &[u8], nb: usize) -> f32 {
    match (q6, order) {
        (true, DotOrder::Tiled) => dot_q6k_tiled(w, a, nb),
        (true, _) => dot_q6k(w, a, nb),
        (false, DotOrder::RepackGemm) => dot_q4k_repack::<true>(w, a, nb),
        (false, DotOrder::RepackGemv) => dot_q4k_repack::<false>(w, a, nb),
        (false, DotOrder::Tiled) => dot_q4k_tiled(w, a, nb),
        (false, DotOrder::VecDot) => dot_q4k(w, a, nb),
    }
}

/// Q6_K's 256 codes (0..=63, weight `q - 32`) in element order.
pub(crate) fn q6k_codes(x: &[u8]) -> [u8; 256] {
    let mut u = [0u8; 256];
    for h in 0..2 {
        for l in 0..32 {
            let (ql0, ql1, qh) = (
                x[64 * h + l],
                x[64 * h + l + 32],
                x[kq::Q6K_QH + 32 * h + l],
            );
            let e = 128 * h + l;
            u[e] = (ql0 & 0x0f) | ((qh & 3) << 4);
            u[e + 32] = (ql1 & 0x0f) | (((qh >> 2) & 3) << 4);
            u[e + 64] = (ql0 >> 4) | (((qh >> 4) & 3) << 4);
            u[e + 96] = (ql1 >> 4) | (((qh >> 6) & 3) << 4);
        }
    }
    u
}

/// `ggml_vec_dot_q6_K_q8_K` (AVX2): lane `l` sums `scale[e / 16] * q * y`
/// (`q` the unsigned 6-bit code) over elements `4l..4l+3` of every chunk,
/// minus the offset of elements `32l..32l+31` taken through the activation
/// sums: `32 * (bsum[2l] scale[2l] + bsum[2l+1] scale[2l+1])`.
pub(crate) fn dot_q6k(w: &[u8], a: &[u8], nb: usize) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w
        .chunks_exact(kq::Q6K_BYTES)
        .zip(a.chunks_exact(kq::Q8K_BYTES))
        .take(nb)
    {
        let u = q6k_codes(x);
        let yq = act_quants(&y[kq::Q8K_QS..kq::Q8K_QS + 256]);
        let scale = |j: usize| x[kq::Q6K_SCALES + j] as i8 as i32;
        let mut sumi = [0i32; 8];
        for (e, (&c, &v)) in u.iter().zip(yq).enumerate() {
            sumi[(e % 32) / 4] += scale(e / 16) * (c as i32 * v as i32);
        }
        for (l, s) in sumi.iter_mut().enumerate() {
            let offset =
                q8k_bsum(y, 2 * l) * scale(2 * l) + q8k_bsum(y, 2 * l + 1) * scale(2 * l + 1);
            *s -= 32 * offset;
        }
        let d = q8k_d(y) * f16_to_f32([x[kq::Q6K_D], x[kq::Q6K_D + 1]]);
        for (a, s) in acc.iter_mut().zip(sumi) {
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum8(&acc)
}

/// Q6_K's exact integer sum of one super-block:
/// `sum(scale[e / 16] * (q[e] - 32) * y[e])`.
pub(crate) fn q6k_block_sum(x: &[u8], y: &[u8]) -> i32 {
    let u = q6k_codes(x);
    let yq = act_quants(&y[kq::Q8K_QS..kq::Q8K_QS + 256]);
    u.iter()
        .zip(yq)
        .enumerate()
        .map(|(e, (&c, &v))| x[kq::Q6K_SCALES + e / 16] as i8 as i32 * (c as i32 - 32) * v as i32)
        .sum()
}

/// Q6_K in the tiled order: per super-block `acc = fma(f32(isum) * d_w,
/// d_a, acc)` (the kernel's `add(buf, mul(result, d1))`, fused by gcc).
pub(crate) fn dot_q6k_tiled(w: &[u8], a: &[u8], nb: usize) -> f32 {
    let mut acc = 0f32;
    for (x, y) in w
        .chunks_exact(kq::Q6K_BYTES)
        .zip(a.chunks_exact(kq::Q8K_BYTES))
        .take(nb)
    {
        let r = q6k_block_sum(x, y) as f32 * f16_to_f32([x[kq::Q6K_D], x[kq::Q6K_D + 1]]);
        acc = r.mul_add(q8k_d(y), acc);
    }
    acc
}

/// `_mm512_reduce_add_ps`'s order: halves, quarters, pairs.
pub(crate) fn reduce16(x: &[f32; 16]) -> f32 {
    let mut t8 = [0f32; 8];
    for i in 0..8 {
        t8[i] = x[i] + x[i + 8];
    }
    let t4 = [t8[0] + t8[4], t8[1] + t8[5], t8[2] + t8[6], t8[3] + t8[7]];
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

/// ggml's AVX-512 `GGML_F32_VEC_REDUCE` over four 16-lane accumulators.
pub(crate) fn reduce4x16(acc: &[[f32; 16]; 4]) -> f32 {
    let [a0, a1, a2, a3] = *acc;
    let folded: [f32; 16] = core::array::from_fn(|l| (a0[l] + a2[l]) + (a1[l] + a3[l]));
    reduce16(&folded)
}

/// The body of ggml's `ggml_vec_dot_f32` / `ggml_vec_dot_f16` (AVX-512
/// build): four 16-lane fused accumulators over 64 elements at a time.
/// Returns the reduced body and the number of elements it covered.
fn dot_body64(n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32) -> (f32, usize) {
    let body = n - n % 64;
    let mut acc = [[0f32; 16]; 4];
    for base in (0..body).step_by(64) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, a) in lanes.iter_mut().enumerate() {
                let i = base + 16 * j + l;
                *a = x(i).mul_add(y(i), *a);
            }
        }
    }
    (reduce4x16(&acc), body)
}

fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32([b[2 * i], b[2 * i + 1]])
}

fn bf16_at(b: &[u8], i: usize) -> f32 {
    bf16_to_f32([b[2 * i], b[2 * i + 1]])
}

/// `ggml_vec_dot_f32`: the tail is added in f32 with fused multiply-adds.
pub(crate) fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (mut sum, body) = dot_body64(n, |i| f32_at(w, i), |i| f32_at(a, i));
    for i in body..n {
        sum = f32_at(w, i).mul_add(f32_at(a, i), sum);
    }
    sum
}

/// `ggml_vec_dot_f16`: the tail is added in f64.
pub(crate) fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (sum, body) = dot_body64(n, |i| f16_at(w, i), |i| f16_at(a, i));
    let mut sumf = sum as f64;
    for i in body..n {
        sumf += (f16_at(w, i) * f16_at(a, i)) as f64;
    }
    sumf as f32
}

/// `ggml_vec_dot_bf16` (AVX-512 BF16 build): two accumulators fed by
/// `vdpbf16ps` (per lane: the odd pair's exact product, then the even
/// one's, each added with one rounding), 64 elements per step, each
/// reduced and added in f64; the tail in f64.
pub(crate) fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let body = n - n % 64;
    let mut acc = [[0f32; 16]; 2];
    for base in (0..body).step_by(64) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, c) in lanes.iter_mut().enumerate() {
                let i = base + 32 * j + 2 * l;
                *c += bf16_at(w, i + 1) * bf16_at(a, i + 1);
                *c += bf16_at(w, i) * bf16_at(a, i);
            }
        }
    }
    let mut sumf = 0f64;
    if body > 0 {
        sumf += reduce16(&acc[0]) as f64;
        sumf += reduce16(&acc[1]) as f64;
    }
    for i in body..n {
        sumf += (bf16_at(w, i) * bf16_at(a, i)) as f64;
    }
    sumf as f32
}
