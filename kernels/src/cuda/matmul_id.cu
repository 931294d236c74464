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

// ---- K formats x Q8_K ----------------------------------------------------------------

// Super-blocks whose loads one lane issues before using any.
#define MMID_K_CHUNK 4

// Byte i of the little-endian words w.
DEV u32 mmid_byte(const u32* w, int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xffu; }

// Q4_K's six-bit scale and minimum j from the 12 scale bytes (as words).
DEV void mmid_q4k_scale(const u32* s, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = (int)(mmid_byte(s, j) & 63u);
        *mn = (int)(mmid_byte(s, j + 4) & 63u);
    } else {
        *sc = (int)((mmid_byte(s, j + 4) & 0x0fu) | ((mmid_byte(s, j - 4) >> 6) << 4));
        *mn = (int)((mmid_byte(s, j + 4) >> 4) | ((mmid_byte(s, j) >> 6) << 4));
    }
}

// Q4_K's order for slot t (order.rs): 0 vec_dot, 1 repacked gemv, 2 repacked
// gemm, 3 tiled.
DEV int mmid_q4k_order(int m, int ne, int rank) {
    if (m % 8 == 0) return rank < ne - ne % 4 ? 2 : 1;
    return ne >= 8 ? 3 : 0;
}

// matmul.cu's mm_q4k for one weight row and the tile's slots, each slot in
// its own order.
template <int TT>
DEV void mmid_row_q4k(const u8* wrow, const u8* act, int astride, int nb, const int* order,
                      float* res) {
    const int k = threadIdx.x & 7, km = k & 3;
    float acc[TT], accm[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = accm[t] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += MMID_K_CHUNK) {
        u32 wq[MMID_K_CHUNK][4], ws[MMID_K_CHUNK][3], wdm[MMID_K_CHUNK];
#pragma unroll
        for (int c = 0; c < MMID_K_CHUNK; c++) {
            const u8* x = wrow + (size_t)min(b0 + c, nb - 1) * 144;
            wdm[c] = ld_u32_a4(x);
#pragma unroll
            for (int i = 0; i < 3; i++) ws[c][i] = ld_u32_a4(x + 4 + 4 * i);
#pragma unroll
            for (int cp = 0; cp < 4; cp++) wq[c][cp] = ld_u32_a4(x + 16 + 32 * cp + 4 * k);
        }
#pragma unroll
        for (int c = 0; c < MMID_K_CHUNK; c++) {
            const int b = b0 + c;
            if (b >= nb) break;
            int sc[8], mn[8];
#pragma unroll
            for (int j = 0; j < 8; j++) mmid_q4k_scale(ws[c], j, &sc[j], &mn[j]);
            u32 lo[4], hi[4];
#pragma unroll
            for (int cp = 0; cp < 4; cp++) {
                lo[cp] = wq[c][cp] & 0x0f0f0f0fu;
                hi[cp] = (wq[c][cp] >> 4) & 0x0f0f0f0fu;
            }
            const float wd = h2f((u16)(wdm[c] & 0xffffu)), wdmin = h2f((u16)(wdm[c] >> 16));
#pragma unroll
            for (int t = 0; t < TT; t++) {
                const u8* y = act + (size_t)t * astride + (size_t)b * Q8K_BYTES;
                int pair[4];
#pragma unroll
                for (int cp = 0; cp < 4; cp++)
                    pair[cp] = sc[2 * cp] * __dp4a((int)lo[cp], (int)ld_u32_a4(y + 4 + 64 * cp + 4 * k), 0) +
                               sc[2 * cp + 1] * __dp4a((int)hi[cp], (int)ld_u32_a4(y + 36 + 64 * cp + 4 * k), 0);
                const float yd = __int_as_float((int)ld_u32_a4(y));
                const i16* bs = (const i16*)(y + 260);
                auto imin = [&](int p) {
                    const int b0s = (int)bs[4 * p] + (int)bs[4 * p + 1];
                    const int b1s = (int)bs[4 * p + 2] + (int)bs[4 * p + 3];
                    return mn[2 * p] * b0s + mn[2 * p + 1] * b1s;
                };
                if (order[t] == 0) {
                    const int sumi = (pair[0] + pair[1]) + (pair[2] + pair[3]);
                    const float d = __fmul_rn(yd, wd);
                    const float dmin = __fmul_rn(-yd, wdmin);
                    // imin(km), selected (a register array indexed by the lane
                    // would live in local memory).
                    const int im = km == 0 ? imin(0) : km == 1 ? imin(1) : km == 2 ? imin(2) : imin(3);
                    acc[t] = __fmaf_rn(d, (float)sumi, acc[t]);
                    accm[t] = __fmaf_rn(dmin, (float)im, accm[t]);
                    continue;
                }
                // Whole integer sums over the eight lanes (exact, any order).
#pragma unroll
                for (int cp = 0; cp < 4; cp++)
#pragma unroll
                    for (int o = 1; o < 8; o <<= 1) pair[cp] += __shfl_xor_sync(FULL_MASK, pair[cp], o, 8);
                const int isum = pair[0] + pair[1] + pair[2] + pair[3];
                const int msum = imin(0) + imin(1) + imin(2) + imin(3);
                if (order[t] == 3) {
                    const float rr = __fmaf_rn(-wdmin, (float)msum, __fmul_rn((float)isum, wd));
                    acc[t] = __fmaf_rn(rr, yd, acc[t]);
                } else {
                    const float dd = __fmul_rn(wd, yd), dm = __fmul_rn(wdmin, yd);
                    if (order[t] == 2) {
#pragma unroll
                        for (int cp = 0; cp < 4; cp++) {
                            acc[t] = __fmaf_rn((float)pair[cp], dd, acc[t]);
                            accm[t] = __fmaf_rn((float)imin(cp), dm, accm[t]);
                        }
                    } else {
                        acc[t] = __fmaf_rn((float)isum, dd, acc[t]);
                        accm[t] = __fmaf_rn((float)msum, dm, accm[t]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        if (order[t] == 0) {
            const float s = hsum8_lanes(acc[t]);
            // lanes 0..3 hold acc_m[0..3]: (m0 + m2) + (m1 + m3)
            const float u = accm[t] + __shfl_down_sync(FULL_MASK, accm[t], 2, 8);
            const float mm = u + __shfl_down_sync(FULL_MASK, u, 1, 8);
            res[t] = s + mm;
        } else {
            res[t] = order[t] == 3 ? acc[t] : acc[t] - accm[t];
        }
    }
}

// matmul.cu's mm_q6k for one weight row: vec_dot's order, or the tiled one
// (the expert's group has 8 or more pairs).
template <int TT>
DEV void mmid_row_q6k(const u8* wrow, const u8* act, int astride, int nb, bool tiled, float* res) {
    const int k = threadIdx.x & 7;
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const u8* x = wrow + (size_t)b * 210;
        u32 wq[8];
        int sc[8];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const u32 ql0 = ld_u32_a2(x + 64 * h + 4 * k);
            const u32 ql1 = ld_u32_a2(x + 64 * h + 32 + 4 * k);
            const u32 qh = ld_u32_a2(x + 128 + 32 * h + 4 * k);
            const u32 nib[4] = {ql0 & 0x0f0f0f0fu, ql1 & 0x0f0f0f0fu, (ql0 >> 4) & 0x0f0f0f0fu,
                                (ql1 >> 4) & 0x0f0f0f0fu};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u32 high = ((qh >> (2 * j)) & 0x03030303u) << 4;
                wq[4 * h + j] = nib[j] | high;  // 0..63
                sc[4 * h + j] = (int)(i8)x[192 + 2 * (4 * h + j) + (k >> 2)];
            }
        }
        const int off_sc0 = (int)(i8)x[192 + 2 * k], off_sc1 = (int)(i8)x[192 + 2 * k + 1];
        const float wd = ld_f16(x + 208);
#pragma unroll
        for (int t = 0; t < TT; t++) {
            const u8* y = act + (size_t)t * astride + (size_t)b * Q8K_BYTES;
            int sumi = 0;
#pragma unroll
            for (int c = 0; c < 8; c++)
                sumi += sc[c] * __dp4a((int)wq[c], (int)ld_u32_a4(y + 4 + 32 * c + 4 * k), 0);
            const i16* bs = (const i16*)(y + 260);
            sumi -= 32 * ((int)bs[2 * k] * off_sc0 + (int)bs[2 * k + 1] * off_sc1);
            const float yd = __int_as_float((int)ld_u32_a4(y));
            if (tiled) {
#pragma unroll
                for (int o = 1; o < 8; o <<= 1) sumi += __shfl_xor_sync(FULL_MASK, sumi, o, 8);
                acc[t] = __fmaf_rn(__fmul_rn((float)sumi, wd), yd, acc[t]);
            } else {
                acc[t] = __fmaf_rn(__fmul_rn(yd, wd), (float)sumi, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) res[t] = tiled ? acc[t] : hsum8_lanes(acc[t]);
}

DEV int mmid_sum8(int v) {
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) v += __shfl_xor_sync(FULL_MASK, v, o, 8);
    return v;
}

// Q2_K (weft_ops::quant::q2_k::dot, ggml's generic order): per super-block
// sumf += d_a d * isum - d_a dmin * summs. Lane l takes the quant bytes
// 4l..4l+3 of each 32-byte half (elements 128h + 32kk + 4l + i, sub-block
// 8h + 2kk + l / 4) and the minimums of sub-blocks 2l, 2l + 1.
template <int TT>
DEV void mmid_row_q2k(const u8* wrow, const u8* act, int astride, int nb, float* res) {
    const int l = threadIdx.x & 7, half = l >> 2;
    float sum[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) sum[t] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += MMID_K_CHUNK) {
        u32 wq[MMID_K_CHUNK][2], ws[MMID_K_CHUNK][4], wdm[MMID_K_CHUNK], wsm[MMID_K_CHUNK];
#pragma unroll
        for (int c = 0; c < MMID_K_CHUNK; c++) {
            const u8* x = wrow + (size_t)min(b0 + c, nb - 1) * 84;
#pragma unroll
            for (int i = 0; i < 4; i++) ws[c][i] = ld_u32_a4(x + 4 * i);
            wq[c][0] = ld_u32_a4(x + 16 + 4 * l);
            wq[c][1] = ld_u32_a4(x + 48 + 4 * l);
            wdm[c] = ld_u32_a4(x + 80);
            wsm[c] = ld_u16(x + 2 * l);  // scales[2l], scales[2l + 1]
        }
#pragma unroll
        for (int c = 0; c < MMID_K_CHUNK; c++) {
            const int b = b0 + c;
            if (b >= nb) break;
            int scl[8];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    scl[4 * h + kk] = (int)((ws[c][2 * h + (kk >> 1)] >> (8 * (2 * (kk & 1) + half))) & 0xfu);
            const int m0 = (int)((wsm[c] >> 4) & 0xfu), m1 = (int)((wsm[c] >> 12) & 0xfu);
            const float wd = h2f((u16)(wdm[c] & 0xffffu)), wdmin = h2f((u16)(wdm[c] >> 16));
#pragma unroll
            for (int t = 0; t < TT; t++) {
                const u8* y = act + (size_t)t * astride + (size_t)b * Q8K_BYTES;
                int isum = 0;
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) {
                        const u32 codes = (wq[c][h] >> (2 * kk)) & 0x03030303u;
                        const u32 yw = ld_u32_a4(y + 4 + 128 * h + 32 * kk + 4 * l);
                        isum += scl[4 * h + kk] * __dp4a((int)codes, (int)yw, 0);
                    }
                const u32 bs = ld_u32_a4(y + 260 + 4 * l);
                int summs = (int)(i16)(bs & 0xffffu) * m0 + (int)(i16)(bs >> 16) * m1;
                isum = mmid_sum8(isum);
                summs = mmid_sum8(summs);
                const float yd = __int_as_float((int)ld_u32_a4(y));
                const float dall = __fmul_rn(yd, wd), dmin = __fmul_rn(yd, wdmin);
                const float term = __fsub_rn(__fmul_rn(dall, (float)isum), __fmul_rn(dmin, (float)summs));
                sum[t] = __fadd_rn(sum[t], term);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) res[t] = sum[t];
}

// ggml's iq2xxs_grid: 256 eight-value patterns, value j in bits 2j..2j+1 as
// an index into {8, 25, 43} (weft_ops::quant::iq2_xxs::GRID).
static __device__ const u16 MMID_IQ2XXS_GRID[256] = {
    0x0000, 0x0002, 0x0005, 0x0008, 0x000a, 0x0011, 0x0014, 0x0020, 0x0022, 0x0028, 0x002a, 0x0041,
    0x0044, 0x0050, 0x0058, 0x0061, 0x0064, 0x0080, 0x0082, 0x008a, 0x00a2, 0x0101, 0x0104, 0x0110,
    0x0115, 0x0140, 0x0184, 0x0198, 0x0200, 0x0202, 0x0222, 0x0282, 0x0401, 0x0404, 0x0410, 0x0421,
    0x0424, 0x0440, 0x0442, 0x0448, 0x0460, 0x0481, 0x0484, 0x0490, 0x04a4, 0x0500, 0x0502, 0x0508,
    0x0520, 0x0546, 0x0569, 0x0580, 0x0591, 0x0609, 0x0610, 0x0640, 0x0684, 0x06a4, 0x0800, 0x0805,
    0x0808, 0x0814, 0x0828, 0x0841, 0x0844, 0x0850, 0x0852, 0x0888, 0x0904, 0x0940, 0x0a02, 0x0a14,
    0x1001, 0x1004, 0x1010, 0x1021, 0x1040, 0x1060, 0x1084, 0x1090, 0x1095, 0x1100, 0x1108, 0x1120,
    0x1150, 0x115a, 0x1180, 0x1224, 0x1245, 0x1400, 0x1408, 0x1420, 0x1425, 0x1449, 0x1480, 0x1518,
    0x1562, 0x1600, 0x1616, 0x1801, 0x1804, 0x1810, 0x1840, 0x1881, 0x1900, 0x1905, 0x19a0, 0x1a51,
    0x2000, 0x2002, 0x200a, 0x2044, 0x2061, 0x2080, 0x2082, 0x2129, 0x2148, 0x2200, 0x2202, 0x2401,
    0x2404, 0x2410, 0x2440, 0x2456, 0x2500, 0x2541, 0x2564, 0x2690, 0x2808, 0x2820, 0x2894, 0x2a44,
    0x4001, 0x4004, 0x4010, 0x4018, 0x4021, 0x4024, 0x4040, 0x4048, 0x4056, 0x4060, 0x4081, 0x4084,
    0x4090, 0x4100, 0x4120, 0x4161, 0x4180, 0x4185, 0x4201, 0x4210, 0x4248, 0x4256, 0x4268, 0x4400,
    0x4408, 0x4420, 0x4480, 0x4499, 0x4512, 0x4524, 0x4600, 0x4801, 0x4804, 0x4810, 0x4840, 0x4845,
    0x4900, 0x4958, 0x4961, 0x4982, 0x4a45, 0x4a90, 0x5000, 0x5008, 0x5011, 0x5019, 0x5020, 0x5080,
    0x5088, 0x5104, 0x5142, 0x51a4, 0x5291, 0x5490, 0x5492, 0x550a, 0x5601, 0x5654, 0x5800, 0x5811,
    0x5819, 0x5864, 0x5940, 0x5a08, 0x6004, 0x6010, 0x6040, 0x6068, 0x6100, 0x6155, 0x6218, 0x6260,
    0x6400, 0x6405, 0x6510, 0x6512, 0x6584, 0x6842, 0x8000, 0x8002, 0x800a, 0x8041, 0x8082, 0x8104,
    0x8118, 0x8140, 0x8211, 0x8401, 0x8404, 0x8410, 0x8415, 0x8440, 0x8460, 0x8500, 0x8546, 0x8594,
    0x8609, 0x8640, 0x8660, 0x8802, 0x8904, 0x8a11, 0x9004, 0x9010, 0x9024, 0x9040, 0x90a1, 0x9116,
    0x9180, 0x9245, 0x9400, 0x9422, 0x9444, 0x9551, 0x9881, 0x9920, 0xa002, 0xa050, 0xa085, 0xa109,
    0xa200, 0xa418, 0xa850, 0xa904,
};

// The grid as bytes in shared memory: pattern i's values 0..3 in word 2i,
// 4..7 in word 2i + 1.
DEV void mmid_iq2xxs_grid(u32* grid) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        const u32 g = MMID_IQ2XXS_GRID[i];
        u32 w[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const u32 c = (g >> (2 * j)) & 3u;
            const u32 v = c == 0 ? 8u : c == 1 ? 25u : c == 2 ? 43u : 0u;
            w[j >> 2] |= v << (8 * (j & 3));
        }
        grid[2 * i] = w[0];
        grid[2 * i + 1] = w[1];
    }
}

// 0xff in byte j where bit j of the four sign bits s is set.
DEV u32 mmid_sign_mask(u32 s) { return (((s & 0xfu) * 0x00204081u) & 0x01010101u) * 0xffu; }

// IQ2_XXS (weft_ops::quant::iq2_xxs::dot): per super-block sumf += d d_a *
// bsum, then 0.125 * sumf. Lane l takes sub-block l (32 elements).
template <int TT>
DEV void mmid_row_iq2xxs(const u8* wrow, const u8* act, int astride, int nb, const u32* grid,
                         float* res) {
    const int l = threadIdx.x & 7;
    float sum[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) sum[t] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += MMID_K_CHUNK) {
        u32 wa[MMID_K_CHUNK], wb[MMID_K_CHUNK];
        u16 wd[MMID_K_CHUNK];
#pragma unroll
        for (int c = 0; c < MMID_K_CHUNK; c++) {
            const u8* x = wrow + (size_t)min(b0 + c, nb - 1) * 66;
            wd[c] = ld_u16(x);
            wa[c] = ld_u32_a2(x + 2 + 8 * l);
            wb[c] = ld_u32_a2(x + 6 + 8 * l);
        }
#pragma unroll
        for (int c = 0; c < MMID_K_CHUNK; c++) {
            const int b = b0 + c;
            if (b >= nb) break;
            u32 v[8];
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const u32 idx = (wa[c] >> (8 * g)) & 0xffu;
                const u32 s7 = (wb[c] >> (7 * g)) & 0x7fu;
                const u32 s8 = s7 | ((__popc(s7) & 1u) << 7);
                const u32 m0 = mmid_sign_mask(s8), m1 = mmid_sign_mask(s8 >> 4);
                v[2 * g] = __vsub4(grid[2 * idx] ^ m0, m0);
                v[2 * g + 1] = __vsub4(grid[2 * idx + 1] ^ m1, m1);
            }
            const int mul = 2 * (int)(wb[c] >> 28) + 1;
            const float xd = h2f(wd[c]);
#pragma unroll
            for (int t = 0; t < TT; t++) {
                const u8* y = act + (size_t)t * astride + (size_t)b * Q8K_BYTES;
                int si = 0;
#pragma unroll
                for (int i = 0; i < 8; i++) si = __dp4a((int)v[i], (int)ld_u32_a4(y + 4 + 32 * l + 4 * i), si);
                const int bsum = mmid_sum8(si * mul);
                const float yd = __int_as_float((int)ld_u32_a4(y));
                sum[t] = __fadd_rn(sum[t], __fmul_rn(__fmul_rn(xd, yd), (float)bsum));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) res[t] = __fmul_rn(0.125f, sum[t]);
}

// ---- float formats (activations converted from x on the fly) ----------------------

// The activation the CPU multiplies: x converted to the weights' type.
template <int W>
DEV float mmid_act(float v) {
    if (W == 0) return v;
    if (W == 1) return round16(v);
    return bf2f(f2bf(v));
}

// ggml's vec_dot (tiny = false) or tinyBLAS's order (tiny = true) for one
// weight row and the slots' rows xr[t]; lane k holds accumulator lanes k and
// k + 8 of ggml's sixteen. Valid in the group's first lane.
template <int W, int TT>
DEV void mmid_row_float(const u8* wrow, const float* const* xr, int kdim, bool tiny, float* res) {
    const int k = threadIdx.x & 7;
    if (tiny) {
        float acc[TT][2];
#pragma unroll
        for (int t = 0; t < TT; t++) acc[t][0] = acc[t][1] = 0.0f;
        if (W != 2) {
            for (int c = 0; c < kdim; c += 16) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int i = c + 8 * h + k;
                    const float wv = fval<W>(wrow, i);
#pragma unroll
                    for (int t = 0; t < TT; t++) acc[t][h] = __fmaf_rn(wv, mmid_act<W>(xr[t][i]), acc[t][h]);
                }
            }
        } else {
            for (int c = 0; c < kdim; c += 32) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int i = c + 2 * (k + 8 * h);
                    const float w1 = fval<W>(wrow, i + 1), w0 = fval<W>(wrow, i);
#pragma unroll
                    for (int t = 0; t < TT; t++) {
                        acc[t][h] = __fadd_rn(acc[t][h], __fmul_rn(w1, mmid_act<W>(xr[t][i + 1])));
                        acc[t][h] = __fadd_rn(acc[t][h], __fmul_rn(w0, mmid_act<W>(xr[t][i])));
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < TT; t++) res[t] = hsum8_lanes(__fadd_rn(acc[t][0], acc[t][1]));
        return;
    }
    const int body = kdim - kdim % 64;
    float red0[TT], red1[TT];
    if (W != 2) {
        float acc[TT][4][2];
#pragma unroll
        for (int t = 0; t < TT; t++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[t][j][0] = acc[t][j][1] = 0.0f;
        for (int base = 0; base < body; base += 64) {
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int i = base + 16 * j + 8 * h + k;
                    const float wv = fval<W>(wrow, i);
#pragma unroll
                    for (int t = 0; t < TT; t++)
                        acc[t][j][h] = __fmaf_rn(wv, mmid_act<W>(xr[t][i]), acc[t][j][h]);
                }
        }
#pragma unroll
        for (int t = 0; t < TT; t++) {
            // reduce4x16: fold the four accumulators per lane, then the lanes.
            float f[2];
#pragma unroll
            for (int h = 0; h < 2; h++)
                f[h] = __fadd_rn(__fadd_rn(acc[t][0][h], acc[t][2][h]), __fadd_rn(acc[t][1][h], acc[t][3][h]));
            red0[t] = hsum8_lanes(__fadd_rn(f[0], f[1]));
            red1[t] = 0.0f;
        }
    } else {
        float acc[TT][2][2];
#pragma unroll
        for (int t = 0; t < TT; t++)
#pragma unroll
            for (int j = 0; j < 2; j++) acc[t][j][0] = acc[t][j][1] = 0.0f;
        for (int base = 0; base < body; base += 64) {
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int i = base + 32 * j + 2 * (k + 8 * h);
                    const float w1 = fval<W>(wrow, i + 1), w0 = fval<W>(wrow, i);
#pragma unroll
                    for (int t = 0; t < TT; t++) {
                        acc[t][j][h] = __fadd_rn(acc[t][j][h], __fmul_rn(w1, mmid_act<W>(xr[t][i + 1])));
                        acc[t][j][h] = __fadd_rn(acc[t][j][h], __fmul_rn(w0, mmid_act<W>(xr[t][i])));
                    }
                }
        }
#pragma unroll
        for (int t = 0; t < TT; t++) {
            red0[t] = hsum8_lanes(__fadd_rn(acc[t][0][0], acc[t][0][1]));
            red1[t] = hsum8_lanes(__fadd_rn(acc[t][1][0], acc[t][1][1]));
        }
    }
    if (k != 0) return;  // the tails: the group's first lane alone
#pragma unroll
    for (int t = 0; t < TT; t++) {
        if (W == 0) {
            float v = red0[t];
            for (int i = body; i < kdim; i++) v = __fmaf_rn(fval<W>(wrow, i), xr[t][i], v);
            res[t] = v;
        } else if (W == 1) {
            double s = (double)red0[t];
            for (int i = body; i < kdim; i++)
                s = __dadd_rn(s, (double)__fmul_rn(fval<W>(wrow, i), mmid_act<W>(xr[t][i])));
            res[t] = __double2float_rn(s);
        } else {
            double s = 0.0;
            if (body > 0) {
                s = __dadd_rn(s, (double)red0[t]);
                s = __dadd_rn(s, (double)red1[t]);
            }
            for (int i = body; i < kdim; i++)
                s = __dadd_rn(s, (double)__fmul_rn(fval<W>(wrow, i), mmid_act<W>(xr[t][i])));
            res[t] = __double2float_rn(s);
        }
    }
}

// ---- the kernel body ----------------------------------------------------------------

// (w: experts x m x row_bytes, x: f32 rows of kdim, ids: P i32, out: P x m f32;
// x row of pair p: p when x_per_pair, else p / slots; rows_per_block: a
// multiple of MMID_ROWS; astride: shared bytes per staged activation row.)
template <int FMT, int TT>
DEV void mmid_body(const u8* w, const float* x, const i32* ids, float* out, int m, int kdim, int P,
                   int slots, int x_per_pair, int experts, u64 expert_bytes, u64 row_bytes,
                   int rows_per_block, int astride) {
    extern __shared__ __align__(16) u8 mmid_dyn[];
    __shared__ MmidTile tile;
    __shared__ int warp_cnt[MMID_THREADS / 32];
    __shared__ u32 iq2_grid[FMT == MMID_IQ2_XXS ? 512 : 1];
    const int row_lo = blockIdx.x * rows_per_block;
    const int row_hi = min(m, row_lo + rows_per_block);
    if (FMT == MMID_IQ2_XXS) mmid_iq2xxs_grid(iq2_grid);
    if (P <= MMID_WARP_ROUTE) {
        if (threadIdx.x < 32) mmid_route_warp<TT>(ids, P, experts, blockIdx.y, &tile);
    } else {
        mmid_route_block<TT>(ids, P, experts, blockIdx.y, &tile, (int*)(mmid_dyn + TT * astride),
                             warp_cnt);
    }
    __syncthreads();
    if (blockIdx.y == 0) mmid_nan_invalid(ids, P, experts, out, m, row_lo, row_hi);
    const int e = tile.expert;
    if (e < 0) return;
    const u8* we = w + (size_t)e * expert_bytes;
    {
        // Start the first passes' weight rows towards L2 while the
        // activations are quantized (decode blocks have one or two passes).
        const u8* pf = we + (size_t)row_lo * row_bytes;
        const size_t bytes = (size_t)(min(row_hi, row_lo + 4 * MMID_ROWS) - row_lo) * row_bytes;
        for (size_t o = (size_t)threadIdx.x * 128; o < bytes; o += (size_t)blockDim.x * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(pf + o));
    }
    const int count = tile.count;
    int pairs[TT], xrow[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) {
        pairs[t] = tile.pair[min(t, count - 1)];
        xrow[t] = x_per_pair ? pairs[t] : pairs[t] / slots;
    }
    typedef MmidAct<FMT> A;
    if (A::KIND == 1) mmid_stage_q8<0, TT, FMT == MMID_MXFP4>(x, xrow, kdim, mmid_dyn, astride);
    if (A::KIND == 2) mmid_stage_q8<1, TT, 0>(x, xrow, kdim, mmid_dyn, astride);
    if (A::KIND == 3) mmid_stage_q8k<TT>(x, xrow, kdim, mmid_dyn, astride);
    __syncthreads();
    // Per-slot orders.
    int order[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) order[t] = mmid_q4k_order(m, tile.ne, tile.first_rank + t);
    const bool q6_tiled = tile.ne >= 8;
    const int fstep = FMT == MMID_BF16 ? 32 : 16;
    const bool tiny = tile.ne >= 2 && kdim % fstep == 0 && m % 4 == 0;
    const float* xr[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) xr[t] = x + (size_t)xrow[t] * kdim;
    const int lane8 = threadIdx.x & 7;
    for (int r0 = row_lo; r0 < row_hi; r0 += MMID_ROWS) {
        const int row = r0 + (threadIdx.x >> 3);
        const u8* wrow = we + (size_t)min(row, row_hi - 1) * row_bytes;
        float res[TT];
        if (FMT == MMID_F32) mmid_row_float<0, TT>(wrow, xr, kdim, tiny, res);
        if (FMT == MMID_F16) mmid_row_float<1, TT>(wrow, xr, kdim, tiny, res);
        if (FMT == MMID_BF16) mmid_row_float<2, TT>(wrow, xr, kdim, tiny, res);
        if (FMT == MMID_Q4_0) mmid_row_b32<FmtQ4_0, TT>(wrow, mmid_dyn, astride, kdim / 32, res);
        if (FMT == MMID_Q4_1) mmid_row_b32<FmtQ4_1, TT>(wrow, mmid_dyn, astride, kdim / 32, res);
        if (FMT == MMID_Q5_0) mmid_row_b32<FmtQ5_0, TT>(wrow, mmid_dyn, astride, kdim / 32, res);
        if (FMT == MMID_Q5_1) mmid_row_b32<MmidFmtQ5_1, TT>(wrow, mmid_dyn, astride, kdim / 32, res);
        if (FMT == MMID_Q8_0) mmid_row_b32<FmtQ8_0, TT>(wrow, mmid_dyn, astride, kdim / 32, res);
        if (FMT == MMID_MXFP4) mmid_row_mxfp4<TT>(wrow, mmid_dyn, astride, kdim / 32, res);
        if (FMT == MMID_Q4_K) mmid_row_q4k<TT>(wrow, mmid_dyn, astride, kdim / 256, order, res);
        if (FMT == MMID_Q6_K) mmid_row_q6k<TT>(wrow, mmid_dyn, astride, kdim / 256, q6_tiled, res);
        if (FMT == MMID_Q2_K) mmid_row_q2k<TT>(wrow, mmid_dyn, astride, kdim / 256, res);
        if (FMT == MMID_IQ2_XXS) mmid_row_iq2xxs<TT>(wrow, mmid_dyn, astride, kdim / 256, iq2_grid, res);
        if (lane8 == 0 && row < row_hi) {
#pragma unroll
            for (int t = 0; t < TT; t++)
                if (t < count) out[(size_t)pairs[t] * m + row] = res[t];
        }
    }
}

#define MMID_ENTRY(NAME, FMT, TT)                                                                 \
    extern "C" __global__ void __launch_bounds__(MMID_THREADS, 2)                                 \
        NAME(const u8* w, const float* x, const i32* ids, float* out, int m, int kdim, int P,     \
             int slots, int x_per_pair, int experts, u64 expert_bytes, u64 row_bytes,            \
             int rows_per_block, int astride) {                                                  \
        pdl_sync();                                                                               \
        mmid_body<FMT, TT>(w, x, ids, out, m, kdim, P, slots, x_per_pair, experts, expert_bytes, \
                           row_bytes, rows_per_block, astride);                                   \
    }
#define MMID_ENTRIES(NAME, FMT)          \
    MMID_ENTRY(mmid_##NAME##_t1, FMT, 1) \
    MMID_ENTRY(mmid_##NAME##_t4, FMT, 4)
MMID_ENTRIES(f32, MMID_F32)
MMID_ENTRIES(f16, MMID_F16)
MMID_ENTRIES(bf16, MMID_BF16)
MMID_ENTRIES(q4_0, MMID_Q4_0)
MMID_ENTRIES(q4_1, MMID_Q4_1)
MMID_ENTRIES(q5_0, MMID_Q5_0)
MMID_ENTRIES(q5_1, MMID_Q5_1)
MMID_ENTRIES(q8_0, MMID_Q8_0)
MMID_ENTRIES(q4_k, MMID_Q4_K)
MMID_ENTRIES(q6_k, MMID_Q6_K)
MMID_ENTRIES(q2_k, MMID_Q2_K)
MMID_ENTRIES(iq2_xxs, MMID_IQ2_XXS)
MMID_ENTRIES(mxfp4, MMID_MXFP4)

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
