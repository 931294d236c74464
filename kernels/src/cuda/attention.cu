// Attention in llama.cpp's three CPU flash-attention variants, as weft's CPU
// kernel (kernels/src/cpu/attention.rs) computes them, bit for bit:
//
// - one chunk (fewer than 64 query rows in the ubatch) and split KV (one
//   query row, a padded cache view of 512 cells or more: two halves merged):
//   `attn_chunk`. Per (query row, head) block: the scores of a chunk of
//   cells are computed in parallel (q rounded to f16 for an f16 cache, the
//   dot product in ggml's 4x16-lane order), then the running maximum by a
//   scan, the online-softmax factors with glibc's expf in parallel, and
//   finally the one sequential part: per output dimension, the accumulator
//   update (re-rounded to f16 after every key for an f16 cache) over the
//   chunk's keys in order.
// - tiled (64 or more query rows in the ubatch): `attn_tiled`. Per (block
//   of 64 query rows, head): keys and values in tiles of 64 through shared
//   memory, each score an in-order fma chain, ggml_v_expf probabilities,
//   the f64 tile sums, f32 accumulators.
//
// Step scalars (read from device memory when `step` is not null, so a
// captured graph replays for the next token): step[0] = q_position,
// step[1] = rows of the node's cache view.

struct AttnArgs {
    int heads, kv_heads, head_dim, n;
    int q_stride, kv_stride, out_stride, row_offset;
    float scale, softcap;
    u32 window, ring, kv_capacity, q_position, kv_rows;
};

DEV bool attn_visible(const AttnArgs& a, u32 slot, u32 pos, u32 end) {
    if (a.ring == NONE_U32) return slot <= pos && (a.window == NONE_U32 || pos - slot < a.window);
    if (!(slot < a.ring && slot < end)) return false;
    const u32 c = slot + (end - 1 - slot) / a.ring * a.ring;
    return c <= pos && (a.window == NONE_U32 || pos - c < a.window);
}

// Score scale and soft cap (tanhf is CUDA's here: soft-capped scores are
// within a few ulp of the CPU's, not bit-exact).
DEV float attn_scaled(const AttnArgs& a, float s) {
    if (a.softcap != 0.0f) return a.softcap * tanhf(s * (a.scale / a.softcap));
    return s * a.scale;
}

template <bool F16>
DEV void load16(const void* row, int i, float* out) {
    if (F16) {
        const uint4 u0 = *(const uint4*)((const u16*)row + i);
        const uint4 u1 = *(const uint4*)((const u16*)row + i + 8);
        const u32 w[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
        for (int k = 0; k < 8; k++) {
            out[2 * k] = h2f((u16)(w[k] & 0xffffu));
            out[2 * k + 1] = h2f((u16)(w[k] >> 16));
        }
    } else {
        const float4* p = (const float4*)((const float*)row + i);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 v = p[k];
            out[4 * k] = v.x;
            out[4 * k + 1] = v.y;
            out[4 * k + 2] = v.z;
            out[4 * k + 3] = v.w;
        }
    }
}

template <bool F16>
DEV float kv_at(const void* row, int i) {
    return F16 ? h2f(((const u16*)row)[i]) : ((const float*)row)[i];
}

// ggml's vec_dot_f16 / vec_dot_f32 (AVX-512): four 16-lane fma accumulators
// per 64 elements, folded (0+2)+(1+3), reduced, the tail added in f64.
template <bool K16>
DEV float attn_dot(const void* krow, const float* q, int d) {
    double total = 0.0;
    const int body = d - d % 64;
    if (body > 0) {
        float acc[64];
#pragma unroll
        for (int i = 0; i < 64; i++) acc[i] = 0.0f;
        for (int s = 0; s < body; s += 64) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float kv[16];
                load16<K16>(krow, s + 16 * j, kv);
#pragma unroll
                for (int l = 0; l < 16; l++)
                    acc[16 * j + l] = __fmaf_rn(kv[l], q[s + 16 * j + l], acc[16 * j + l]);
            }
        }
        float f[16];
#pragma unroll
        for (int l = 0; l < 16; l++) f[l] = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
        total = (double)reduce16_regs(f);
    }
    for (int i = body; i < d; i++) total += (double)(kv_at<K16>(krow, i) * q[i]);
    return __double2float_rn(total);
}

// ---- one chunk / split KV -------------------------------------------------------

#define ATTN_CH 256

struct ChunkShared {
    float score[2][ATTN_CH];  // scores, then vs
    float mprev[2][ATTN_CH];  // running max before each cell, then ms
    u8 flag[2][ATTN_CH];      // bit 0: visible, bit 1: new maximum
    float part_m[2], part_s[2];
};

template <bool K16, bool V16>
DEV void attn_chunk_body(const float* q, const u8* kc, const u8* vc, float* out, AttnArgs a,
                         const u32* step) {
    extern __shared__ float dyn[];
    ChunkShared& sh = *(ChunkShared*)dyn;
    float* qs = dyn + sizeof(ChunkShared) / 4;  // [D]
    float* part_acc = qs + a.head_dim;          // [2][D]
    const int D = a.head_dim;
    const int tid = threadIdx.x, nt = blockDim.x;
    const int h = blockIdx.x, t = a.row_offset + blockIdx.y;
    const int kvh = h / (a.heads / a.kv_heads);
    const u32 qpos = step ? step[0] : a.q_position;
    const u32 kv_rows = step ? step[1] : a.kv_rows;
    const u32 end = qpos + (u32)a.n, pos = qpos + (u32)t;
    const u32 cells = a.ring != NONE_U32 ? min(a.ring, kv_rows) : min(end, kv_rows);
    const u32 capacity = a.kv_capacity ? a.kv_capacity : kv_rows;
    const u32 padded = max((end + 255u) / 256u, 1u) * 256u;
    const u32 n_kv = min(padded, capacity);
    u32 lo[2] = {0, 0}, hi[2] = {cells, 0};
    int parts = 1;
    if (a.n == 1 && n_kv >= 512) {
        parts = 2;
        const u32 chunk = (n_kv + 1) / 2;
        for (int p = 0; p < 2; p++) {
            const u32 start = p * chunk;
            if (start >= n_kv) {
                lo[p] = hi[p] = 0;
            } else {
                lo[p] = min(start, cells);
                hi[p] = min(min((p + 1) * chunk, n_kv), cells);
                if (hi[p] < lo[p]) hi[p] = lo[p];
            }
        }
    }
    const float* qrow = q + (size_t)t * a.q_stride + (size_t)h * D;
    for (int d = tid; d < D; d += nt) qs[d] = K16 ? round16(qrow[d]) : qrow[d];
    const size_t kvoff = (size_t)kvh * D;
    const size_t esz_k = K16 ? 2 : 4, esz_v = V16 ? 2 : 4;
    // Chain threads: part p = tid / D, dimension d = tid % D.
    const int cp = tid / D, cd = tid % D;
    const bool chain = cp < parts;
    float acc = 0.0f, ssum = 0.0f;
    float run_m = NEG_INF;  // running max, kept by the scan warps (warp p)
    u32 len_max = max(hi[0] - lo[0], parts > 1 ? hi[1] - lo[1] : 0u);
    __syncthreads();
    for (u32 it = 0; it * ATTN_CH < len_max; it++) {
        // 1. scores
        for (int idx = tid; idx < 2 * ATTN_CH; idx += nt) {
            const int p = idx / ATTN_CH, j = idx % ATTN_CH;
            const u32 c = lo[p] + it * ATTN_CH + j;
            float s = NEG_INF;
            u8 f = 0;
            if (p < parts && c < hi[p] && attn_visible(a, c, pos, end)) {
                const u8* krow = kc + ((size_t)c * a.kv_stride + kvoff) * esz_k;
                s = attn_scaled(a, attn_dot<K16>(krow, qs, D));
                f = 1;
            }
            sh.score[p][j] = s;
            sh.flag[p][j] = f;
        }
        __syncthreads();
        // 2. running max before each cell (warp p scans part p)
        const int warp = tid >> 5, lane = tid & 31;
        if (warp < parts) {
            const int p = warp;
            const int per = ATTN_CH / 32;
            float local[ATTN_CH / 32];
            float lmax = NEG_INF;
#pragma unroll
            for (int k = 0; k < per; k++) {
                local[k] = lmax;
                const int j = lane * per + k;
                if (sh.flag[p][j]) lmax = fmaxf(lmax, sh.score[p][j]);
            }
            float incl = lmax;
            for (int o = 1; o < 32; o <<= 1) {
                const float v = __shfl_up_sync(FULL_MASK, incl, o);
                if (lane >= o) incl = fmaxf(incl, v);
            }
            float excl = __shfl_up_sync(FULL_MASK, incl, 1);
            if (lane == 0) excl = NEG_INF;
            const float before = fmaxf(run_m, excl);
#pragma unroll
            for (int k = 0; k < per; k++) sh.mprev[p][lane * per + k] = fmaxf(before, local[k]);
            run_m = fmaxf(run_m, __shfl_sync(FULL_MASK, incl, 31));
        }
        __syncthreads();
        // 3. online-softmax factors
        for (int idx = tid; idx < 2 * ATTN_CH; idx += nt) {
            const int p = idx / ATTN_CH, j = idx % ATTN_CH;
            const u8 f = sh.flag[p][j];
            if (!f) continue;
            const float s = sh.score[p][j], m = sh.mprev[p][j];
            if (s > m) {
                sh.mprev[p][j] = glibc_expf(m - s);  // ms
                sh.score[p][j] = 1.0f;               // vs
                sh.flag[p][j] = 3;
            } else {
                sh.mprev[p][j] = 1.0f;
                sh.score[p][j] = glibc_expf(s - m);
            }
        }
        __syncthreads();
        // 4. the sequential accumulation, one thread per (part, dimension)
        if (chain) {
            const u32 base = lo[cp] + it * ATTN_CH;
            const u32 last = cells > 0 ? cells - 1 : 0;
            const u8* vcol = vc + (kvoff + cd) * esz_v;
            for (int j0 = 0; j0 < ATTN_CH; j0 += 8) {
                float vv[8];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const u32 c = min(base + j0 + u, last);
                    vv[u] = kv_at<V16>(vcol + (size_t)c * a.kv_stride * esz_v, 0);
                }
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const u8 f = sh.flag[cp][j0 + u];
                    if (!f) continue;
                    const float ms = sh.mprev[cp][j0 + u], vs = sh.score[cp][j0 + u];
                    if (f & 2) acc = V16 ? round16(acc * ms) : acc * ms;
                    acc = V16 ? round16(__fmaf_rn(vv[u], vs, acc)) : __fmaf_rn(vs, vv[u], acc);
                    if (cd == 0) ssum = __fmaf_rn(ssum, ms, vs);
                }
            }
        }
        __syncthreads();
    }
    // Results: the running max of each part lives in warp p.
    if ((tid & 31) == 0 && (tid >> 5) < parts) sh.part_m[tid >> 5] = run_m;
    if (chain) {
        part_acc[cp * D + cd] = acc;
        if (cd == 0) sh.part_s[cp] = ssum;
    }
    __syncthreads();
    float* orow = out + (size_t)t * a.out_stride + (size_t)h * D;
    for (int d = tid; d < D; d += nt) {
        float o, s;
        if (parts == 1) {
            o = part_acc[d];
            s = sh.part_s[0];
        } else {
            float m = NEG_INF;
            o = 0.0f;
            s = 0.0f;
            for (int p = 0; p < 2; p++) {
                if (sh.part_s[p] == 0.0f) continue;
                const float pm = sh.part_m[p];
                const float m_new = fmaxf(m, pm);
                const float so = glibc_expf(m - m_new), sn = glibc_expf(pm - m_new);
                o = __fmaf_rn(o, so, part_acc[p * D + d] * sn);
                s = __fmaf_rn(s, so, sh.part_s[p] * sn);
                m = m_new;
            }
        }
        const float inv = s == 0.0f ? 0.0f : 1.0f / s;
        orow[d] = o * inv;
    }
}

#define ATTN_CHUNK_ENTRY(NAME, K16, V16)                                                       \
    extern "C" __global__ void __launch_bounds__(512)                                          \
        NAME(const float* q, const u8* k, const u8* v, float* out, AttnArgs a,                 \
             const u32* step) {                                                                \
        attn_chunk_body<K16, V16>(q, k, v, out, a, step);                                      \
    }
ATTN_CHUNK_ENTRY(attn_chunk_f16, true, true)
ATTN_CHUNK_ENTRY(attn_chunk_f32, false, false)

// ---- tiled (64 or more query rows per ubatch) -----------------------------------------

#define TILE 64
#define TILED_WARPS 16
#define ROWS_PER_WARP (TILE / TILED_WARPS)

template <bool K16, bool V16>
DEV void attn_tiled_body(const float* q, const u8* kc, const u8* vc, float* out, AttnArgs a,
                         const u32* step) {
    extern __shared__ float dyn[];
    const int D = a.head_dim;
    float* qsh = dyn;                      // [64][D]
    float* psh = qsh + TILE * D;           // [64][64]
    u8* kt = (u8*)(psh + TILE * TILE);     // [D][64] keys, transposed
    u8* vt = kt + (size_t)D * TILE * (K16 ? 2 : 4);  // [64][D]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.x;
    const int row0 = a.row_offset + blockIdx.y * TILE;
    const int rows = min(TILE, a.n - row0);
    const int kvh = h / (a.heads / a.kv_heads);
    const u32 qpos = step ? step[0] : a.q_position;
    const u32 kv_rows = step ? step[1] : a.kv_rows;
    const u32 end = qpos + (u32)a.n;
    const u32 cells = a.ring != NONE_U32 ? min(a.ring, kv_rows) : min(end, kv_rows);
    const size_t kvoff = (size_t)kvh * D;
    for (int idx = tid; idx < TILE * D; idx += blockDim.x) {
        const int i = idx / D, d = idx % D;
        qsh[idx] = i < rows ? q[(size_t)(row0 + i) * a.q_stride + (size_t)h * D + d] : 0.0f;
    }
    const int dq = D / 32;  // dimensions per lane (D is a multiple of 32)
    float acc[ROWS_PER_WARP][8];
    float m[ROWS_PER_WARP], ssum[ROWS_PER_WARP];
#pragma unroll
    for (int rr = 0; rr < ROWS_PER_WARP; rr++) {
        m[rr] = NEG_INF;
        ssum[rr] = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) acc[rr][k] = 0.0f;
    }
    const u32 first_pos = qpos + row0, last_pos = qpos + row0 + rows - 1;
    for (u32 ts = 0; ts < cells; ts += TILE) {
        const u32 tlen = min((u32)TILE, cells - ts);
        if (a.ring == NONE_U32) {
            const bool newest = ts <= last_pos;
            const bool oldest = a.window == NONE_U32 || ts + tlen - 1 + a.window > first_pos;
            if (!(newest && oldest)) continue;
        }
        __syncthreads();
        for (int idx = tid; idx < (int)tlen * D; idx += blockDim.x) {
            const int j = idx / D, d = idx % D;
            const size_t g = (size_t)(ts + j) * a.kv_stride + kvoff + d;
            if (K16) ((u16*)kt)[d * TILE + j] = ((const u16*)kc)[g];
            else ((float*)kt)[d * TILE + j] = ((const float*)kc)[g];
            if (V16) ((u16*)vt)[j * D + d] = ((const u16*)vc)[g];
            else ((float*)vt)[j * D + d] = ((const float*)vc)[g];
        }
        __syncthreads();
        // scores for the warp's rows, keys lane and lane + 32
        float s0[ROWS_PER_WARP], s1[ROWS_PER_WARP];
#pragma unroll
        for (int rr = 0; rr < ROWS_PER_WARP; rr++) s0[rr] = s1[rr] = 0.0f;
        for (int d = 0; d < D; d++) {
            float k0, k1;
            if (K16) {
                k0 = h2f(((const u16*)kt)[d * TILE + lane]);
                k1 = h2f(((const u16*)kt)[d * TILE + lane + 32]);
            } else {
                k0 = ((const float*)kt)[d * TILE + lane];
                k1 = ((const float*)kt)[d * TILE + lane + 32];
            }
#pragma unroll
            for (int rr = 0; rr < ROWS_PER_WARP; rr++) {
                const float qd = qsh[(warp * ROWS_PER_WARP + rr) * D + d];
                s0[rr] = __fmaf_rn(qd, k0, s0[rr]);
                s1[rr] = __fmaf_rn(qd, k1, s1[rr]);
            }
        }
#pragma unroll
        for (int rr = 0; rr < ROWS_PER_WARP; rr++) {
            const int i = warp * ROWS_PER_WARP + rr;
            if (i >= rows) continue;  // uniform per warp
            const u32 pos = qpos + row0 + i;
            const bool seen0 = (u32)lane < tlen && attn_visible(a, ts + lane, pos, end);
            const bool seen1 = (u32)(lane + 32) < tlen && attn_visible(a, ts + lane + 32, pos, end);
            const float x0 = seen0 ? attn_scaled(a, s0[rr]) : NEG_INF;
            const float x1 = seen1 ? attn_scaled(a, s1[rr]) : NEG_INF;
            const float tmax = warp_max(fmaxf(x0, x1));
            if (tmax == NEG_INF) continue;
            const float m_new = fmaxf(m[rr], tmax);
            if (m_new > m[rr]) {
                const float ms = glibc_expf(m[rr] - m_new);
#pragma unroll
                for (int k = 0; k < 8; k++)
                    if (k < dq) acc[rr][k] = acc[rr][k] * ms;
                ssum[rr] = ssum[rr] * ms;
            }
            m[rr] = m_new;
            const float p0 = ggml_v_expf(x0 - m_new), p1 = ggml_v_expf(x1 - m_new);
            psh[i * TILE + lane] = p0;
            psh[i * TILE + lane + 32] = p1;
            const float r0 = reduce16_lanes(p0), r1 = reduce16_lanes(p1);
            double sum = 0.0;
            sum += (double)__shfl_sync(FULL_MASK, r0, 0);
            sum += (double)__shfl_sync(FULL_MASK, r0, 16);
            sum += (double)__shfl_sync(FULL_MASK, r1, 0);
            sum += (double)__shfl_sync(FULL_MASK, r1, 16);
            ssum[rr] = __double2float_rn((double)ssum[rr] + sum);
            __syncwarp();
            for (u32 j = 0; j < tlen; j++) {
                const float pj = psh[i * TILE + j];
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    if (k < dq) {
                        const int d = lane + 32 * k;
                        const float vv = V16 ? h2f(((const u16*)vt)[j * D + d])
                                             : ((const float*)vt)[j * D + d];
                        acc[rr][k] = __fmaf_rn(pj, vv, acc[rr][k]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < ROWS_PER_WARP; rr++) {
        const int i = warp * ROWS_PER_WARP + rr;
        if (i >= rows) continue;
        const float inv = ssum[rr] == 0.0f ? 0.0f : 1.0f / ssum[rr];
        float* orow = out + (size_t)(row0 + i) * a.out_stride + (size_t)h * D;
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < dq) orow[lane + 32 * k] = acc[rr][k] * inv;
    }
}

#define ATTN_TILED_ENTRY(NAME, K16, V16)                                                       \
    extern "C" __global__ void __launch_bounds__(TILED_WARPS * 32)                             \
        NAME(const float* q, const u8* k, const u8* v, float* out, AttnArgs a,                 \
             const u32* step) {                                                                \
        attn_tiled_body<K16, V16>(q, k, v, out, a, step);                                      \
    }
ATTN_TILED_ENTRY(attn_tiled_f16, true, true)
ATTN_TILED_ENTRY(attn_tiled_f32, false, false)
