// Matrix products `out[t][r] = w_row(r) . act_row(t)` in the order of weft's
// CPU kernels (ggml's x86 order, `kernels/src/cpu/quant/scalar.rs`):
//
// - 32-element formats (Q4_0, Q4_1, Q5_0, Q8_0) x Q8_0/Q8_1 activations and
//   the K formats (Q4_K, Q6_K) x Q8_K: eight f32 lanes per (row, token); lane
//   k gets, per block, the exact integer sum of elements 4k..4k+3 of each
//   32-element chunk (one `__dp4a`), accumulated with a fused multiply-add
//   by the block's combined scale, blocks in order; then `hsum_float_8`.
//   Eight consecutive threads hold the eight lanes of one (row, token set),
//   so a weight row is read by its eight threads side by side.
// - F32, F16, BF16: ggml's `vec_dot` (four 16-lane accumulators per 64
//   elements, a fixed fold and reduction, a scalar tail) or, for two or more
//   tokens, tinyBLAS's order (one 16-lane accumulator). Sixteen threads per
//   row hold the sixteen lanes.
//
// Each thread handles TT tokens at once (one weight load feeds TT dot
// products). Rows past the matrix still run (the shuffles need every lane)
// and skip the store.

// ---- 32-element formats --------------------------------------------------

struct FmtQ4_0 {
    enum { BYTES = 18, HAS_MIN = 0 };
    static __device__ __forceinline__ u32 codes(const u8* b, int k) {
        u32 w = ld_u32_a2(b + 2 + 4 * (k & 3));
        return __vsub4((w >> (4 * (k >> 2))) & 0x0f0f0f0fu, 0x08080808u);
    }
};
struct FmtQ4_1 {
    enum { BYTES = 20, HAS_MIN = 1 };
    static __device__ __forceinline__ u32 codes(const u8* b, int k) {
        u32 w = ld_u32_a4(b + 4 + 4 * (k & 3));
        return (w >> (4 * (k >> 2))) & 0x0f0f0f0fu;
    }
};
struct FmtQ5_0 {
    enum { BYTES = 22, HAS_MIN = 0 };
    static __device__ __forceinline__ u32 codes(const u8* b, int k) {
        u32 w = ld_u32_a2(b + 6 + 4 * (k & 3));
        u32 nib = (w >> (4 * (k >> 2))) & 0x0f0f0f0fu;
        u32 hb = (ld_u32_a2(b + 2) >> (4 * k)) & 0xfu;
        u32 high = ((hb & 1u) << 4) | ((hb & 2u) << 11) | ((hb & 4u) << 18) | ((hb & 8u) << 25);
        return __vsub4(nib | high, 0x10101010u);
    }
};
struct FmtQ8_0 {
    enum { BYTES = 34, HAS_MIN = 0 };
    static __device__ __forceinline__ u32 codes(const u8* b, int k) { return ld_u32_a2(b + 2 + 4 * k); }
};

// The exact integer sum of four byte products as an f32, without the
// quarter-rate int-to-float conversion: the dp4a starts from the bits of
// 1.5 * 2^23, so while |sum| < 2^22 (four products of 32-element formats
// stay under 2^16) its result's bits are the float 1.5 * 2^23 + sum.
DEV float dp4a_f32(u32 a, u32 b) {
    return __fsub_rn(__int_as_float(__dp4a((int)a, (int)b, 0x4B400000)), 12582912.0f);
}

// Activation blocks: Q8_0 (34 bytes: d, qs) or Q8_1 (36 bytes: d, s, qs).
template <int HAS_MIN>
struct Act {
    enum { BYTES = HAS_MIN ? 36 : 34 };
    static __device__ __forceinline__ u32 quants(const u8* a, int k) {
        return HAS_MIN ? ld_u32_a4(a + 4 + 4 * k) : ld_u32_a2(a + 2 + 4 * k);
    }
};

// A block's f16 scale, and with a min (HAS_MIN) the min in the high half,
// as one word: Q4_1's d and m (20-byte blocks) and Q8_1's d and s (36-byte
// blocks) are 4-byte aligned, so one load brings both.
template <int HAS_MIN>
DEV u32 scale_word(const u8* blk) {
    return HAS_MIN ? ld_u32_a4(blk) : (u32)ld_u16(blk);
}

// One block of one row of a decode matvec, in the CPU's order: lane k's
// integer sum of its four byte products, scaled into `acc`, and the min
// times the activation block's sum into `summs` (formats with a min).
template <class F>
DEV void mv_block_step(u32 codes, u32 wdm, u32 aq, u32 ads, float& acc, float& summs) {
    const float isum = dp4a_f32(codes, aq);
    acc = __fmaf_rn(__fmul_rn(h2f((u16)wdm), h2f((u16)ads)), isum, acc);
    if (F::HAS_MIN) summs = __fmaf_rn(h2f((u16)(wdm >> 16)), h2f((u16)(ads >> 16)), summs);
}

// A row's product from lane k's `acc` and `summs` (ggml's hsum_float_8,
// then the mins' sum), valid in the first lane of each group of eight.
template <class F>
DEV float mv_row_sum(float acc, float summs) {
    const float s = hsum8_lanes(acc);
    return F::HAS_MIN ? s + summs : s;
}

// Copies `bytes` (a multiple of 2) from global to shared memory with the
// whole block, in batches of eight independent loads per thread (4-byte
// words when both ends and the size allow).
template <class T>
DEV void stage_words(T* d, const T* s, int n) {
    const int nt = blockDim.x;
    for (int i = threadIdx.x; i < n; i += 8 * nt) {
        T v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (i + k * nt < n) v[k] = s[i + k * nt];
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (i + k * nt < n) d[i + k * nt] = v[k];
    }
}
DEV void stage_bytes(u8* dst, const u8* src, int bytes) {
    if ((((size_t)dst | (size_t)src | (size_t)bytes) & 3) == 0)
        stage_words((u32*)dst, (const u32*)src, bytes / 4);
    else
        stage_words((u16*)dst, (const u16*)src, bytes / 2);
}

// Starts copying `bytes` (even) from global to shared memory with the
// whole block: 16-byte cp.async pieces (both ends 16-byte aligned; one
// commit group, not waited for), the tail under 16 bytes in 2-byte words.
DEV void stage_async(u8* dst, const u8* src, int bytes) {
    const int n16 = bytes >> 4;
    for (int c = threadIdx.x; c < n16; c += blockDim.x) cp_async16(dst + 16 * c, src + 16 * c);
    for (int c = 16 * n16 + 2 * threadIdx.x; c < bytes; c += 2 * blockDim.x)
        *(u16*)(dst + c) = ld_u16(src + c);
    cp_async_commit();
}

// Decode (one token): eight lanes per weight row, blockDim / 8 rows per
// block. The activation row is staged in shared memory; each thread issues
// the loads of up to MV_CHUNK blocks of its row before using any (24, or 48
// for long rows: their second round of loads would cost a memory latency).
// The products of this thread's weight row (`*row_out`) of NW matrices
// (w0, and w1 when NW is 2) with the staged activations, into s[0..NW);
// valid in the first lane of each group of eight. Every matrix's loads are
// issued before any is used.
//
// `blk` is the block's index among the matrix's blocks (blockIdx.x, or
// less in a grouped launch). The caller has not waited on the kernels
// before it (pdl_sync): this does,
// after the first round of weight loads when `pre` says no kernel of the
// command buffer writes the weights (they are then in flight while the
// previous kernel still runs), before any load otherwise.
template <class F, int MV_CHUNK, int NW>
DEV void mv_rows32(const u8* w0, const u8* w1, const u8* act, int m, int nb, int* row_out,
                   float* s, int pre, int blk) {
    extern __shared__ u8 mm_dyn[];
    typedef Act<F::HAS_MIN> A;
    const int k = threadIdx.x & 7;
    const int row = blk * (blockDim.x / 8) + (threadIdx.x >> 3);
    const int r = min(row, m - 1);
    const u8* wrow[2] = {w0 + (size_t)r * nb * F::BYTES, NW > 1 ? w1 + (size_t)r * nb * F::BYTES : 0};
    // Codes, and the block's f16 scale (and min, in the high half) as one
    // word: with a min (Q4_1: 20-byte blocks) both are one 4-byte load.
    u32 wq[NW][MV_CHUNK], wdm[NW][MV_CHUNK];
    auto load = [&](int b0) {
#pragma unroll
        for (int i = 0; i < NW; i++) {
#pragma unroll
            for (int j = 0; j < MV_CHUNK; j++) {
                const u8* wb = wrow[i] + (size_t)min(b0 + j, nb - 1) * F::BYTES;
                wq[i][j] = F::codes(wb, k);
                wdm[i][j] = scale_word<F::HAS_MIN>(wb);
            }
        }
    };
    if (!pre) pdl_sync();
    load(0);
    if (pre) pdl_sync();
    stage_bytes(mm_dyn, act, nb * A::BYTES);
    __syncthreads();
    float acc[NW], summs[NW];
#pragma unroll
    for (int i = 0; i < NW; i++) acc[i] = summs[i] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += MV_CHUNK) {
        if (b0 > 0) load(b0);
#pragma unroll
        for (int j = 0; j < MV_CHUNK; j++) {
            if (b0 + j < nb) {
                const u8* ab = mm_dyn + (b0 + j) * A::BYTES;
                const u32 aq = A::quants(ab, k), ads = scale_word<F::HAS_MIN>(ab);
#pragma unroll
                for (int i = 0; i < NW; i++)
                    mv_block_step<F>(wq[i][j], wdm[i][j], aq, ads, acc[i], summs[i]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NW; i++) s[i] = mv_row_sum<F>(acc[i], summs[i]);
    *row_out = row;
}

// mv_rows32's products with the weights read from shared memory: block
// `blk`'s rows (blockDim.x / 8 of them) of each of NW matrices (w0, and w1 when NW is 2) are one
// contiguous range per matrix, copied with 16-byte cp.async (before the
// wait when `pre`: the weights are constant), then the activation row is
// staged after them, and each lane computes what mv_rows32 computes, in its
// order. A warp's global loads then move whole lines, where mv_rows32's
// touch four rows' lines for 16 or 32 useful bytes each (for Q8_0's 34-byte
// blocks, in 2-byte pieces). Eight lanes per row, 8 or 32 rows per block;
// each matrix is 16-byte aligned (8 rows of 32-element blocks are a
// multiple of 16 bytes). s[i] is valid in the first lane of each group of
// eight.
template <class F, int NW>
DEV void mv_rows32_staged(const u8* w0, const u8* w1, const u8* act, int m, int nb, int* row_out,
                          float* s, int pre, int blk) {
    extern __shared__ __align__(16) u8 mm_dyn[];
    typedef Act<F::HAS_MIN> A;
    const int ROWS = blockDim.x >> 3;
    const int row_bytes = nb * F::BYTES;
    const int r0 = blk * ROWS, rows = min(ROWS, m - r0);
    u8* as = mm_dyn + NW * ROWS * row_bytes;
    const int bytes = rows * row_bytes, n16 = bytes >> 4;
    // The last block's rows may end inside a 16-byte piece.
    auto copy = [&]() {
#pragma unroll
        for (int i = 0; i < NW; i++)
            stage_async(mm_dyn + i * ROWS * row_bytes, (i ? w1 : w0) + (size_t)r0 * row_bytes, bytes);
    };
    if (pre) copy();
    pdl_sync();
    if (!pre) copy();
    stage_bytes(as, act, nb * A::BYTES);
    cp_async_wait_all();
    __syncthreads();
    const int k = threadIdx.x & 7, lr = threadIdx.x >> 3;
    const int wr = min(lr, rows - 1) * row_bytes;
    float acc[NW], summs[NW];
#pragma unroll
    for (int i = 0; i < NW; i++) acc[i] = summs[i] = 0.0f;
#pragma unroll 6
    for (int b = 0; b < nb; b++) {
        const u8* ab = as + b * A::BYTES;
        const u32 aq = A::quants(ab, k), ads = scale_word<F::HAS_MIN>(ab);
#pragma unroll
        for (int i = 0; i < NW; i++) {
            const u8* wb = mm_dyn + i * ROWS * row_bytes + wr + b * F::BYTES;
            mv_block_step<F>(F::codes(wb, k), scale_word<F::HAS_MIN>(wb), aq, ads, acc[i],
                             summs[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < NW; i++) s[i] = mv_row_sum<F>(acc[i], summs[i]);
    *row_out = r0 + lr;
}

// One matrix's product for this thread's row: MV_CHUNK > 0 is mv_rows32's
// round of block loads, 0 reads the rows from shared memory
// (mv_rows32_staged).
template <class F, int MV_CHUNK>
DEV float mv_row32(const u8* w, const u8* act, int m, int nb, int* row_out, int pre, int blk) {
    float s;
    if constexpr (MV_CHUNK == 0) mv_rows32_staged<F, 1>(w, 0, act, m, nb, row_out, &s, pre, blk);
    else mv_rows32<F, MV_CHUNK, 1>(w, 0, act, m, nb, row_out, &s, pre, blk);
    return s;
}

template <class F, int MV_CHUNK>
DEV void mv_block32(const u8* w, const u8* act, float* out, int m, int nb, int pre) {
    int row;
    const float s = mv_row32<F, MV_CHUNK>(w, act, m, nb, &row, pre, blockIdx.x);
    if ((threadIdx.x & 7) == 0 && row < m) out[row] = s;
}

// Prefill: lane k of eight, two weight rows and eight tokens per thread
// (blockDim / 4 rows x 8 tokens per block); the eight activation rows are staged in
// shared memory. `summs` of token t is chained by lane t of the group.
template <class F>
DEV void mm_block32_tiled(const u8* w, const u8* act, float* out, int m, int n, int nb) {
    extern __shared__ u8 mm_dyn[];
    typedef Act<F::HAS_MIN> A;
    const int k = threadIdx.x & 7;
    const int group = threadIdx.x >> 3;
    const int row0 = blockIdx.x * (blockDim.x / 4) + 2 * group;
    const int t0 = blockIdx.y * 8;
    const int rows[2] = {min(row0, m - 1), min(row0 + 1, m - 1)};
    const size_t arow = (size_t)nb * A::BYTES;
    if (t0 + 8 <= n) {
        stage_bytes(mm_dyn, act + (size_t)t0 * arow, (int)(8 * arow));  // contiguous rows
    } else {
        for (int t = 0; t < 8; t++)
            stage_bytes(mm_dyn + t * arow, act + (size_t)min(t0 + t, n - 1) * arow, (int)arow);
    }
    __syncthreads();
    float acc[2][8], summs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int q = 0; q < 2; q++)
#pragma unroll
        for (int t = 0; t < 8; t++) acc[q][t] = 0.0f;
    const u8* wr[2] = {w + (size_t)rows[0] * nb * F::BYTES, w + (size_t)rows[1] * nb * F::BYTES};
    // Weights of four blocks per round; the next round's loads are issued
    // before this round's products.
    u32 wq[2][4][2];
    float wd[2][4][2], wm[2][4][2];
    auto load = [&](int b0, int buf) {
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const u8* wb = wr[q] + (size_t)min(b0 + j, nb - 1) * F::BYTES;
                wq[buf][j][q] = F::codes(wb, k);
                wd[buf][j][q] = ld_f16(wb);
                wm[buf][j][q] = F::HAS_MIN ? ld_f16(wb + 2) : 0.0f;
            }
    };
    auto round = [&](int b0, int buf) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int b = b0 + j;
            if (b >= nb) break;
#pragma unroll
            for (int t = 0; t < 8; t++) {
                const u8* ab = mm_dyn + t * arow + (size_t)b * A::BYTES;
                const u32 xq = A::quants(ab, k);
                const float xd = ld_f16(ab);
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    const float isum = dp4a_f32(wq[buf][j][q], xq);
                    acc[q][t] = __fmaf_rn(__fmul_rn(wd[buf][j][q], xd), isum, acc[q][t]);
                }
            }
            if (F::HAS_MIN) {
                const float xs = ld_f16(mm_dyn + k * arow + (size_t)b * A::BYTES + 2);
#pragma unroll
                for (int q = 0; q < 2; q++) summs[q] = __fmaf_rn(wm[buf][j][q], xs, summs[q]);
            }
        }
    };
    load(0, 0);
    for (int b0 = 0; b0 < nb; b0 += 8) {
        if (b0 + 4 < nb) load(b0 + 4, 1);
        round(b0, 0);
        if (b0 + 4 >= nb) break;
        if (b0 + 8 < nb) load(b0 + 8, 0);
        round(b0 + 4, 1);
    }
    const int lane0 = (threadIdx.x & 31) & ~7;
#pragma unroll
    for (int q = 0; q < 2; q++) {
#pragma unroll
        for (int t = 0; t < 8; t++) {
            float s = hsum8_lanes(acc[q][t]);
            if (F::HAS_MIN) s = s + __shfl_sync(FULL_MASK, summs[q], lane0 + t);
            const int row = row0 + q;
            if (k == 0 && row < m && t0 + t < n) out[(size_t)(t0 + t) * m + row] = s;
        }
    }
}

// ---- K formats x Q8_K ------------------------------------------------------------

// Q4_K takes the float order weft's CPU kernels take for (weight rows m,
// tokens n, token t) (`DotOrder::of`, kernels/src/cpu/quant/order.rs):
// 0 vec_dot (eight lanes), 1 repacked gemv and 2 repacked gemm (whole
// integer sums per super-block or per 64-element pair, two accumulators),
// 3 tiled (one fused step per super-block).
DEV int q4k_order(int m, int n, int t) {
    if (m % 8 == 0) return t < n - n % 4 ? 2 : 1;
    return n >= 8 ? 3 : 0;
}

// The products of weight row `wrow` (this thread's row: eight lanes per
// row) with activation rows a[0..TT) into res[0..TT), valid in lane 0 of
// the row's eight.
template <int TT>
DEV void q4k_row_dot(const u8* wrow, const u8* const* a, const int* order, int nb, float* res) {
    const int k = threadIdx.x & 7;
    float acc[TT], accm[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = accm[t] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const u8* x = wrow + (size_t)b * 144;
        int sc[8], mn[8];
#pragma unroll
        for (int j = 0; j < 8; j++) q4k_scales_mins(x + 4, j, &sc[j], &mn[j]);
        u32 lo[4], hi[4];
#pragma unroll
        for (int cp = 0; cp < 4; cp++) {
            const u32 q = ld_u32_a4(x + 16 + 32 * cp + 4 * k);
            lo[cp] = q & 0x0f0f0f0fu;
            hi[cp] = (q >> 4) & 0x0f0f0f0fu;
        }
        const float wd = ld_f16(x), wdmin = ld_f16(x + 2);
        const int km = k & 3;
#pragma unroll
        for (int t = 0; t < TT; t++) {
            const u8* y = a[t] + (size_t)b * Q8K_BYTES;
            // This lane's share of each pair's integer sum (elements 4k..4k+3
            // of every chunk).
            int pair[4];
#pragma unroll
            for (int cp = 0; cp < 4; cp++)
                pair[cp] = sc[2 * cp] * __dp4a((int)lo[cp], (int)ld_u32_a4(y + 4 + 64 * cp + 4 * k), 0) +
                           sc[2 * cp + 1] * __dp4a((int)hi[cp], (int)ld_u32_a4(y + 36 + 64 * cp + 4 * k), 0);
            const float yd = __int_as_float((int)ld_u32_a4(y));
            const i16* bs = (const i16*)(y + 260);
            auto imin = [&](int p) {
                const int b0 = (int)bs[4 * p] + (int)bs[4 * p + 1];
                const int b1 = (int)bs[4 * p + 2] + (int)bs[4 * p + 3];
                return mn[2 * p] * b0 + mn[2 * p + 1] * b1;
            };
            if (order[t] == 0) {
                const int sumi = (pair[0] + pair[1]) + (pair[2] + pair[3]);
                const float d = __fmul_rn(yd, wd);
                const float dmin = __fmul_rn(-yd, wdmin);
                acc[t] = __fmaf_rn(d, (float)sumi, acc[t]);
                accm[t] = __fmaf_rn(dmin, (float)imin(km), accm[t]);
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
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float r;
        if (order[t] == 0) {
            const float s = hsum8_lanes(acc[t]);
            // lanes 0..3 hold acc_m[0..3]: (m0 + m2) + (m1 + m3)
            const float u = accm[t] + __shfl_down_sync(FULL_MASK, accm[t], 2, 8);
            const float mm = u + __shfl_down_sync(FULL_MASK, u, 1, 8);
            r = s + mm;
        } else {
            r = order[t] == 3 ? acc[t] : acc[t] - accm[t];
        }
        res[t] = r;
    }
}

template <int TT>
DEV void mm_q4k(const u8* w, const u8* act, float* out, int m, int n, int nb) {
    const int row = blockIdx.x * (blockDim.x / 8) + (threadIdx.x >> 3);
    const int t0 = blockIdx.y * TT;
    const u8* wrow = w + (size_t)min(row, m - 1) * nb * 144;
    const u8* a[TT];
    int order[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) {
        a[t] = act + (size_t)min(t0 + t, n - 1) * nb * Q8K_BYTES;
        order[t] = q4k_order(m, n, min(t0 + t, n - 1));
    }
    float res[TT];
    q4k_row_dot<TT>(wrow, a, order, nb, res);
#pragma unroll
    for (int t = 0; t < TT; t++)
        if ((threadIdx.x & 7) == 0 && row < m && t0 + t < n) out[(size_t)(t0 + t) * m + row] = res[t];
}

// Q6_K: vec_dot under 8 tokens (eight lanes; lane k sums scale * code * y
// over elements 4k..4k+3 of every chunk with the unsigned 6-bit codes, and
// takes the codes' offset of 32 through the activation sums of elements
// 32k..32k+31), the tiled order from 8 tokens (the super-block's exact
// integer sum, times d_w, then one fused step by d_a).
template <int TT>
DEV void q6k_row_dot(const u8* wrow, const u8* const* a, bool tiled, int nb, float* res) {
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
            const u8* y = a[t] + (size_t)b * Q8K_BYTES;
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

template <int TT>
DEV void mm_q6k(const u8* w, const u8* act, float* out, int m, int n, int nb) {
    const int row = blockIdx.x * (blockDim.x / 8) + (threadIdx.x >> 3);
    const int t0 = blockIdx.y * TT;
    const u8* wrow = w + (size_t)min(row, m - 1) * nb * 210;
    const u8* a[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) a[t] = act + (size_t)min(t0 + t, n - 1) * nb * Q8K_BYTES;
    float res[TT];
    q6k_row_dot<TT>(wrow, a, n >= 8, nb, res);
#pragma unroll
    for (int t = 0; t < TT; t++)
        if ((threadIdx.x & 7) == 0 && row < m && t0 + t < n) out[(size_t)(t0 + t) * m + row] = res[t];
}

// A decode matvec of a K format with the block's weight rows (blockDim / 8
// of them) staged in shared memory by 16-byte cp.async, before the wait
// when `pre` (the weights are constant), and the activation row after
// them; each thread then computes what mm_q4k / mm_q6k compute for one
// token, in their order. Unstaged, a lane walks its row's super-blocks one
// round of dependent loads at a time (a memory latency per super-block);
// staged, all of the block's loads are in flight at once and move whole
// lines. The matrix is 16-byte aligned; 8 rows of either format are a
// multiple of 16 bytes.
template <int Q6>
DEV void mm_kquant_staged(const u8* w, const u8* act, float* out, int m, int nb, int pre) {
    extern __shared__ __align__(16) u8 mm_dyn[];
    const int ROWS = blockDim.x >> 3;
    const int row_bytes = nb * (Q6 ? 210 : 144);
    const int r0 = blockIdx.x * ROWS, rows = min(ROWS, m - r0);
    u8* as = mm_dyn + ROWS * row_bytes;
    const u8* src = w + (size_t)r0 * row_bytes;
    if (pre) stage_async(mm_dyn, src, rows * row_bytes);
    pdl_sync();
    if (!pre) stage_async(mm_dyn, src, rows * row_bytes);
    stage_bytes(as, act, nb * Q8K_BYTES);
    cp_async_wait_all();
    __syncthreads();
    const int lr = threadIdx.x >> 3;
    const u8* wrow = mm_dyn + min(lr, rows - 1) * row_bytes;
    const u8* a[1] = {as};
    float res[1];
    if (Q6) {
        q6k_row_dot<1>(wrow, a, false, nb, res);
    } else {
        const int order[1] = {q4k_order(m, 1, 0)};
        q4k_row_dot<1>(wrow, a, order, nb, res);
    }
    if ((threadIdx.x & 7) == 0 && r0 + lr < m) out[r0 + lr] = res[0];
}

// ---- float formats ------------------------------------------------------------
// W = 0: f32, 1: f16, 2: bf16 (activations of the same type).

template <int W>
DEV float fval(const u8* p, int i) {
    if (W == 0) return ((const float*)p)[i];
    if (W == 1) return h2f(((const u16*)p)[i]);
    return bf2f(((const u16*)p)[i]);
}

// Chunks of 64 a lane loads ahead of its products in mm_float_vecdot.
#define MMF_UNROLL 8

// ggml's vec_dot_{f32,f16,bf16} for TT tokens; 16 lanes per row. The body
// covers the first k - k % 64 elements; the tail is added by the first lane:
// f32 with fused multiply-adds, f16 and bf16 in f64.
template <int W, int TT>
DEV void mm_float_vecdot(const u8* w, const u8* act, float* out, int m, int n, int kdim) {
    const int l = threadIdx.x & 15;
    const int row = blockIdx.x * (blockDim.x / 16) + (threadIdx.x >> 4);
    const int t0 = blockIdx.y * TT;
    const int r = min(row, m - 1);
    const int esz = W == 0 ? 4 : 2;
    const u8* wr = w + (size_t)r * kdim * esz;
    const u8* a[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) a[t] = act + (size_t)min(t0 + t, n - 1) * kdim * esz;
    const int body = kdim - kdim % 64;
    float red0[TT], red1[TT];
    if (W != 2) {
        float acc[TT][4];
#pragma unroll
        for (int t = 0; t < TT; t++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[t][j] = 0.0f;
        // U chunks of 64 loaded before their products: a skinny matrix
        // (few rows, long k: DeepSeek-V4's mixers and routers) is bound by
        // the latency of these loads, not by bandwidth. Each accumulator
        // still takes its chunks in order.
        int base = 0;
        for (; base + 64 * MMF_UNROLL <= body; base += 64 * MMF_UNROLL) {
            float xs[MMF_UNROLL][4], ys[TT][MMF_UNROLL][4];
#pragma unroll
            for (int u = 0; u < MMF_UNROLL; u++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int i = base + 64 * u + 16 * j + l;
                    xs[u][j] = fval<W>(wr, i);
#pragma unroll
                    for (int t = 0; t < TT; t++) ys[t][u][j] = fval<W>(a[t], i);
                }
#pragma unroll
            for (int u = 0; u < MMF_UNROLL; u++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int t = 0; t < TT; t++)
                        acc[t][j] = __fmaf_rn(xs[u][j], ys[t][u][j], acc[t][j]);
        }
        for (; base < body; base += 64) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float x = fval<W>(wr, base + 16 * j + l);
#pragma unroll
                for (int t = 0; t < TT; t++)
                    acc[t][j] = __fmaf_rn(x, fval<W>(a[t], base + 16 * j + l), acc[t][j]);
            }
        }
#pragma unroll
        for (int t = 0; t < TT; t++) {
            red0[t] = reduce16_lanes((acc[t][0] + acc[t][2]) + (acc[t][1] + acc[t][3]));
            red1[t] = 0.0f;
        }
    } else {
        float acc[TT][2];
#pragma unroll
        for (int t = 0; t < TT; t++) acc[t][0] = acc[t][1] = 0.0f;
        int base = 0;
        for (; base + 64 * MMF_UNROLL <= body; base += 64 * MMF_UNROLL) {
            float xs[MMF_UNROLL][4], ys[TT][MMF_UNROLL][4];
#pragma unroll
            for (int u = 0; u < MMF_UNROLL; u++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int i = base + 64 * u + 32 * j + 2 * l;
                    xs[u][2 * j] = fval<W>(wr, i + 1);
                    xs[u][2 * j + 1] = fval<W>(wr, i);
#pragma unroll
                    for (int t = 0; t < TT; t++) {
                        ys[t][u][2 * j] = fval<W>(a[t], i + 1);
                        ys[t][u][2 * j + 1] = fval<W>(a[t], i);
                    }
                }
#pragma unroll
            for (int u = 0; u < MMF_UNROLL; u++)
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int t = 0; t < TT; t++) {
                        acc[t][j] = acc[t][j] + xs[u][2 * j] * ys[t][u][2 * j];
                        acc[t][j] = acc[t][j] + xs[u][2 * j + 1] * ys[t][u][2 * j + 1];
                    }
        }
        for (; base < body; base += 64) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int i = base + 32 * j + 2 * l;
                const float x1 = fval<W>(wr, i + 1), x0 = fval<W>(wr, i);
#pragma unroll
                for (int t = 0; t < TT; t++) {
                    acc[t][j] = acc[t][j] + x1 * fval<W>(a[t], i + 1);
                    acc[t][j] = acc[t][j] + x0 * fval<W>(a[t], i);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < TT; t++) {
            red0[t] = reduce16_lanes(acc[t][0]);
            red1[t] = reduce16_lanes(acc[t][1]);
        }
    }
    if (l != 0) return;
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float v;
        if (W == 0) {
            v = red0[t];
            for (int i = body; i < kdim; i++) v = __fmaf_rn(fval<W>(wr, i), fval<W>(a[t], i), v);
        } else if (W == 1) {
            double s = (double)red0[t];
            for (int i = body; i < kdim; i++) s += (double)(fval<W>(wr, i) * fval<W>(a[t], i));
            v = __double2float_rn(s);
        } else {
            double s = 0.0;
            if (body > 0) {
                s += (double)red0[t];
                s += (double)red1[t];
            }
            for (int i = body; i < kdim; i++) s += (double)(fval<W>(wr, i) * fval<W>(a[t], i));
            v = __double2float_rn(s);
        }
        if (row < m && t0 + t < n) out[(size_t)(t0 + t) * m + row] = v;
    }
}

// The one-token form of mm_float_vecdot for f32 and f16 weights: 64
// threads per row, one per accumulator chain (lane l of quarter j of each
// 64-element chunk), each loading MMF_UNROLL64 chunks ahead of its
// products; a lane's four chains meet in shared memory and are reduced as
// ggml does. Same bits, four times the loads in flight per row: a skinny
// matrix (DeepSeek-V4's mixers and routers: 16 to 256 rows of 4096 to
// 16384) is bound by load latency. Four rows per block of 256 threads.
#define MMF_UNROLL64 16
template <int W>
DEV void mm_float_vecdot64(const u8* w, const u8* act, float* out, int m, int n, int kdim) {
    __shared__ float chains[4][4][16];  // [row of the block][j][l]
    const int l = threadIdx.x & 15;
    const int j = (threadIdx.x >> 4) & 3;
    const int rb = threadIdx.x >> 6;
    const int row = blockIdx.x * 4 + rb;
    const int r = min(row, m - 1);
    const int esz = W == 0 ? 4 : 2;
    const u8* wr = w + (size_t)r * kdim * esz;
    const int body = kdim - kdim % 64;
    float acc = 0.0f;
    int base = 0;
    for (; base + 64 * MMF_UNROLL64 <= body; base += 64 * MMF_UNROLL64) {
        float xs[MMF_UNROLL64], ys[MMF_UNROLL64];
#pragma unroll
        for (int u = 0; u < MMF_UNROLL64; u++) {
            const int i = base + 64 * u + 16 * j + l;
            xs[u] = fval<W>(wr, i);
            ys[u] = fval<W>(act, i);
        }
#pragma unroll
        for (int u = 0; u < MMF_UNROLL64; u++) acc = __fmaf_rn(xs[u], ys[u], acc);
    }
    for (; base < body; base += 64) {
        const int i = base + 16 * j + l;
        acc = __fmaf_rn(fval<W>(wr, i), fval<W>(act, i), acc);
    }
    chains[rb][j][l] = acc;
    __syncthreads();
    if (j >= 2) return;  // whole warps leave: j 0 and 1 share one
    float v = reduce16_lanes((chains[rb][0][l] + chains[rb][2][l]) +
                             (chains[rb][1][l] + chains[rb][3][l]));
    if (j != 0 || l != 0) return;
    if (W == 0) {
        for (int i = body; i < kdim; i++) v = __fmaf_rn(fval<W>(wr, i), fval<W>(act, i), v);
    } else {
        double s = (double)v;
        for (int i = body; i < kdim; i++) s += (double)(fval<W>(wr, i) * fval<W>(act, i));
        v = __double2float_rn(s);
    }
    if (row < m) out[row] = v;
}

// tinyBLAS order (n >= 2, k a multiple of 16 (32 for bf16), m a multiple of 4).
template <int W, int TT>
DEV void mm_float_tiny(const u8* w, const u8* act, float* out, int m, int n, int kdim) {
    const int l = threadIdx.x & 15;
    const int row = blockIdx.x * (blockDim.x / 16) + (threadIdx.x >> 4);
    const int t0 = blockIdx.y * TT;
    const int r = min(row, m - 1);
    const int esz = W == 0 ? 4 : 2;
    const u8* wr = w + (size_t)r * kdim * esz;
    const u8* a[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) a[t] = act + (size_t)min(t0 + t, n - 1) * kdim * esz;
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = 0.0f;
    if (W != 2) {
        for (int c = 0; c < kdim; c += 16) {
            const float x = fval<W>(wr, c + l);
#pragma unroll
            for (int t = 0; t < TT; t++) acc[t] = __fmaf_rn(x, fval<W>(a[t], c + l), acc[t]);
        }
    } else {
        for (int c = 0; c < kdim; c += 32) {
            const float x1 = fval<W>(wr, c + 2 * l + 1), x0 = fval<W>(wr, c + 2 * l);
#pragma unroll
            for (int t = 0; t < TT; t++) {
                acc[t] = acc[t] + x1 * fval<W>(a[t], c + 2 * l + 1);
                acc[t] = acc[t] + x0 * fval<W>(a[t], c + 2 * l);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        const float s = reduce16_lanes(acc[t]);
        if (l == 0 && row < m && t0 + t < n) out[(size_t)(t0 + t) * m + row] = s;
    }
}

// ---- entry points ------------------------------------------------------------------
// (w, act, out, m = weight rows, n = tokens, nb = blocks per row or k, pre =
// the weights are constant in this command buffer: see mv_rows32)

#define MM_ENTRY(NAME, BODY)                                                                   \
    extern "C" __global__ void __launch_bounds__(256)                                          \
        NAME(const u8* w, const u8* act, float* out, int m, int n, int kb, int pre) {          \
        pdl_sync();                                                                            \
        BODY(w, act, out, m, n, kb);                                                           \
    }

#define MV_ENTRY(NAME, F)                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                          \
        NAME(const u8* w, const u8* act, float* out, int m, int n, int nb, int pre) {          \
        mv_block32<F, 24>(w, act, out, m, nb, pre);                                            \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                          \
        NAME##_long(const u8* w, const u8* act, float* out, int m, int n, int nb, int pre) {   \
        mv_block32<F, 48>(w, act, out, m, nb, pre);                                            \
    }
MV_ENTRY(mm_q4_0_t1, FmtQ4_0)
MV_ENTRY(mm_q4_1_t1, FmtQ4_1)
MV_ENTRY(mm_q5_0_t1, FmtQ5_0)
MV_ENTRY(mm_q8_0_t1, FmtQ8_0)
extern "C" __global__ void __launch_bounds__(256)
    mm_q8_0_t1_staged(const u8* w, const u8* act, float* out, int m, int n, int nb, int pre) {
    mv_block32<FmtQ8_0, 0>(w, act, out, m, nb, pre);  // staged: a tall Q8_0 matrix
}
MM_ENTRY(mm_q4_0_t8, mm_block32_tiled<FmtQ4_0>)
MM_ENTRY(mm_q4_1_t8, mm_block32_tiled<FmtQ4_1>)
MM_ENTRY(mm_q5_0_t8, mm_block32_tiled<FmtQ5_0>)
MM_ENTRY(mm_q8_0_t8, mm_block32_tiled<FmtQ8_0>)
MM_ENTRY(mm_q4_k_t1, mm_q4k<1>)
MM_ENTRY(mm_q4_k_t4, mm_q4k<4>)
MM_ENTRY(mm_q6_k_t1, mm_q6k<1>)
MM_ENTRY(mm_q6_k_t4, mm_q6k<4>)
extern "C" __global__ void __launch_bounds__(256)
    mm_q4_k_t1_staged(const u8* w, const u8* act, float* out, int m, int n, int nb, int pre) {
    mm_kquant_staged<0>(w, act, out, m, nb, pre);
}
extern "C" __global__ void __launch_bounds__(256)
    mm_q6_k_t1_staged(const u8* w, const u8* act, float* out, int m, int n, int nb, int pre) {
    mm_kquant_staged<1>(w, act, out, m, nb, pre);
}
MM_ENTRY(mm_f32_dot_t1, (mm_float_vecdot<0, 1>))
MM_ENTRY(mm_f32_dot64_t1, mm_float_vecdot64<0>)
MM_ENTRY(mm_f16_dot64_t1, mm_float_vecdot64<1>)
MM_ENTRY(mm_f32_dot_t4, (mm_float_vecdot<0, 4>))
MM_ENTRY(mm_f16_dot_t1, (mm_float_vecdot<1, 1>))
MM_ENTRY(mm_f16_dot_t4, (mm_float_vecdot<1, 4>))
MM_ENTRY(mm_bf16_dot_t1, (mm_float_vecdot<2, 1>))
MM_ENTRY(mm_bf16_dot_t4, (mm_float_vecdot<2, 4>))
MM_ENTRY(mm_f32_tiny_t4, (mm_float_tiny<0, 4>))
MM_ENTRY(mm_f16_tiny_t4, (mm_float_tiny<1, 4>))
MM_ENTRY(mm_bf16_tiny_t4, (mm_float_tiny<2, 4>))
