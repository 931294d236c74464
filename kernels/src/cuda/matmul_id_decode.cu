// Indexed expert matmul (matmul_id.cu), continued: the decode kernels,
// whose weights stream through shared memory.

// ---- decode kernels: weights streamed through shared memory ------------------------
//
// The `_d1` kernels (tiles of one pair; Q8_0, Q4_K in the repacked orders,
// Q2_K, IQ2_XXS, MXFP4; 16-byte aligned weights, rows of whole ring slices)
// give the same bits as the kernels above for a half to a third of their
// instructions per weight byte. Each warp owns four rows of every pass
// (eight lanes per row, as above) and a ring of NS stages in shared memory;
// a stage holds a slice of KB blocks of its four rows, brought in by 16-byte
// cp.async copies spread over the warp's lanes (one commit group per stage).
// The activation row's first loads, then the first stages' copies go out
// before the activations are quantized, so the weights stream from DRAM
// during that phase; each consumed stage is refilled at once. So there is
// no 2- or 4-byte global load, no per-block address arithmetic and no
// block-wide barrier in the main loop. Rows are padded in the stages (RS) so
// that the four rows of a warp fall on different banks.
//
// The activations are staged in layouts made for the lanes' reads (16-byte
// vectors): Q8_0 weights take lane l's four quants of blocks 4i..4i+3 as one
// 16-byte vector; MXFP4 takes the interleaved layout above; the K formats
// take Q8_K blocks of 304 bytes (quants, then d at 256, then the bsums).
// The per-lane arithmetic and the float order are those of the kernels above
// (lane = accumulator lane for Q8_0, integer sums exact in any order, float
// steps in block order). The quantizers are those of the kernels above
// (rows.cu's), eight lanes per Q8_0 block.

#define MMID_D_WARPS (MMID_THREADS / 32)
#define MMID_Q8K_D 304  // staged Q8_K block: qs[256], d (f32) at 256, bsums[16] (i16) at 260

DEV u32 mmid_smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// ---- activation staging for the decode kernels ----

// Q8_0 blocks of one row, eight lanes per block (lane l8: values 4 l8..4 l8+3),
// the arithmetic of mmid_stage_q8. MX = 0: lane l8's quants of blocks
// 4i..4i+3 as the 16 bytes at (8i + l8) * 16; MX = 1: the interleaved layout
// (quant j at byte 2j, quant j + 16 at byte 2j + 1 of the block's 32). The
// scales (f16-rounded, as f32) follow the nb * 32 quant bytes. nb % 4 == 0.
// Round r of 128 blocks: mmid_dload_q8 loads this thread's 16 values
// (blocks b0 + 32u, u < 4), mmid_dquant_q8 quantizes them.
DEV void mmid_dload_q8(const float* xrow, int nb, int r, float* v) {
    const int l8 = threadIdx.x & 7, b0 = (threadIdx.x >> 3) + r * (4 * MMID_THREADS / 8);
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const float* src = xrow + 32 * min(b0 + u * (MMID_THREADS / 8), nb - 1) + 4 * l8;
#pragma unroll
        for (int i = 0; i < 4; i++) v[4 * u + i] = src[i];
    }
}

template <int MX>
DEV void mmid_dquant_q8(const float* v, int nb, int r, u8* act) {
    const int l8 = threadIdx.x & 7, b0 = (threadIdx.x >> 3) + r * (4 * MMID_THREADS / 8);
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int b = b0 + u * (MMID_THREADS / 8);
        if (b >= nb) break;  // uniform per warp (nb % 4 == 0)
        const float* w = v + 4 * u;
        float amax = fmaxf(fmaxf(fabsf(w[0]), fabsf(w[1])), fmaxf(fabsf(w[2]), fabsf(w[3])));
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        u32 word = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int q = __float2int_rn(w[i] * id);
            q = max(-128, min(127, q));
            word |= ((u32)q & 0xffu) << (8 * i);
        }
        if (MX) {
            const u32 hi = __shfl_down_sync(FULL_MASK, word, 4, 8);
            if (l8 < 4)
                *(uint2*)(act + 32 * b + 8 * l8) = make_uint2(__byte_perm(word, hi, 0x5140), __byte_perm(word, hi, 0x7362));
        } else {
            *(u32*)(act + ((b >> 2) * 8 + l8) * 16 + (b & 3) * 4) = word;
        }
        if (l8 == 0) ((float*)(act + 32 * nb))[b] = round16(d);
    }
}

// rows.cu's Q8_K quantization (q8k_warp_codes), written as a MMID_Q8K_D
// block: the codes first (eight per lane as one 8-byte store), d at 256,
// the sums at 260.
DEV void mmid_dquant_q8k(const float* v, u8* blk) {
    const int lane = threadIdx.x & 31;
    int q[8], sum;
    const float d = q8k_warp_codes(v, q, &sum);
    u32 w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; i++) w[i >> 2] |= ((u32)q[i] & 0xffu) << (8 * (i & 3));
    *(uint2*)(blk + 8 * lane) = make_uint2(w[0], w[1]);
    if ((lane & 1) == 0) *(i16*)(blk + 260 + lane) = (i16)sum;
    if (lane == 0) *(float*)(blk + 256) = d;
}

// Round r of the Q8_K staging: this warp's blocks b0 + 8u (u < 2), eight
// values per lane each.
DEV void mmid_dload_q8k(const float* xrow, int nb, int r, float* v) {
    const int lane = threadIdx.x & 31, b0 = (threadIdx.x >> 5) + r * (2 * MMID_D_WARPS);
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const float* src = xrow + 256 * min(b0 + u * MMID_D_WARPS, nb - 1) + 8 * lane;
#pragma unroll
        for (int i = 0; i < 8; i++) v[8 * u + i] = src[i];
    }
}

DEV void mmid_dquant_q8k_round(const float* v, int nb, int r, u8* act) {
    const int b0 = (threadIdx.x >> 5) + r * (2 * MMID_D_WARPS);
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int b = b0 + u * MMID_D_WARPS;
        if (b < nb) mmid_dquant_q8k(v + 8 * u, act + (size_t)b * MMID_Q8K_D);
    }
}

// The staging of format FMT, one round: its loads, then its quantization.
template <int FMT>
DEV void mmid_dload(const float* xrow, int nb, int r, float* v) {
    if (FMT == MMID_Q8_0 || FMT == MMID_MXFP4)
        mmid_dload_q8(xrow, nb, r, v);
    else
        mmid_dload_q8k(xrow, nb, r, v);
}
template <int FMT>
DEV void mmid_dquant(const float* v, int nb, int r, u8* act) {
    if (FMT == MMID_Q8_0) mmid_dquant_q8<0>(v, nb, r, act);
    if (FMT == MMID_MXFP4) mmid_dquant_q8<1>(v, nb, r, act);
    if (FMT != MMID_Q8_0 && FMT != MMID_MXFP4) mmid_dquant_q8k_round(v, nb, r, act);
}
// Rounds of the staging: Q8_0 blocks of 32 (128 a round), Q8_K of 256 (16).
template <int FMT>
DEV int mmid_drounds(int nb) {
    return FMT == MMID_Q8_0 || FMT == MMID_MXFP4 ? (nb + 4 * MMID_THREADS / 8 - 1) / (4 * MMID_THREADS / 8)
                                                 : (nb + 2 * MMID_D_WARPS - 1) / (2 * MMID_D_WARPS);
}

// ---- per-format slices ----
// Each format: KB blocks per slice (slice bytes a multiple of 16), NS stages,
// RS bytes per row in a stage (RS / 4 = 8 mod 32: the four rows of a warp on
// different banks), a per-row state, step() over the blocks of one slice and
// finish() (the row's result, valid in the group's first lane).

// Q8_0: mmid_row_b32<FmtQ8_0>'s order (lane l8 = vec_dot's accumulator lane).
#ifndef MMID_DQ8_CFG
#define MMID_DQ8_CFG 16, 2, 544
#define MMID_DQ4K_CFG 4, 2, 608
#define MMID_DQ2K_CFG 4, 3, 352
#define MMID_DIQ2_CFG 8, 2, 544
#define MMID_DMX_CFG 32, 2, 544
#endif
template <int A, int B, int C>
struct MmidCfg {
    enum { KB = A, NS = B, RS = C };
};

struct MmidDQ8_0 : MmidCfg<MMID_DQ8_CFG> {
    enum { BYTES = 34 };
    struct St {
        float acc;
    };
    static __device__ __forceinline__ void init(St& s) { s.acc = 0.0f; }
    static __device__ __forceinline__ void step(St& s, const u8* w, const u8* act, int nb, int b0, int nbl,
                                                int) {
        const int l = threadIdx.x & 7;
#pragma unroll
        for (int h = 0; h < KB / 4; h++) {
            const int b4 = b0 + 4 * h;  // a multiple of 4
            const uint4 aq = *(const uint4*)(act + ((b4 >> 2) * 8 + l) * 16);
            const float4 ad = *(const float4*)(act + 32 * nb + 4 * b4);
            const u32 a[4] = {aq.x, aq.y, aq.z, aq.w};
            const float d[4] = {ad.x, ad.y, ad.z, ad.w};
#pragma unroll
            for (int p = 0; p < 2; p++) {
                // Blocks b4 + 2p (2-aligned quants) and b4 + 2p + 1, 68 bytes from a 4-aligned start.
                const u32* W = (const u32*)(w + 68 * (2 * h + p));
                const u32 w0 = W[l], w1 = W[l + 1], w9 = W[9 + l], d0 = W[0], d1 = W[8];
                const u32 qe = __byte_perm(w0, w1, 0x5432);
                const float wde = h2f((u16)(d0 & 0xffffu)), wdo = h2f((u16)(d1 >> 16));
                s.acc = __fmaf_rn(__fmul_rn(wde, d[2 * p]), dp4a_f32(qe, a[2 * p]), s.acc);
                s.acc = __fmaf_rn(__fmul_rn(wdo, d[2 * p + 1]), dp4a_f32(w9, a[2 * p + 1]), s.acc);
            }
        }
    }
    static __device__ __forceinline__ float finish(St& s, int) { return hsum8_lanes(s.acc); }
};

// Q4_K in the repacked orders (m % 8 == 0: order 1, or 2 for the pairs of
// the group's first ne - ne % 4): lane l8 takes sub-block l8 whole (integer
// sums are exact in any order), the eight lanes combine by shuffles.
struct MmidDQ4K : MmidCfg<MMID_DQ4K_CFG> {
    enum { BYTES = 144 };
    struct St {
        float acc, accm;
    };
    static __device__ __forceinline__ void init(St& s) { s.acc = s.accm = 0.0f; }
    static __device__ __forceinline__ void step(St& s, const u8* w, const u8* act, int, int b0, int nbl,
                                                int order) {
        const int l = threadIdx.x & 7, j4 = l & 3;
#pragma unroll
        for (int bb = 0; bb < KB; bb++) {
            const u8* x = w + 144 * bb;
            const u8* y = act + (size_t)(b0 + bb) * MMID_Q8K_D;
            const uint4 hd = *(const uint4*)x;  // d, dmin | scales 0..3 | 4..7 | 8..11
            const uint4 q0 = *(const uint4*)(x + 16 + 32 * (l >> 1));
            const uint4 q1 = *(const uint4*)(x + 32 + 32 * (l >> 1));
            const uint4 y0 = *(const uint4*)(y + 32 * l);
            const uint4 y1 = *(const uint4*)(y + 32 * l + 16);
            const int sh = 4 * (l & 1);
            const u32 qs[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
            const u32 ys[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
            int dot = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) dot = __dp4a((int)((qs[i] >> sh) & 0x0f0f0f0fu), (int)ys[i], dot);
            // Six-bit scale and minimum of sub-block l (q4k_scales_mins).
            const u32 c0 = (hd.y >> (8 * j4)) & 0xffu, c1 = (hd.z >> (8 * j4)) & 0xffu,
                      c2 = (hd.w >> (8 * j4)) & 0xffu;
            const int sc = (int)(l < 4 ? (c0 & 63u) : ((c2 & 0x0fu) | ((c0 >> 6) << 4)));
            const int mn = (int)(l < 4 ? (c1 & 63u) : ((c2 >> 4) | ((c1 >> 6) << 4)));
            const u32 bs = *(const u32*)(y + 260 + 4 * l);  // bsums 2l, 2l + 1
            int isum = sc * dot;
            int msum = mn * ((int)(i16)(bs & 0xffffu) + (int)(i16)(bs >> 16));
            const float yd = *(const float*)(y + 256);
            const float wd = h2f((u16)(hd.x & 0xffffu)), wdmin = h2f((u16)(hd.x >> 16));
            const float dd = __fmul_rn(wd, yd), dm = __fmul_rn(wdmin, yd);
            if (order == 2) {
                // pair[cp] = sub-blocks 2cp and 2cp + 1, in cp order.
                isum += __shfl_xor_sync(FULL_MASK, isum, 1, 8);
                msum += __shfl_xor_sync(FULL_MASK, msum, 1, 8);
#pragma unroll
                for (int cp = 0; cp < 4; cp++) {
                    const int pi = __shfl_sync(FULL_MASK, isum, 2 * cp, 8);
                    const int pm = __shfl_sync(FULL_MASK, msum, 2 * cp, 8);
                    s.acc = __fmaf_rn((float)pi, dd, s.acc);
                    s.accm = __fmaf_rn((float)pm, dm, s.accm);
                }
            } else {
                isum = mmid_sum8(isum);
                msum = mmid_sum8(msum);
                s.acc = __fmaf_rn((float)isum, dd, s.acc);
                s.accm = __fmaf_rn((float)msum, dm, s.accm);
            }
        }
    }
    static __device__ __forceinline__ float finish(St& s, int) { return s.acc - s.accm; }
};

// Q2_K (mmid_row_q2k's float step): lane l8 takes the quant bytes
// 8 (l8 % 4)..+7 of half l8 / 4 (elements 128h + 32kk + 8c + i, sub-block
// 8h + 2kk + c / 2) and the minimums of sub-blocks 2 l8, 2 l8 + 1.
struct MmidDQ2K : MmidCfg<MMID_DQ2K_CFG> {
    enum { BYTES = 84 };
    struct St {
        float sum;
    };
    static __device__ __forceinline__ void init(St& s) { s.sum = 0.0f; }
    static __device__ __forceinline__ void step(St& s, const u8* w, const u8* act, int, int b0, int nbl,
                                                int) {
        const int l = threadIdx.x & 7, h = l >> 2, c = l & 3;
#pragma unroll
        for (int bb = 0; bb < KB; bb++) {
            const u8* x = w + 84 * bb;  // 4-aligned
            const u8* y = act + (size_t)(b0 + bb) * MMID_Q8K_D;
            const u32 qa = *(const u32*)(x + 16 + 8 * l), qb = *(const u32*)(x + 20 + 8 * l);
            const u32 s0 = *(const u32*)(x + 8 * h), s1 = *(const u32*)(x + 8 * h + 4);  // scales 8h..8h+7
            const u32 wsm = *(const u16*)(x + 2 * l);                                       // scales 2l, 2l + 1
            const u32 wdm = *(const u32*)(x + 80);
            int isum = 0;
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                const uint2 yv = *(const uint2*)(y + 128 * h + 32 * kk + 8 * c);
                const u32 sw = kk < 2 ? s0 : s1;
                const int scl = (int)((sw >> (8 * (2 * (kk & 1) + (c >> 1)))) & 0xfu);
                int dot = __dp4a((int)((qa >> (2 * kk)) & 0x03030303u), (int)yv.x, 0);
                dot = __dp4a((int)((qb >> (2 * kk)) & 0x03030303u), (int)yv.y, dot);
                isum += scl * dot;
            }
            const u32 bs = *(const u32*)(y + 260 + 4 * l);
            int summs = (int)(i16)(bs & 0xffffu) * (int)((wsm >> 4) & 0xfu) +
                        (int)(i16)(bs >> 16) * (int)((wsm >> 12) & 0xfu);
            isum = mmid_sum8(isum);
            summs = mmid_sum8(summs);
            const float yd = *(const float*)(y + 256);
            const float wd = h2f((u16)(wdm & 0xffffu)), wdmin = h2f((u16)(wdm >> 16));
            const float dall = __fmul_rn(yd, wd), dmin = __fmul_rn(yd, wdmin);
            const float term = __fsub_rn(__fmul_rn(dall, (float)isum), __fmul_rn(dmin, (float)summs));
            s.sum = __fadd_rn(s.sum, term);
        }
    }
    static __device__ __forceinline__ float finish(St& s, int) { return s.sum; }
};

// IQ2_XXS (mmid_row_iq2xxs's float step): lane l8 takes sub-block l8. The
// signs are applied as sum (g ^ m) y - sum m y (m: 0xff where negative),
// which is sum +-g y exactly (no byte-wise subtraction). The sign masks are
// computed, not looked up: random table reads conflict on the banks, and
// the grid's already do.
struct MmidDIQ2 : MmidCfg<MMID_DIQ2_CFG> {
    enum { BYTES = 66 };
    struct St {
        float sum;
    };
    static __device__ __forceinline__ void init(St& s) { s.sum = 0.0f; }
    static __device__ __forceinline__ void sub(St& s, u32 aux0, u32 aux1, u32 dw, const u8* y, const uint2* grid) {
        const int l = threadIdx.x & 7;
        const uint4 y0 = *(const uint4*)(y + 32 * l);
        const uint4 y1 = *(const uint4*)(y + 32 * l + 16);
        const u32 ys[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
        int si = 0, sn = 0;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint2 gv = grid[(aux0 >> (8 * g)) & 0xffu];
            const u32 s7 = (aux1 >> (7 * g)) & 0x7fu;
            const u32 s8 = s7 | ((__popc(s7) & 1u) << 7);
            const uint2 mv = make_uint2(mmid_sign_mask(s8), mmid_sign_mask(s8 >> 4));
            si = __dp4a((int)(gv.x ^ mv.x), (int)ys[2 * g], si);
            si = __dp4a((int)(gv.y ^ mv.y), (int)ys[2 * g + 1], si);
            sn = __dp4a((int)mv.x, (int)ys[2 * g], sn);
            sn = __dp4a((int)mv.y, (int)ys[2 * g + 1], sn);
        }
        const int mul = 2 * (int)(aux1 >> 28) + 1;
        const int bsum = mmid_sum8((si - sn) * mul);
        const float xd = h2f((u16)dw), yd = *(const float*)(y + 256);
        s.sum = __fadd_rn(s.sum, __fmul_rn(__fmul_rn(xd, yd), (float)bsum));
    }
    static __device__ __forceinline__ void step(St& s, const u8* w, const u8* act, int, int b0, int, int,
                                                const uint2* grid) {
        const int l = threadIdx.x & 7;
#pragma unroll
        for (int p = 0; p < KB / 2; p++) {
            // Blocks 2p (at byte 0 of 132, 4-aligned) and 2p + 1 (at byte 66).
            const u32* W = (const u32*)(w + 132 * p);
            const u32 e0 = W[2 * l], e1 = W[2 * l + 1], e2 = W[2 * l + 2];
            const u32 o0 = W[17 + 2 * l], o1 = W[18 + 2 * l];
            const u32 d0 = W[0], d1 = W[16];
            const u8* y = act + (size_t)(b0 + 2 * p) * MMID_Q8K_D;
            sub(s, __byte_perm(e0, e1, 0x5432), __byte_perm(e1, e2, 0x5432), d0 & 0xffffu, y, grid);
            sub(s, o0, o1, d1 >> 16, y + MMID_Q8K_D, grid);
        }
    }
    static __device__ __forceinline__ float finish(St& s, int) { return __fmul_rn(0.125f, s.sum); }
};

// MXFP4 (mmid_row_mxfp4's order): lane l8 takes blocks l8 and 8 + l8 of the
// slice; the eight terms of each round are added in block order.
struct MmidDMX : MmidCfg<MMID_DMX_CFG> {
    enum { BYTES = 17 };
    struct St {
        float sum;
    };
    static __device__ __forceinline__ void init(St& s) { s.sum = 0.0f; }
    static __device__ __forceinline__ void step(St& s, const u8* w, const u8* act, int nb, int b0, int, int) {
        const int l = threadIdx.x & 7;
        const int sh = 8 * (l & 3);  // 17 (8r + l) = l mod 4
#pragma unroll
        for (int r = 0; r < KB / 8; r++) {
            const int bl = 8 * r + l;
            const u32* a = (const u32*)((size_t)(w + 17 * bl) & ~(size_t)3);
            u32 wv[5];
#pragma unroll
            for (int i = 0; i < 5; i++) wv[i] = a[i];
            const u32 e = (wv[0] >> sh) & 0xffu;
            u32 v[8];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u32 q = sh == 24 ? wv[j + 1] : __funnelshift_r(wv[j], wv[j + 1], sh + 8);
                mmid_e2m1(q, &v[2 * j], &v[2 * j + 1]);
            }
            const int b = b0 + bl;
            const uint4 a0 = *(const uint4*)(act + 32 * b);
            const uint4 a1 = *(const uint4*)(act + 32 * b + 16);
            const int si = mmid_dp4a8(v, a0, a1);
            const float ad = ((const float*)(act + 32 * nb))[b];
            const float term = __fmul_rn(__fmul_rn(ad, mmid_e8m0_half(e)), (float)si);
#pragma unroll
            for (int i = 0; i < 8; i++) s.sum = __fadd_rn(s.sum, __shfl_sync(FULL_MASK, term, i, 8));
        }
    }
    static __device__ __forceinline__ float finish(St& s, int) { return s.sum; }
};

template <int FMT>
struct MmidD;
template <>
struct MmidD<MMID_Q8_0> : MmidDQ8_0 {};
template <>
struct MmidD<MMID_Q4_K> : MmidDQ4K {};
template <>
struct MmidD<MMID_Q2_K> : MmidDQ2K {};
template <>
struct MmidD<MMID_IQ2_XXS> : MmidDIQ2 {};
template <>
struct MmidD<MMID_MXFP4> : MmidDMX {};

// Same arguments as mmid_body (tiles of one pair). Dynamic shared memory:
// the staged activation row (astride bytes), the routing counters when P >
// 32 (4 * experts bytes, rounded up to 16), then the warps' rings. The
// expert's bytes are below 2^32 (the host checks).
template <int FMT>
DEV void mmid_dbody(const u8* w, const float* x, const i32* ids, float* out, int m, int kdim, int P, int slots,
                    int x_per_pair, int experts, u64 expert_bytes, u64 row_bytes, int rows_per_block,
                    int astride) {
    typedef MmidD<FMT> F;
    // 16-byte pieces of a stage (four row slices), spread over the lanes.
    constexpr int NCH = F::KB * F::BYTES / 16, NPIECE = 4 * NCH, JM = (NPIECE + 31) / 32;
    extern __shared__ __align__(16) u8 mmid_dyn[];
    __shared__ MmidTile tile;
    __shared__ int warp_cnt[MMID_D_WARPS];
    __shared__ __align__(16) u32 iq2_grid[FMT == MMID_IQ2_XXS ? 512 : 2];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row_lo = blockIdx.x * rows_per_block;
    const int row_hi = min(m, row_lo + rows_per_block);
    if (FMT == MMID_IQ2_XXS) mmid_iq2xxs_grid(iq2_grid);
    const int route = P <= MMID_WARP_ROUTE ? 0 : ((4 * experts + 15) & ~15);
    if (P <= MMID_WARP_ROUTE) {
        if (threadIdx.x < 32) mmid_route_warp<1>(ids, P, experts, blockIdx.y, &tile);
    } else {
        mmid_route_block<1>(ids, P, experts, blockIdx.y, &tile, (int*)(mmid_dyn + astride), warp_cnt);
    }
    __syncthreads();
    if (blockIdx.y == 0) mmid_nan_invalid(ids, P, experts, out, m, row_lo, row_hi);
    const int e = tile.expert;
    if (e < 0) return;
    const u8* we = w + (size_t)e * expert_bytes;
    const int nb = kdim / (FMT == MMID_Q8_0 || FMT == MMID_MXFP4 ? 32 : 256);
    const int nsl = nb / F::KB;  // whole slices (the host checks)
    const int npass = (row_hi - row_lo + MMID_ROWS - 1) / MMID_ROWS;
    const int nunits = npass * nsl;
    const u32 ring = mmid_smem(mmid_dyn + astride + route + warp * (F::NS * 4 * F::RS));
    // This lane's pieces: stage offset, row (0..3) and byte offset in the slice.
    u32 pdst[JM], prow[JM];
    int prg[JM];
#pragma unroll
    for (int j = 0; j < JM; j++) {
        const int i = min(lane + 32 * j, NPIECE - 1);
        prg[j] = i / NCH;
        const u32 c16 = 16u * (u32)(i - prg[j] * NCH);
        pdst[j] = (u32)prg[j] * F::RS + c16;
        prow[j] = c16;
    }
    // Issue state: pass, slice, unit; the pieces' row offsets in the expert.
    int ipass = -1, isl = 0, iq = 0;
    u32 poff[JM];
    auto issue_next = [&](int s) {
        if (iq < nunits) {
            if (isl == 0) {
                ipass++;
#pragma unroll
                for (int j = 0; j < JM; j++) {
                    const int row = min(row_lo + ipass * MMID_ROWS + 4 * warp + prg[j], row_hi - 1);
                    poff[j] = (u32)row * (u32)row_bytes + prow[j];
                }
            }
            const u32 off = (u32)isl * (F::KB * F::BYTES);
            const u32 base = ring + (u32)s * (4 * F::RS);
#pragma unroll
            for (int j = 0; j < JM; j++)
                if (lane + 32 * j < NPIECE)
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(base + pdst[j]),
                                 "l"(we + (poff[j] + off))
                                 : "memory");
            iq++;
            if (++isl == nsl) isl = 0;
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    // The activations' first loads go out before the weights' (they would
    // queue behind them), the weights' before the quantization.
    const int pair = tile.pair[0];
    const float* xrow = x + (size_t)(x_per_pair ? pair : pair / slots) * kdim;
    float xv[16];
    mmid_dload<FMT>(xrow, nb, 0, xv);
#pragma unroll
    for (int s = 0; s < F::NS; s++) issue_next(s);
    mmid_dquant<FMT>(xv, nb, 0, mmid_dyn);
    for (int r = 1; r < mmid_drounds<FMT>(nb); r++) {
        mmid_dload<FMT>(xrow, nb, r, xv);
        mmid_dquant<FMT>(xv, nb, r, mmid_dyn);
    }
    __syncthreads();
    const int order = mmid_q4k_order(m, tile.ne, tile.first_rank);
    const int rg = lane >> 3;
    const u8* wbase = mmid_dyn + astride + route + warp * (F::NS * 4 * F::RS) + rg * F::RS;
    typename F::St st;
    F::init(st);
    int s = 0, csl = 0, crow = row_lo + 4 * warp + rg;
    for (int q = 0; q < nunits; q++) {
        // Unit q's group is complete when at most NS - 1 later ones are pending.
        asm volatile("cp.async.wait_group %0;" ::"n"(F::NS - 1) : "memory");
        __syncwarp();
        const u8* srow = wbase + s * (4 * F::RS);
        const int b0 = csl * F::KB;
        if constexpr (FMT == MMID_IQ2_XXS)
            F::step(st, srow, mmid_dyn, nb, b0, F::KB, order, (const uint2*)iq2_grid);
        else
            F::step(st, srow, mmid_dyn, nb, b0, F::KB, order);
        if (++csl == nsl) {
            const float r = F::finish(st, order);
            if ((lane & 7) == 0 && crow < row_hi) out[(size_t)pair * m + crow] = r;
            F::init(st);
            csl = 0;
            crow += MMID_ROWS;
        }
        __syncwarp();
        issue_next(s);
        if (++s == F::NS) s = 0;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}

#define MMID_DENTRY(NAME, FMT)                                                                             \
    extern "C" __global__ void __launch_bounds__(MMID_THREADS, 3)                                          \
        NAME(const u8* w, const float* x, const i32* ids, float* out, int m, int kdim, int P, int slots,   \
             int x_per_pair, int experts, u64 expert_bytes, u64 row_bytes, int rows_per_block,             \
             int astride) {                                                                                \
        pdl_sync();                                                                                        \
        mmid_dbody<FMT>(w, x, ids, out, m, kdim, P, slots, x_per_pair, experts, expert_bytes, row_bytes, \
                        rows_per_block, astride);                                                          \
    }
MMID_DENTRY(mmid_q8_0_d1, MMID_Q8_0)
MMID_DENTRY(mmid_q4_k_d1, MMID_Q4_K)
MMID_DENTRY(mmid_q2_k_d1, MMID_Q2_K)
MMID_DENTRY(mmid_iq2_xxs_d1, MMID_IQ2_XXS)
MMID_DENTRY(mmid_mxfp4_d1, MMID_MXFP4)
