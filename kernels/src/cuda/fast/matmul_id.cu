// Fast indexed expert products for prefill (numerics `fast`): the (token,
// slot) pairs of a MatMulId grouped by expert on the device, then one
// tensor-core tile product (fast/matmul.cu's mq_body) per expert, tile of
// up to BN of its pairs, and BM weight rows.
//
// mqid_route (one block) counts the pairs of each expert, lays every
// expert's pairs out one after another, and writes the tile table that the
// product's blockIdx.y indexes: (expert, first position, pairs). The order
// of the pairs inside an expert is free (atomics): each output depends on
// its own pair's activation row and weight row only, so the bits do not.
// Pairs whose id lies outside 0..experts get NaN rows, as with the exact
// kernels; no tile takes them.
//
// The table (ints, in the node's scratch after the quantized activations):
// [0] the number of tiles, [4..] tile_e[T], tile_f[T], tile_n[T], then the
// activation row xmap[P] and output row omap[P] of each laid-out position.

#define MQID_ROUTE_THREADS 1024

extern "C" __global__ void __launch_bounds__(MQID_ROUTE_THREADS)
    mqid_route(const int* ids, float* out, int* table, int pairs, int slots, int x_per_pair,
               int experts, int m, int bn, int max_tiles) {
    extern __shared__ int mqid_sm[];  // count, fill, first: [experts] each
    int* count = mqid_sm;
    int* fill = count + experts;
    int* first = fill + experts;
    int* tile_e = table + 4;
    int* tile_f = tile_e + max_tiles;
    int* tile_n = tile_f + max_tiles;
    int* xmap = tile_n + max_tiles;
    int* omap = xmap + pairs;
    const int tid = threadIdx.x;
    pdl_sync();
    for (int e = tid; e < experts; e += blockDim.x) {
        count[e] = 0;
        fill[e] = 0;
    }
    __syncthreads();
    for (int p = tid; p < pairs; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < experts) {
            atomicAdd(&count[e], 1);
        } else {
            for (int r = 0; r < m; r++) out[(size_t)p * m + r] = __int_as_float(0x7fc00000);
        }
    }
    __syncthreads();
    if (tid < 32) {
        // Lane l takes a run of experts; two warp scans give each run its
        // first position and first tile.
        const int per = (experts + 31) / 32;
        const int e0 = min(experts, tid * per), e1 = min(experts, e0 + per);
        int pos = 0, tiles = 0;
        for (int e = e0; e < e1; e++) {
            pos += count[e];
            tiles += (count[e] + bn - 1) / bn;
        }
        int ipos = pos, itiles = tiles;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int a = __shfl_up_sync(FULL_MASK, ipos, o);
            const int b = __shfl_up_sync(FULL_MASK, itiles, o);
            if (tid >= o) {
                ipos += a;
                itiles += b;
            }
        }
        pos = ipos - pos;
        tiles = itiles - tiles;
        for (int e = e0; e < e1; e++) {
            const int c = count[e];
            first[e] = pos;
            for (int t = 0; t * bn < c; t++, tiles++) {
                tile_e[tiles] = e;
                tile_f[tiles] = pos + t * bn;
                tile_n[tiles] = min(bn, c - t * bn);
            }
            pos += c;
        }
        if (tid == 31) table[0] = itiles;
    }
    __syncthreads();
    for (int p = tid; p < pairs; p += blockDim.x) {
        const int e = ids[p];
        if (e < 0 || e >= experts) continue;
        const int at = first[e] + atomicAdd(&fill[e], 1);
        xmap[at] = x_per_pair ? p : p / slots;
        omap[at] = p;
    }
}

#define MQID_ENTRY(NAME, W, A, WM, NT)                                                           \
    extern "C" __global__ void __launch_bounds__(MQ_THREADS)                                     \
        mqid_##NAME##_w##WM##n##NT(const u8* w, const u8* x, float* out, const int* table,       \
                                   int m, int k, int max_tiles, int pairs,                       \
                                   unsigned long long expert_bytes) {                            \
        pdl_sync();                                                                              \
        const int t = blockIdx.y;                                                                \
        if (t >= table[0]) return;                                                               \
        const int* tile_e = table + 4;                                                           \
        const int* tile_f = tile_e + max_tiles;                                                  \
        const int* tile_n = tile_f + max_tiles;                                                  \
        const int* xmap = tile_n + max_tiles;                                                    \
        const int f = tile_f[t];                                                                 \
        mq_body<W, A, WM, NT>(w + (size_t)tile_e[t] * expert_bytes, x, out, m, tile_n[t], k, 0,  \
                              blockIdx.x * 32 * WM, 0, xmap + f, xmap + pairs + f);              \
    }
#define MQID_TILES(NAME, W, A)   \
    MQID_ENTRY(NAME, W, A, 2, 4) \
    MQID_ENTRY(NAME, W, A, 2, 2)
MQID_TILES(q4_0, MqQ4_0, MqAQ8_0)
MQID_TILES(q4_1, MqQ4_1, MqAQ8_1)
MQID_TILES(q5_0, MqQ5_0, MqAQ8_0)
MQID_TILES(q8_0, MqQ8_0, MqAQ8_0)
MQID_TILES(q4_k, MqQ4_K, MqAQ8_K)
MQID_TILES(q6_k, MqQ6_K, MqAQ8_K)
MQID_TILES(q2_k, MqQ2_K, MqAQ8_K2)
MQID_TILES(iq2_xxs, MqIQ2_XXS, MqAQ8_K)
MQID_TILES(mxfp4, MqMXFP4, MqAQ8_0)
