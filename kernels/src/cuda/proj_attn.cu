// Decode attention with the projections it reads (`qkv+attention+quantize`,
// ops' ProjAttention): a thread block cluster per query head, of six blocks:
// two per matrix (query, key, value), each computing half of its head's rows
// (the key and value rows of the head's kv head) and rotating them; after
// one cluster barrier block 0 runs the one-chunk attention entry's body on
// them. So a decode step's attention needs no level of its own for its
// q/k/v projections.
//
// Same bits as the chain: each row is mv_rows32_staged's product (eight
// lanes per row, blocks in order, hsum_float_8, then the mins), rotated as
// matmul_rows_body rotates it, converted as set_rows converts it; the
// attention is attn_decode_body / attn_chunk_body unchanged.
//
// Where block 0 takes the one-pass body, the rows go straight into its
// shared memory (st.shared::cluster: the query as that body rounds it, the
// fresh cell's key and value rows where it stages them) before the
// barrier, and the cache rows are written after the arrival; otherwise the
// query goes to the node's scratch row and the cache rows are written
// before it. Each block's weight rows are copied into shared memory before
// the wait when they are constant (block 0's beside attention's own copies
// of earlier cells); block 0 computes its rows where the attention body
// waits (ProjPart). The clusters of a kv head's query heads all write that
// head's cache rows (the same bits); each reads only its own cluster's.

// Mirrors `ProjArgs` in proj_attention.rs, field for field. Matrix 0 is the
// query, 1 the key, 2 the value (a null w: not absorbed).
struct ProjArgs {
    const u8* w[3];
    u8* cache[3];
    u64 cache_row[3];  // bytes per cache row
    u32 start[3];      // cache row written (without step scalars)
    u32 ring[3];
    int step_at[3];    // that row's index in the step scalars
    int rope[3];       // rotate this matrix's rows
    const u8* act;     // the activation row (the weights' dot type)
    const i32* positions;
    const float2* table;
    RopeArgs ra;
    float* q;  // the node's scratch: the rotated query row
    int nb;    // 32-element blocks per row
    int pre;   // the weights are constant in this command buffer
    u32 smem;  // where the projections' shared memory starts
};

// Blocks per matrix: each computes rows [part * D / PROJ_PARTS, ...) of
// its head's rows (eight lanes per row).
#define PROJ_PARTS 2

#if __CUDA_ARCH__ >= 900
#define PROJ_CLUSTER __cluster_dims__(1, 1, 3 * PROJ_PARTS)
#else
#define PROJ_CLUSTER
#endif

// `bytes` of weight rows into shared memory (16-byte cp.async when both
// ends allow, else 2-byte copies).
DEV void proj_copy(u8* ws, const u8* src, int bytes) {
    if ((((size_t)src | (size_t)bytes) & 15) == 0) {
        for (int c = threadIdx.x; c < bytes / 16; c += blockDim.x) cp_async16(ws + 16 * c, src + 16 * c);
    } else {
        for (int c = 2 * threadIdx.x; c < bytes; c += 2 * blockDim.x) *(u16*)(ws + c) = ld_u16(src + c);
    }
    cp_async_commit();
}

// After the wait: rows [r0, r0 + rows) of matrix i (its head's rows, from
// `ws`, copied there now unless `copied`), rotated and written: the query
// into the scratch row, keys and values into their caches.
template <class F>
DEV void proj_rows(const ProjArgs& p, const u32* step, u8* ws, const u8* src, int i, int r0,
                   int rows, int D, int h, int kvh, bool copied, bool deliver, u32 fresh, int CH) {
    extern __shared__ __align__(16) u8 att_dyn[];
    typedef Act<F::HAS_MIN> A;
    const int row_bytes = p.nb * F::BYTES, bytes = rows * row_bytes;
    if (!copied) proj_copy(ws, src, bytes);
    u8* as = ws + ((bytes + 15) & ~15);
    stage_bytes(as, p.act, p.nb * A::BYTES);
    const int pos = p.positions ? p.positions[0] : 0;
    cp_async_wait_all();
    __syncthreads();
    const int k = threadIdx.x & 7, r = threadIdx.x >> 3;  // rows * 8 <= blockDim.x
    const bool live = r < rows;  // whole warps (rows: a multiple of 4)
    const int e = r0 + r, row = (i ? kvh : h) * D + e;  // in the head, in the matrix
    // The rotation's angle is loaded before the products, beside them.
    const RopeArgs& ra = p.ra;
    const int j = row % ra.head_dim, half = ra.n_dims / 2;
    const bool rot = live && p.rope[i] && j < ra.n_dims;
    float2 cs = make_float2(0.0f, 0.0f);
    if (rot && k == 0) {
        if (pos >= 0 && (u32)pos < ra.table_positions) cs = p.table[(size_t)pos * half + j / 2];
        else cs = rope_angle_fallback(ra, pos, j / 2);
    }
    float v = 0.0f;
    if (live) {
        float acc = 0.0f, summs = 0.0f;
#pragma unroll 6
        for (int b = 0; b < p.nb; b++) {
            const u8* ab = as + b * A::BYTES;
            const u8* wb = ws + r * row_bytes + b * F::BYTES;
            mv_block_step<F>(F::codes(wb, k), scale_word<F::HAS_MIN>(wb), A::quants(ab, k),
                             scale_word<F::HAS_MIN>(ab), acc, summs);
        }
        const float s = mv_row_sum<F>(acc, summs);
        const float other = __shfl_xor_sync(FULL_MASK, s, 8);  // the pair's other row
        v = s;
        if (rot) {
            const float x0 = (j & 1) ? other : s, x1 = (j & 1) ? s : other;
            v = (j & 1) ? __fmaf_rn(x0, cs.y, x1 * cs.x) : __fmaf_rn(x0, cs.x, -(x1 * cs.y));
        }
    }
    // Into block 0's attention layout (attn_decode_body), then the barrier's
    // arrival: the query rounded as it rounds it, the fresh cell's key
    // (swizzled) and value. The global writes (the cache rows for later
    // steps, the query for the general body) need not precede the arrival
    // when the rows are delivered.
    const bool out = live && k == 0;
    cluster_wait();  // every block has started (the entry's arrival)
    if (deliver && out) {
        const size_t cell = (size_t)fresh * D * 2;
        if (i == 0)
            cluster_st_u32(att_dyn + (size_t)4 * CH * D + 4 * e, 0, __float_as_uint(round16(v)));
        else if (i == 1)
            cluster_st_u16(att_dyn + cell + ((((e >> 3) ^ (int)(fresh & 7)) << 4) | ((e & 7) << 1)), 0,
                           f2h(v));
        else
            cluster_st_u16(att_dyn + (size_t)2 * CH * D + cell + 2 * e, 0, f2h(v));
    }
    if (deliver) cluster_arrive();
    if (out) {
        if (i == 0) {
            if (!deliver) p.q[row] = v;
        } else {
            u64 at = (u64)(step ? step[p.step_at[i]] : p.start[i]);
            if (p.ring[i] != NONE_U32) at %= p.ring[i];
            enc<1>(p.cache[i] + at * p.cache_row[i], row, v);
        }
    }
    if (!deliver) cluster_arrive();
}

// One block's part of a head's cluster: its rows (if its matrix is
// absorbed; after the wait on the kernels before), then the cluster barrier
// after which every block's rows are written. Block 0 runs it where the
// attention body waits.
template <class F>
struct ProjPart {
    const ProjArgs& p;
    const u32* step;
    u8* ws;
    const u8* src;
    int i, r0, rows, D, h, kvh;
    bool mine, deliver;
    u32 fresh;
    int CH;

    __device__ __forceinline__ void operator()() const {
        if (mine) {
            pdl_sync();
            proj_rows<F>(p, step, ws, src, i, r0, rows, D, h, kvh, p.pre, deliver, fresh, CH);
        } else {
            cluster_wait();
            cluster_arrive();
        }
        cluster_wait();
    }
    __device__ __forceinline__ bool filled() const { return deliver; }
};

// f16 caches; OUTF 0 / 1: the attention rows quantized to Q8_0 / Q8_1.
// Block z of a head's cluster computes part z % PROJ_PARTS of matrix
// z / PROJ_PARTS (the query's block 0 always has one); block 0 then attends.
// SPLIT (numerics `fast`): block 0 attends only where the one-pass body
// fits; otherwise the node's split kernel (fast/attention.cu), launched
// next, attends over the query row and cache rows written here.
template <class F, int OUTF, bool SPLIT>
DEV void proj_attn_body(const ProjArgs& p, const u8* kc, const u8* vc, void* out,
                        const AttnArgs& a, const u32* step) {
    extern __shared__ __align__(16) u8 att_dyn[];
    const int D = a.head_dim, h = blockIdx.x, kvh = h / (a.heads / a.kv_heads), z = blockIdx.z;
    const int i = z / PROJ_PARTS, rows = D / PROJ_PARTS, r0 = (z % PROJ_PARTS) * rows;
    const bool mine = p.w[i] != 0;
    const int row_bytes = p.nb * F::BYTES;
    const u8* src = mine ? p.w[i] + ((size_t)(i ? kvh : h) * D + r0) * row_bytes : 0;
    u8* ws = att_dyn + p.smem;
    // Two barrier phases: every block started (this arrival, waited for
    // before any store into block 0's shared memory), then the rows written.
    cluster_arrive_relaxed();
    if (mine && p.pre) proj_copy(ws, src, rows * row_bytes);
    const u32 qpos = step ? step[0] : a.q_position;
    const u32 kv_rows = step ? step[1] : a.kv_rows;
    // Every block decides alike whether block 0 takes the one-pass body
    // and so whether the rows go straight into its shared memory (the
    // query, and the fresh cell when both its rows are computed here).
    const bool fits = attn_decode_fits(a, qpos, kv_rows);
    const u32 fresh = a.ring != NONE_U32 ? qpos % a.ring : qpos;
    const u32 cells = a.ring != NONE_U32 ? min(a.ring, kv_rows) : min(qpos + 1u, kv_rows);
    const bool deliver = fits && fresh < cells && p.w[1] && p.w[2];
    const ProjPart<F> part{p, step, ws, src, i, r0, rows, D, h, kvh, mine, deliver, fresh, (int)a.chunk};
    if (z != 0) {
        part();
        return;
    }
    if (fits) {
        attn_decode_body<OUTF>(p.q, kc, vc, out, a, qpos, kv_rows, part);
        return;
    }
    part();
    if (SPLIT) return;
    attn_chunk_body<true, true, OUTF>(p.q, kc, vc, out, a, step);  // its wait: already done
}

#define PROJ_ATTN_ENTRY(FMT, F, OUT, OUTF)                                                     \
    extern "C" __global__ void __launch_bounds__(512) PROJ_CLUSTER                             \
        proj_attn_##FMT##_##OUT(ProjArgs p, const u8* k, const u8* v, void* out, AttnArgs a,   \
                                const u32* step) {                                             \
        proj_attn_body<F, OUTF, false>(p, k, v, out, a, step);                                 \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(512) PROJ_CLUSTER                             \
        proj_attn_split_##FMT##_##OUT(ProjArgs p, const u8* k, const u8* v, void* out,         \
                                      AttnArgs a, const u32* step) {                           \
        proj_attn_body<F, OUTF, true>(p, k, v, out, a, step);                                  \
    }
PROJ_ATTN_ENTRY(q4_0, FmtQ4_0, q8_0, 0)
PROJ_ATTN_ENTRY(q4_0, FmtQ4_0, q8_1, 1)
PROJ_ATTN_ENTRY(q4_1, FmtQ4_1, q8_0, 0)
PROJ_ATTN_ENTRY(q4_1, FmtQ4_1, q8_1, 1)
PROJ_ATTN_ENTRY(q5_0, FmtQ5_0, q8_0, 0)
PROJ_ATTN_ENTRY(q5_0, FmtQ5_0, q8_1, 1)
PROJ_ATTN_ENTRY(q8_0, FmtQ8_0, q8_0, 0)
PROJ_ATTN_ENTRY(q8_0, FmtQ8_0, q8_1, 1)
