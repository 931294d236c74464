// Decode attention with the projections it reads (`qkv+attention+quantize`,
// ops' ProjAttention): block h (one query head) computes its head's query
// rows and, when absorbed, its kv head's key and value rows, writes the
// rotated query into the node's scratch and the key and value rows into
// their caches, then runs the one-chunk attention entry's body. So a decode
// step's attention needs no level of its own for its q/k/v projections.
//
// Same bits as the chain: each row is mv_rows32_staged's product (eight
// lanes per row, blocks in order, hsum_float_8, then the mins), rotated as
// matmul_rows_body rotates it, converted as set_rows converts it; the
// attention is attn_decode_body / attn_chunk_body unchanged.
//
// The projections' weight rows go to shared memory (16-byte cp.async when
// aligned) before the wait when they are constant, beside attention's own
// copies of earlier cells; the wait (ProjWait, called where the attention
// body waits) computes the rows. Every block of a kv head writes that head's
// cache rows (the same bits) and reads them back only after its own writes
// and a block barrier, so no block depends on another's.

// Mirrors `ProjArgs` in attention.rs, field for field. Matrix 0 is the
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

// Head h's rows of the query matrix, kv head kvh's of the others, into
// shared memory (a contiguous range per matrix).
template <class F>
DEV void proj_copy(const ProjArgs& p, u8* ws, int D, int h, int kvh) {
    const int mat_bytes = D * p.nb * F::BYTES;
#pragma unroll
    for (int i = 0; i < 3; i++) {
        if (!p.w[i]) continue;
        const u8* src = p.w[i] + (size_t)(i ? kvh : h) * mat_bytes;
        u8* dst = ws + i * mat_bytes;
        if ((((size_t)src | (size_t)mat_bytes) & 15) == 0) {
            for (int c = threadIdx.x; c < mat_bytes / 16; c += blockDim.x)
                cp_async16(dst + 16 * c, src + 16 * c);
        } else {
            for (int c = 2 * threadIdx.x; c < mat_bytes; c += 2 * blockDim.x)
                *(u16*)(dst + c) = ld_u16(src + c);
        }
    }
    cp_async_commit();
}

// The attention body's wait: the wait itself, then the rows.
template <class F>
struct ProjWait {
    const ProjArgs& p;
    const u32* step;
    u8* ws;
    int D, h, kvh;

    __device__ __forceinline__ void operator()() const {
        typedef Act<F::HAS_MIN> A;
        pdl_sync();
        if (!p.pre) proj_copy<F>(p, ws, D, h, kvh);
        const int row_bytes = p.nb * F::BYTES, mat_bytes = D * row_bytes;
        u8* as = ws + 3 * mat_bytes;
        stage_bytes(as, p.act, p.nb * A::BYTES);
        const int pos = p.positions ? p.positions[0] : 0;
        cp_async_wait_all();
        __syncthreads();
        const int k = threadIdx.x & 7;
        for (int r = threadIdx.x >> 3; r < D; r += blockDim.x >> 3) {
            float acc[3] = {0.0f, 0.0f, 0.0f}, summs[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll 3
            for (int b = 0; b < p.nb; b++) {
                const u8* ab = as + b * A::BYTES;
                const u32 aq = A::quants(ab, k), ads = scale_word<F::HAS_MIN>(ab);
#pragma unroll
                for (int i = 0; i < 3; i++) {
                    if (!p.w[i]) continue;
                    const u8* wb = ws + i * mat_bytes + r * row_bytes + b * F::BYTES;
                    mv_block_step<F>(F::codes(wb, k), scale_word<F::HAS_MIN>(wb), aq, ads, acc[i],
                                     summs[i]);
                }
            }
#pragma unroll
            for (int i = 0; i < 3; i++) {
                const float s = mv_row_sum<F>(acc[i], summs[i]);
                const float other = __shfl_xor_sync(FULL_MASK, s, 8);  // the pair's other row
                if (k != 0 || !p.w[i]) continue;
                const int row = (i ? kvh : h) * D + r;  // in the matrix
                float v = s;
                if (p.rope[i]) {
                    const RopeArgs& ra = p.ra;
                    const int j = row % ra.head_dim;
                    if (j < ra.n_dims) {
                        const int pair = j / 2, half = ra.n_dims / 2;
                        float2 cs;
                        if (pos >= 0 && (u32)pos < ra.table_positions)
                            cs = p.table[(size_t)pos * half + pair];
                        else cs = rope_angle_fallback(ra, pos, pair);
                        const float x0 = (j & 1) ? other : s, x1 = (j & 1) ? s : other;
                        v = (j & 1) ? __fmaf_rn(x0, cs.y, x1 * cs.x)
                                    : __fmaf_rn(x0, cs.x, -(x1 * cs.y));
                    }
                }
                if (i == 0) {
                    p.q[row] = v;
                } else {
                    u64 at = (u64)(step ? step[p.step_at[i]] : p.start[i]);
                    if (p.ring[i] != NONE_U32) at %= p.ring[i];
                    enc<1>(p.cache[i] + at * p.cache_row[i], row, v);
                }
            }
        }
        __syncthreads();
    }
};

// f16 caches; OUTF 0 / 1: the attention rows quantized to Q8_0 / Q8_1.
template <class F, int OUTF>
DEV void proj_attn_body(const ProjArgs& p, const u8* kc, const u8* vc, void* out,
                        const AttnArgs& a, const u32* step) {
    extern __shared__ __align__(16) u8 att_dyn[];
    const int D = a.head_dim, h = blockIdx.x, kvh = h / (a.heads / a.kv_heads);
    u8* ws = att_dyn + p.smem;
    if (p.pre) proj_copy<F>(p, ws, D, h, kvh);
    const ProjWait<F> wait{p, step, ws, D, h, kvh};
    const u32 qpos = step ? step[0] : a.q_position;
    const u32 kv_rows = step ? step[1] : a.kv_rows;
    if (attn_decode_fits(a, qpos, kv_rows)) {
        attn_decode_body<OUTF>(p.q, kc, vc, out, a, qpos, kv_rows, wait);
        return;
    }
    wait();
    attn_chunk_body<true, true, OUTF>(p.q, kc, vc, out, a, step);  // its wait: already done
}

#define PROJ_ATTN_ENTRY(FMT, F, OUT, OUTF)                                                     \
    extern "C" __global__ void __launch_bounds__(512)                                          \
        proj_attn_##FMT##_##OUT(ProjArgs p, const u8* k, const u8* v, void* out, AttnArgs a,   \
                                const u32* step) {                                             \
        proj_attn_body<F, OUTF>(p, k, v, out, a, step);                                        \
    }
PROJ_ATTN_ENTRY(q4_0, FmtQ4_0, q8_0, 0)
PROJ_ATTN_ENTRY(q4_0, FmtQ4_0, q8_1, 1)
PROJ_ATTN_ENTRY(q4_1, FmtQ4_1, q8_0, 0)
PROJ_ATTN_ENTRY(q4_1, FmtQ4_1, q8_1, 1)
PROJ_ATTN_ENTRY(q5_0, FmtQ5_0, q8_0, 0)
PROJ_ATTN_ENTRY(q5_0, FmtQ5_0, q8_1, 1)
PROJ_ATTN_ENTRY(q8_0, FmtQ8_0, q8_0, 0)
PROJ_ATTN_ENTRY(q8_0, FmtQ8_0, q8_1, 1)
