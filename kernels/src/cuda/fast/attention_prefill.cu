// Fast prefill attention (numerics `fast`): flash attention on the tensor
// cores (`mma.sync` m16n8k16, f16 operands, f32 accumulators) for many
// query rows over an f16 cache: causal, grouped-query, windows, rings and
// soft caps, head sizes 64 and 128.
//
// Grid (query tiles of 64 rows, query heads). A block's four warps take 16
// query rows each; the query rows are widened from f32 to f16 once
// (pre-scaled by scale * log2(e) without a soft cap) and held as mma
// fragments. The cells go by in tiles of 64 rows of keys and values,
// copied into shared memory with 16-byte `cp.async` one tile ahead. Per
// tile a warp computes its 16 x 64 scores (S = Q K^T), masks the cells its
// rows do not see, updates its rows' running maxima and sums (an online
// softmax in base 2), rounds the weights to f16 and adds P V into its
// f32 output rows (the values' fragments through `ldmatrix.trans`).
//
// Float order and bound: the scores are f16 x f16 products summed in f32 by
// the tensor cores, the weights exp2f of the score less the running max
// rounded to f16 for P V; the sums of weights are kept in f32 before that
// rounding. Against an f64 softmax over the same f16 keys and values the
// error is that of rounding the queries and the weights to f16: about
// 2^-11 of each score's magnitude and of each weight, so a few 1e-3 of the
// row's largest value (the tests allow 1e-2 of it).

#define FP_THREADS 128
#define FP_ROWS 64   // query rows per block (16 per warp)
#define FP_CELLS 64  // cells per tile
#define FP_LOG2E 1.4426950408889634f

template <int D>
struct FpLayout {
    enum {
        STRIDE = D + 8,              // halves per tile row (16 bytes of padding)
        TILE_HALVES = FP_CELLS * STRIDE,    // halves per tile
        BYTES = 2 * 2 * TILE_HALVES * 2,    // two stages of keys and values
    };
};

// Two f32 values as one word of f16 (lo in the low half).
DEV u32 fp_pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

DEV void fp_mma(float* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The fragment of an mma's second operand from rows k0..k0+15 of a
// row-major f16 tile (rows are k, columns n): `p` is this lane's row
// (k0 + lane % 16) at the fragment's first column.
DEV void fp_ldsm_trans(u32& b0, u32& b1, const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                 : "=r"(b0), "=r"(b1)
                 : "r"(smem_addr(p)));
}

template <int D>
DEV void attn_prefill_body(const float* q, const u8* kc, const u8* vc, float* out, const AttnArgs a,
                           const u32* step) {
    typedef FpLayout<D> L;
    extern __shared__ __align__(16) u8 fp_smem[];
    u16* const sk = (u16*)fp_smem;     // [2][FP_CELLS][STRIDE]
    u16* const sv = sk + 2 * L::TILE_HALVES;  // [2][FP_CELLS][STRIDE]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const int h = blockIdx.y, kvh = h / (a.heads / a.kv_heads);
    const int t0 = a.row_offset + blockIdx.x * FP_ROWS;
    const int rows[2] = {t0 + warp * 16 + g, t0 + warp * 16 + g + 8};
    const u32 qpos = step ? step[0] : a.q_position;
    const u32 kv_rows = step ? step[1] : a.kv_rows;
    pdl_sync();
    if (t0 >= a.n) return;
    const AttnExtent e = attn_extent(a, qpos, kv_rows);
    const int tlast = min(t0 + FP_ROWS, a.n) - 1;
    // The block's candidate cells: exact bounds without a ring (causal,
    // window), every cell of a ring (each checked below).
    u32 lo = 0, hi = e.cells;
    if (a.ring == NONE_U32) {
        hi = min(hi, qpos + (u32)tlast + 1u);
        if (a.window != NONE_U32 && qpos + (u32)t0 + 1u > a.window) lo = qpos + (u32)t0 + 1u - a.window;
    }
    const int tile0 = (int)(lo / FP_CELLS);
    const int tiles = hi > lo ? (int)((hi - 1) / FP_CELLS) - tile0 + 1 : 0;

    const bool cap = a.softcap != 0.0f;
    const float qscale = cap ? 1.0f : a.scale * FP_LOG2E;
    u32 qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = rows[i & 1], col = kk * 16 + 8 * (i >> 1) + 2 * tq;
            float2 v = make_float2(0.0f, 0.0f);
            if (r < a.n) v = *(const float2*)(q + (size_t)r * a.q_stride + (size_t)h * D + col);
            qf[kk][i] = fp_pack(v.x * qscale, v.y * qscale);
        }

    auto load = [&](int j) {
        const u32 c0 = (u32)(tile0 + j) * FP_CELLS;
        const int buf = j & 1;
        for (int i = tid; i < FP_CELLS * (D / 8); i += FP_THREADS) {
            const int r = i / (D / 8), ch = i % (D / 8);
            // Rows past the cells read the last cell (masked below).
            const u32 c = min(c0 + (u32)r, e.cells - 1u);
            const size_t off = ((size_t)c * a.kv_stride + (size_t)kvh * D + ch * 8) * 2;
            cp_async16(sk + buf * L::TILE_HALVES + r * L::STRIDE + ch * 8, kc + off);
            cp_async16(sv + buf * L::TILE_HALVES + r * L::STRIDE + ch * 8, vc + off);
        }
        cp_async_commit();
    };

    float o[D / 8][4];
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++)
#pragma unroll
        for (int i = 0; i < 4; i++) o[nd][i] = 0.0f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};

    if (tiles > 0) load(0);
    for (int j = 0; j < tiles; j++) {
        if (j + 1 < tiles) {
            load(j + 1);
            cp_async_wait_one();
        } else {
            cp_async_wait_all();
        }
        __syncthreads();
        const u16* K = sk + (j & 1) * L::TILE_HALVES;
        const u16* V = sv + (j & 1) * L::TILE_HALVES;
        const u32 c0 = (u32)(tile0 + j) * FP_CELLS;

        float s[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int i = 0; i < 4; i++) s[nt][i] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const u16* kr = K + (nt * 8 + g) * L::STRIDE + kk * 16 + 2 * tq;
                fp_mma(s[nt], qf[kk], *(const u32*)kr, *(const u32*)(kr + 8));
            }
        }
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float x = s[nt][i];
                if (cap) x = a.softcap * tanhf(x * a.softcap_scale) * FP_LOG2E;
                const int r = rows[i >> 1];
                const u32 cell = c0 + (u32)(nt * 8 + 2 * tq + (i & 1));
                const bool vis = r < a.n && cell < e.cells && attn_visible(a, cell, qpos + (u32)r, e.end);
                x = vis ? x : NEG_INF;
                s[nt][i] = x;
                mx[i >> 1] = fmaxf(mx[i >> 1], x);
            }
        float corr[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            mx[k] = fmaxf(mx[k], __shfl_xor_sync(FULL_MASK, mx[k], 1));
            mx[k] = fmaxf(mx[k], __shfl_xor_sync(FULL_MASK, mx[k], 2));
            corr[k] = mx[k] == NEG_INF ? 1.0f : exp2f(m[k] - mx[k]);
            l[k] *= corr[k];
            m[k] = mx[k];
        }
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++)
#pragma unroll
            for (int i = 0; i < 4; i++) o[nd][i] *= corr[i >> 1];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float mk = m[i >> 1];
                const float p = mk == NEG_INF ? 0.0f : exp2f(s[nt][i] - mk);
                s[nt][i] = p;
                l[i >> 1] += p;
            }
        // P (16 x 64, f16) times V (64 x D).
#pragma unroll
        for (int kk = 0; kk < FP_CELLS / 16; kk++) {
            const u32 pa[4] = {fp_pack(s[2 * kk][0], s[2 * kk][1]), fp_pack(s[2 * kk][2], s[2 * kk][3]),
                               fp_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               fp_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            const u16* vr = V + (kk * 16 + (lane & 15)) * L::STRIDE;
#pragma unroll
            for (int nd = 0; nd < D / 8; nd++) {
                u32 b0, b1;
                fp_ldsm_trans(b0, b1, vr + nd * 8);
                fp_mma(o[nd], pa, b0, b1);
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int k = 0; k < 2; k++) {
        l[k] += __shfl_xor_sync(FULL_MASK, l[k], 1);
        l[k] += __shfl_xor_sync(FULL_MASK, l[k], 2);
    }
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int r = rows[k];
        if (r >= a.n) continue;
        const float inv = l[k] > 0.0f ? 1.0f / l[k] : 0.0f;
        float* orow = out + (size_t)r * a.out_stride + (size_t)h * D;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++)
            *(float2*)(orow + nd * 8 + 2 * tq) = make_float2(o[nd][2 * k] * inv, o[nd][2 * k + 1] * inv);
    }
}

#define ATTN_PREFILL_ENTRY(D)                                                                  \
    extern "C" __global__ void __launch_bounds__(FP_THREADS)                                   \
        attn_prefill_f16_d##D(const float* q, const u8* k, const u8* v, float* out, AttnArgs a, \
                              const u32* step) {                                               \
        attn_prefill_body<D>(q, k, v, out, a, step);                                           \
    }
ATTN_PREFILL_ENTRY(64)
ATTN_PREFILL_ENTRY(128)
