// Indexed expert matmul (MatMulId): out[p * m + r] = W[ids[p]] row r . act(p)
// for every (token, slot) pair p = i * slots + s, in the order of weft's CPU
// kernel (kernels/src/cpu/moe.rs): the pairs are grouped by expert (in pair
// order) and each expert's group goes through the CPU matmul kernels, whose
// float order for Q4_K, Q6_K and the float formats depends on the group's
// size `ne` and the pair's rank in it (cpu/quant/order.rs, float_gemm.rs);
// Q2_K, IQ2_XXS and MXFP4 take weft_ops::quant's reference dot products (one
// f32 accumulator, blocks in order).
//
// Layout: one kernel per weight format and tile width TT (1 or 4). A tile is
// up to TT pairs routed to the same expert (each expert's pairs in order, cut
// into pieces of TT), so one weight load feeds TT products. Grid: x = ranges
// of weight rows, y = tiles (an upper bound; blocks past the last tile
// return). A block of 256 threads
//   1. finds its tile from the ids in device memory (one warp when there are
//      at most 32 pairs, else the whole block: expert counts, then a stable
//      compaction of the tile's pairs),
//   2. quantizes the tile's activation rows into shared memory exactly as the
//      CPU's quantizers do (Q8_0 / Q8_1 repacked: 32 quants per block, then
//      the f16-rounded scales as floats; Q8_K as its 292-byte blocks); the
//      float formats read x directly,
//   3. computes 32 weight rows per pass, eight lanes per row, each lane for
//      the TT pairs of the tile:
//      - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and Q4_K / Q6_K in ggml's vec_dot
//        order: lane k is vec_dot's accumulator lane k (elements 4k..4k+3 of
//        every 32-element chunk), hsum_float_8 at the end;
//      - Q4_K repacked / tiled, Q6_K tiled, Q2_K, IQ2_XXS: the eight lanes
//        split each 256-element super-block, their exact integer sums are
//        combined by shuffles, and every lane applies the CPU's per-block
//        float step (one accumulator, blocks in order);
//      - MXFP4: lane k computes block 8j + k's term (activation quants
//        staged interleaved to match the nibbles' order), then all lanes add
//        the eight terms in block order (broadcast shuffles);
//      - F32, F16, BF16: ggml's vec_dot (four 16-lane accumulators) or
//        tinyBLAS (one), each lane holding accumulator lanes k and k + 8.
// Rows past the matrix still run (the shuffles need every lane) and skip the
// store. Pairs whose id lies outside 0..experts get NaN rows (the CPU kernel
// refuses them).

#define MMID_THREADS 256
#define MMID_ROWS 32  // weight rows per pass: MMID_THREADS / 8
#define MMID_TT_MAX 4
#define MMID_WARP_ROUTE 32  // at most this many pairs: one warp routes

// Formats (the template argument of the kernels).
#define MMID_F32 0
#define MMID_F16 1
#define MMID_BF16 2
#define MMID_Q4_0 3
#define MMID_Q4_1 4
#define MMID_Q5_0 5
#define MMID_Q5_1 6
#define MMID_Q8_0 7
#define MMID_Q4_K 8
#define MMID_Q6_K 9
#define MMID_Q2_K 10
#define MMID_IQ2_XXS 11
#define MMID_MXFP4 12

// Activation format of each weight format: 0 none (floats), 1 Q8_0, 2 Q8_1, 3 Q8_K.
template <int FMT>
struct MmidAct {
    enum {
        KIND = FMT <= MMID_BF16                          ? 0
               : (FMT == MMID_Q4_1 || FMT == MMID_Q5_1) ? 2
               : (FMT == MMID_Q4_K || FMT == MMID_Q6_K || FMT == MMID_Q2_K || FMT == MMID_IQ2_XXS)
                   ? 3
                   : 1
    };
};

struct MmidTile {
    int expert;      // -1: this block has no tile
    int count;       // pairs in the tile (1..TT)
    int ne;          // pairs routed to the expert in the whole call
    int first_rank;  // rank of pair[0] among them (pair order)
    int pair[MMID_TT_MAX];
};

// ---- routing -------------------------------------------------------------------

// Tiles enumerate the experts in increasing order; an expert with c pairs
// has ceil(c / TT) tiles, its pairs in pair order. One warp, P <= 32.
template <int TT>
DEV void mmid_route_warp(const i32* ids, int P, int experts, int t, MmidTile* tile) {
    const int lane = threadIdx.x & 31;
    if (lane == 0) tile->expert = -1;
    __syncwarp();
    int e = -1;
    if (lane < P) {
        const int v = ids[lane];
        if (v >= 0 && v < experts) e = v;
    }
    const u32 peers = __match_any_sync(FULL_MASK, e);
    const int cnt = __popc(peers);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    // The expert's tile count, held by its first pair.
    const int tiles = (e >= 0 && rank == 0) ? (cnt + TT - 1) / TT : 0;
    int base = 0;
    for (int q = 0; q < P; q++) {
        const int eq = __shfl_sync(FULL_MASK, e, q);
        const int nq = __shfl_sync(FULL_MASK, tiles, q);
        if (eq < e) base += nq;
    }
    if (e >= 0 && base + rank / TT == t) {
        const int slot = rank % TT;
        tile->pair[slot] = lane;
        if (slot == 0) {
            tile->expert = e;
            tile->ne = cnt;
            tile->first_rank = rank;
            tile->count = min(TT, cnt - rank);
        }
    }
}

// The same tiles for any P, by the whole block; `cnt` holds `experts` ints.
template <int TT>
DEV void mmid_route_block(const i32* ids, int P, int experts, int t, MmidTile* tile, int* cnt,
                          int* warp_cnt) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    for (int i = tid; i < experts; i += blockDim.x) cnt[i] = 0;
    if (tid == 0) tile->expert = -1;
    __syncthreads();
    for (int p = tid; p < P; p += blockDim.x) {
        const int v = ids[p];
        if (v >= 0 && v < experts) atomicAdd(&cnt[v], 1);
    }
    __syncthreads();
    if (warp == 0) {
        int run = 0;  // tiles of the experts before this chunk (warp-uniform)
        for (int e0 = 0; e0 < experts && run <= t; e0 += 32) {
            const int e = e0 + lane;
            const int c = e < experts ? cnt[e] : 0;
            const int nt = (c + TT - 1) / TT;
            int incl = nt;
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(FULL_MASK, incl, o);
                if (lane >= o) incl += v;
            }
            const int base = run + incl - nt;
            if (nt > 0 && t >= base && t < base + nt) {
                const int lt = t - base;
                tile->expert = e;
                tile->ne = c;
                tile->first_rank = lt * TT;
                tile->count = min(TT, c - lt * TT);
            }
            run += __shfl_sync(FULL_MASK, incl, 31);
        }
    }
    __syncthreads();
    const int e = tile->expert;
    if (e < 0) return;  // uniform
    const int r0 = tile->first_rank;
    // Stable compaction: warp w scans a contiguous range of pairs.
    const int per = (((P + nw - 1) / nw) + 31) & ~31;
    const int lo = min(P, warp * per), hi = min(P, lo + per);
    int c = 0;
    for (int p0 = lo; p0 < hi; p0 += 32) {
        const int p = p0 + lane;
        c += __popc(__ballot_sync(FULL_MASK, p < hi && ids[p] == e));
    }
    if (lane == 0) warp_cnt[warp] = c;
    __syncthreads();
    int run = 0;
    for (int w2 = 0; w2 < warp; w2++) run += warp_cnt[w2];
    for (int p0 = lo; p0 < hi && run < r0 + TT; p0 += 32) {
        const int p = p0 + lane;
        const bool hit = p < hi && ids[p] == e;
        const u32 bal = __ballot_sync(FULL_MASK, hit);
        const int r = run + __popc(bal & ((1u << lane) - 1u));
        if (hit && r >= r0 && r < r0 + TT) tile->pair[r - r0] = p;
        run += __popc(bal);
    }
}

// NaN rows [row_lo, row_hi) for the pairs whose id is outside 0..experts.
DEV void mmid_nan_invalid(const i32* ids, int P, int experts, float* out, int m, int row_lo,
                          int row_hi) {
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int p = threadIdx.x >> 5; p < P; p += nw) {
        const int v = ids[p];
        if (v >= 0 && v < experts) continue;
        for (int r = row_lo + lane; r < row_hi; r += 32)
            out[(size_t)p * m + r] = __int_as_float(0x7fc00000);
    }
}

// ---- activation staging ------------------------------------------------------------

// Q8_0 / Q8_1 blocks of the slots' rows, repacked: per slot the nb blocks'
// 32 quants, then nb scales, then (Q8_1) nb sums, as the floats of their f16
// values. Arithmetic of rows.cu's quant_q8_warp (the CPU's quantizer).
// INTERLEAVE (MXFP4): quant j at byte 2j, quant j + 16 at byte 2j + 1.
template <int WITH_SUM, int TT, int INTERLEAVE>
DEV void mmid_stage_q8(const float* x, const int* xrow, int kdim, u8* act, int astride) {
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int nb = kdim / 32, total = TT * nb;
    // Eight blocks per warp and round, their loads issued first.
    for (int gb0 = threadIdx.x >> 5; gb0 < total; gb0 += 8 * nw) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int gb = gb0 + u * nw;
            const int s = min(gb, total - 1) / nb, b = min(gb, total - 1) - s * nb;
            int xr = xrow[0];
#pragma unroll
            for (int i = 1; i < TT; i++)
                if (s == i) xr = xrow[i];
            v[u] = x[(size_t)xr * kdim + 32 * b + lane];
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int gb = gb0 + u * nw;
            if (gb >= total) break;  // warp-uniform
            const int s = gb / nb, b = gb - s * nb;
            const float amax = warp_max(fabsf(v[u]));
            const float d = amax / 127.0f;
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            int q = __float2int_rn(v[u] * id);
            q = max(-128, min(127, q));
            u8* a = act + (size_t)s * astride;
            a[32 * b + (INTERLEAVE ? (lane < 16 ? 2 * lane : 2 * lane - 31) : lane)] = (u8)(i8)q;
            const int sum = WITH_SUM ? warp_sum_i(q) : 0;
            if (lane == 0) {
                ((float*)(a + 32 * nb))[b] = round16(d);
                if (WITH_SUM) ((float*)(a + 36 * nb))[b] = round16(d * (float)sum);
            }
        }
    }
}

// Q8_K blocks of the slots' rows (rows.cu's quant_q8k_warp), 292 bytes each.
template <int TT>
DEV void mmid_stage_q8k(const float* x, const int* xrow, int kdim, u8* act, int astride) {
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int nb = kdim / 256;
    for (int gb = threadIdx.x >> 5; gb < TT * nb; gb += nw) {
        const int s = gb / nb, b = gb - s * nb;
        int xr = xrow[0];
#pragma unroll
        for (int i = 1; i < TT; i++)
            if (s == i) xr = xrow[i];
        const float* src = x + (size_t)xr * kdim + 256 * b + 8 * lane;
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = src[i];
        quant_q8k_warp(v, act + (size_t)s * astride + (size_t)b * Q8K_BYTES);
    }
}

// ---- 32-element formats in vec_dot's order ---------------------------------------

// Q5_1: d, m, qh (u32), qs[16]; unsigned codes 0..31.
struct MmidFmtQ5_1 {
    enum { BYTES = 24, HAS_MIN = 1 };
    static __device__ __forceinline__ u32 codes(const u8* b, int k) {
        u32 w = ld_u32_a4(b + 8 + 4 * (k & 3));
        u32 nib = (w >> (4 * (k >> 2))) & 0x0f0f0f0fu;
        u32 hb = (ld_u32_a4(b + 4) >> (4 * k)) & 0xfu;
        return nib | ((hb & 1u) << 4) | ((hb & 2u) << 11) | ((hb & 4u) << 18) | ((hb & 8u) << 25);
    }
};

// Weight blocks whose loads one lane issues before using any.
#define MMID_B32_CHUNK 8

template <class F, int TT>
DEV void mmid_row_b32(const u8* wrow, const u8* act, int astride, int nb, float* res) {
    const int k = threadIdx.x & 7;
    float acc[TT], summs[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = summs[t] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += MMID_B32_CHUNK) {
        u32 wq[MMID_B32_CHUNK];
        float wd[MMID_B32_CHUNK], wm[MMID_B32_CHUNK];
#pragma unroll
        for (int j = 0; j < MMID_B32_CHUNK; j++) {
            const u8* wb = wrow + (size_t)min(b0 + j, nb - 1) * F::BYTES;
            wq[j] = F::codes(wb, k);
            wd[j] = ld_f16(wb);
            wm[j] = F::HAS_MIN ? ld_f16(wb + 2) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < MMID_B32_CHUNK; j++) {
            const int b = b0 + j;
            if (b >= nb) break;
#pragma unroll
            for (int t = 0; t < TT; t++) {
                const u8* a = act + (size_t)t * astride;
                const u32 aq = *(const u32*)(a + 32 * b + 4 * k);
                const float ad = ((const float*)(a + 32 * nb))[b];
                acc[t] = __fmaf_rn(__fmul_rn(wd[j], ad), dp4a_f32(wq[j], aq), acc[t]);
                if (F::HAS_MIN)
                    summs[t] = __fmaf_rn(wm[j], ((const float*)(a + 36 * nb))[b], summs[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        res[t] = hsum8_lanes(acc[t]);
        if (F::HAS_MIN) res[t] = res[t] + summs[t];
    }
}

// ---- MXFP4 x Q8_0: weft_ops::quant::mxfp4::dot ------------------------------------

// 2^(e - 128) (ggml_e8m0_to_fp32_half).
DEV float mmid_e8m0_half(u32 e) {
    return __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1u) << 23));
}

// Eight E2M1 codes (byte i of q: element i in its low nibble, element i + 16
// in its high nibble) as the doubled E2M1 values, one i8 per byte, in the
// order of the bytes' nibbles: *t0 elements 0, 16, 1, 17; *t1 elements 2,
// 18, 3, 19 (of the four bytes' groups; the activations are staged to match).
DEV void mmid_e2m1(u32 q, u32* t0, u32* t1) {
    const u32 pos0 = 0x03020100u, pos1 = 0x0c080604u;  // 0 1 2 3 | 4 6 8 12
    const u32 neg0 = 0xfdfeff00u, neg1 = 0xf4f8fafcu;  // 0 -1 -2 -3 | -4 -6 -8 -12
    // Nibble n of `pick`: n % 4, plus 4 when code n is negative (bit 3).
    const u32 pick = 0x32103210u | ((q & 0x88888888u) >> 1);
    u32 t[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const u32 sel = (q >> (16 * i)) & 0x7777u;
        const u32 p = __byte_perm(pos0, pos1, sel);
        const u32 n = __byte_perm(neg0, neg1, sel);
        t[i] = __byte_perm(p, n, (pick >> (16 * i)) & 0xffffu);
    }
    *t0 = t[0];
    *t1 = t[1];
}

// The exact integer dot product of 32 signed bytes (an MXFP4 block's eight
// words of doubled codes) with a Q8 activation block's codes (two 16-byte
// pieces), dp4a after dp4a in order.
DEV int mmid_dp4a8(const u32* v, uint4 a0, uint4 a1) {
    int si = __dp4a((int)v[0], (int)a0.x, 0);
    si = __dp4a((int)v[1], (int)a0.y, si);
    si = __dp4a((int)v[2], (int)a0.z, si);
    si = __dp4a((int)v[3], (int)a0.w, si);
    si = __dp4a((int)v[4], (int)a1.x, si);
    si = __dp4a((int)v[5], (int)a1.y, si);
    si = __dp4a((int)v[6], (int)a1.z, si);
    return __dp4a((int)v[7], (int)a1.w, si);
}

// Rounds of eight blocks whose loads one lane issues before using any.
#define MMID_MX_CHUNK 4

// Lane k takes block 8j + k of round j: its 17 bytes (any alignment) come
// from five aligned words, each of which holds a byte of the block.
template <int TT>
DEV void mmid_row_mxfp4(const u8* wrow, const u8* act, int astride, int nb, float* res) {
    const int k = threadIdx.x & 7;
    float sum[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) sum[t] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += 8 * MMID_MX_CHUNK) {
        u32 wv[MMID_MX_CHUNK][5];
#pragma unroll
        for (int c = 0; c < MMID_MX_CHUNK; c++) {
            const u8* p = wrow + (size_t)min(b0 + 8 * c + k, nb - 1) * 17;
            const u32* a = (const u32*)((size_t)p & ~(size_t)3);
#pragma unroll
            for (int i = 0; i < 5; i++) wv[c][i] = a[i];
        }
#pragma unroll
        for (int c = 0; c < MMID_MX_CHUNK; c++) {
            const int rb = b0 + 8 * c;
            if (rb >= nb) break;
            const int b = min(rb + k, nb - 1);
            const int sh = (int)((size_t)(wrow + (size_t)b * 17) & 3) * 8;
            const u32 e = (wv[c][0] >> sh) & 0xffu;
            u32 v[8];  // in the staged activations' interleaved order
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u32 q = sh == 24 ? wv[c][j + 1] : __funnelshift_r(wv[c][j], wv[c][j + 1], sh + 8);
                mmid_e2m1(q, &v[2 * j], &v[2 * j + 1]);
            }
            const float dw = mmid_e8m0_half(e);
            const int nv = min(8, nb - rb);
#pragma unroll
            for (int t = 0; t < TT; t++) {
                const u8* a = act + (size_t)t * astride;
                const uint4 a0 = *(const uint4*)(a + 32 * b);
                const uint4 a1 = *(const uint4*)(a + 32 * b + 16);
                const int si = mmid_dp4a8(v, a0, a1);
                const float ad = ((const float*)(a + 32 * nb))[b];
                const float term = __fmul_rn(__fmul_rn(ad, dw), (float)si);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float ti = __shfl_sync(FULL_MASK, term, i, 8);
                    if (i < nv) sum[t] = __fadd_rn(sum[t], ti);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) res[t] = sum[t];
}
