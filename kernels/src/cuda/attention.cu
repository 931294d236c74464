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
    u32 chunk;  // attn_chunk: cells per part per pass; attn_tiled: tile buffers (1 or 2)
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

// ---- asynchronous copies (sm_80+) ---------------------------------------------------

DEV u32 smem_addr(const void* p) {
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}
DEV void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
DEV void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }
DEV void cp_async_wait_one_pending() { asm volatile("cp.async.wait_group 1;\n" ::); }

// ---- one chunk / split KV -------------------------------------------------------

// OUTF: -1 writes f32 rows; 0 / 1 writes them quantized to Q8_0 / Q8_1
// (attention then quantize, fused: the values the quantizer would read).
template <bool K16, bool V16, int OUTF>
DEV void attn_chunk_body(const float* q, const u8* kc, const u8* vc, void* out, AttnArgs a,
                         const u32* step) {
    extern __shared__ __align__(16) u8 att_dyn[];
    const int D = a.head_dim, CH = (int)a.chunk;
    const int esz_k = K16 ? 2 : 4, esz_v = V16 ? 2 : 4;
    float* score = (float*)att_dyn;                   // [2][CH] scores
    float* mprev = score + 2 * CH;                    // [2][CH] running max before each cell
    float* cms = mprev + 2 * CH;                      // [2][CH] ms of the visible cells, in order
    float* cvs = cms + 2 * CH;                        // [2][CH] vs of the visible cells, in order
    u16* cidx = (u16*)(cvs + 2 * CH);                 // [2][CH] their cell (index in the pass)
    u16* cpos = cidx + 2 * CH;                        // [2][CH] compact position of each cell
    u8* flag = (u8*)(cpos + 2 * CH);                  // [2][CH] visible
    u8* vsh = flag + ((2 * CH + 15) & ~15);           // [2][CH][D] values
    float* qs = (float*)(vsh + (size_t)2 * CH * D * esz_v);  // [D]
    float* part_acc = qs + D;                         // [2][D]
    float* part_ms = part_acc + 2 * D;                // m0, m1, s0, s1
    int* pcount = (int*)(part_ms + 4);                // visible cells of the pass, per part
    const int tid = threadIdx.x, nt = blockDim.x;
    const int h = blockIdx.x, t = a.row_offset + blockIdx.y;
    const int kvh = h / (a.heads / a.kv_heads);
    // The query first: it does not wait for the step scalars.
    const float* qrow = q + (size_t)t * a.q_stride + (size_t)h * D;
    for (int d = tid; d < D; d += nt) qs[d] = K16 ? round16(qrow[d]) : qrow[d];
    const u32 qpos = step ? step[0] : a.q_position;
    const u32 kv_rows = step ? step[1] : a.kv_rows;
    const u32 end = qpos + (u32)a.n, pos = qpos + (u32)t;
    const u32 cells = a.ring != NONE_U32 ? min(a.ring, kv_rows) : min(end, kv_rows);
    const u32 capacity = a.kv_capacity ? a.kv_capacity : kv_rows;
    const u32 padded = max((end + 255u) / 256u, 1u) * 256u;
    const u32 n_kv = min(padded, capacity);
    // Cells [lo, hi) of each part (registers, not an indexed array).
    u32 lo0 = 0, hi0 = cells, lo1 = 0, hi1 = 0;
    int parts = 1;
    if (a.n == 1 && n_kv >= 512) {
        parts = 2;
        const u32 chunk = (n_kv + 1) / 2;
        hi0 = min(chunk, cells);
        if (chunk < n_kv) {
            lo1 = min(chunk, cells);
            hi1 = max(min(min(2 * chunk, n_kv), cells), lo1);
        }
    }
    auto lo_of = [&](int p) { return p ? lo1 : lo0; };
    auto hi_of = [&](int p) { return p ? hi1 : hi0; };
    const size_t kvoff = (size_t)kvh * D;
    const int cp = tid / D, cd = tid % D;  // chain thread: part, dimension
    const bool chain = cp < parts;
    float acc = 0.0f, ssum = 0.0f;
    float run_m = NEG_INF;  // running max, kept by the scan warps (warp p)
    const u32 len_max = max(hi0 - lo0, parts > 1 ? hi1 - lo1 : 0u);
    const int pieces = D * esz_v / 16;  // 16-byte pieces per value row
    __syncthreads();
    // This thread's first value piece (row of the pass, piece of the row)
    // and its stride; stepped without divisions in the copy loop.
    const int piece0 = tid % pieces, row0 = tid / pieces;
    const int piece_step = nt % pieces, row_step = nt / pieces;
    for (u32 it = 0; it * CH < len_max; it++) {
        // 1. values of the pass into shared memory (asynchronously), scores
        for (int row = row0, piece = piece0; row < parts * CH;) {
            const int p = row >= CH ? 1 : 0, j = row - p * CH;
            const u32 c = lo_of(p) + it * CH + j;
            if (c < hi_of(p))
                cp_async16(vsh + ((size_t)(p * CH + j) * D * esz_v + piece * 16),
                           vc + ((size_t)c * a.kv_stride + kvoff) * esz_v + piece * 16);
            row += row_step;
            piece += piece_step;
            if (piece >= pieces) {
                piece -= pieces;
                row++;
            }
        }
        cp_async_commit();
        for (int idx = tid; idx < 2 * CH; idx += nt) {
            const int p = idx >= CH ? 1 : 0, j = idx - p * CH;
            const u32 c = lo_of(p) + it * CH + j;
            float sc = NEG_INF;
            u8 f = 0;
            if (p < parts && c < hi_of(p) && attn_visible(a, c, pos, end)) {
                const u8* krow = kc + ((size_t)c * a.kv_stride + kvoff) * esz_k;
                sc = attn_scaled(a, attn_dot<K16>(krow, qs, D));
                f = 1;
            }
            score[idx] = sc;
            flag[idx] = f;
        }
        __syncthreads();
        // 2. running max before each cell and the list of visible cells
        //    (warp p scans part p)
        const int warp = tid >> 5, lane = tid & 31;
        if (warp < parts) {
            const int p = warp;
            const int per = CH / 32;
            float local[8];
            float lmax = NEG_INF;
            int lcount = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                if (k < per) {
                    local[k] = lmax;
                    const int j = p * CH + lane * per + k;
                    if (flag[j]) {
                        lmax = fmaxf(lmax, score[j]);
                        lcount++;
                    }
                }
            }
            float incl = lmax;
            int cincl = lcount;
            for (int o = 1; o < 32; o <<= 1) {
                const float v = __shfl_up_sync(FULL_MASK, incl, o);
                const int c = __shfl_up_sync(FULL_MASK, cincl, o);
                if (lane >= o) {
                    incl = fmaxf(incl, v);
                    cincl += c;
                }
            }
            float excl = __shfl_up_sync(FULL_MASK, incl, 1);
            if (lane == 0) excl = NEG_INF;
            const float before = fmaxf(run_m, excl);
            int at = cincl - lcount;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                if (k < per) {
                    const int j = lane * per + k;
                    mprev[p * CH + j] = fmaxf(before, local[k]);
                    if (flag[p * CH + j]) {
                        cpos[p * CH + j] = (u16)at;
                        cidx[p * CH + at] = (u16)j;
                        at++;
                    }
                }
            }
            run_m = fmaxf(run_m, __shfl_sync(FULL_MASK, incl, 31));
            if (lane == 31) pcount[p] = cincl;
        }
        __syncthreads();
        // 3. online-softmax factors of the visible cells, in compact order
        for (int idx = tid; idx < 2 * CH; idx += nt) {
            if (!flag[idx]) continue;
            const float sc = score[idx], m = mprev[idx];
            const int at = (idx >= CH ? CH : 0) + cpos[idx];
            if (sc > m) {
                cms[at] = glibc_expf(m - sc);
                cvs[at] = 1.0f;
            } else {
                cms[at] = 1.0f;
                cvs[at] = glibc_expf(sc - m);
            }
        }
        cp_async_wait_all();
        __syncthreads();
        // 4. the sequential accumulation over the visible cells, one thread
        //    per (part, dimension). A new maximum scales the accumulator
        //    (ms == 1 otherwise, and scaling by 1 changes no bit). New
        //    maxima are rare: a group of 8 cells without one (the same for
        //    every thread of the part) skips the scaling, which would
        //    otherwise lengthen the dependent chain of every cell.
        if (chain) {
            const int cnt = pcount[cp];
            const u16* ci = cidx + cp * CH;
            const float* pm = cms + cp * CH;
            const float* pv = cvs + cp * CH;
            const u8* vcol = vsh + ((size_t)cp * CH * D + cd) * esz_v;
            const size_t vstride = (size_t)D * esz_v;
            int k = 0;
            for (; k + 8 <= cnt; k += 8) {
                float ms[8], vs[8], vv[8];
                bool scaled = false;
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    ms[u] = pm[k + u];
                    vs[u] = pv[k + u];
                    vv[u] = kv_at<V16>(vcol + ci[k + u] * vstride, 0);
                    scaled |= ms[u] != 1.0f;
                }
                if (scaled) {
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        if (ms[u] != 1.0f) acc = V16 ? round16(acc * ms[u]) : acc * ms[u];
                        acc = V16 ? round16(__fmaf_rn(vv[u], vs[u], acc)) : __fmaf_rn(vs[u], vv[u], acc);
                        if (cd == 0) ssum = __fmaf_rn(ssum, ms[u], vs[u]);
                    }
                } else {
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        acc = V16 ? round16(__fmaf_rn(vv[u], vs[u], acc)) : __fmaf_rn(vs[u], vv[u], acc);
                        if (cd == 0) ssum = __fadd_rn(ssum, vs[u]);  // fma(ssum, 1, vs)
                    }
                }
            }
            for (; k < cnt; k++) {
                const float ms = pm[k], vs = pv[k];
                const float vv = kv_at<V16>(vcol + ci[k] * vstride, 0);
                if (ms != 1.0f) acc = V16 ? round16(acc * ms) : acc * ms;
                acc = V16 ? round16(__fmaf_rn(vv, vs, acc)) : __fmaf_rn(vs, vv, acc);
                if (cd == 0) ssum = __fmaf_rn(ssum, ms, vs);
            }
        }
        __syncthreads();
    }
    // Results: the running max of each part lives in warp p.
    if ((tid & 31) == 0 && (tid >> 5) < parts) part_ms[tid >> 5] = run_m;
    if (chain) {
        part_acc[cp * D + cd] = acc;
        if (cd == 0) part_ms[2 + cp] = ssum;
    }
    __syncthreads();
    float* orow = OUTF < 0 ? (float*)out + (size_t)t * a.out_stride + (size_t)h * D : qs;
    for (int d = tid; d < D; d += nt) {
        float o, s;
        if (parts == 1) {
            o = part_acc[d];
            s = part_ms[2];
        } else {
            float m = NEG_INF;
            o = 0.0f;
            s = 0.0f;
            for (int p = 0; p < 2; p++) {
                if (part_ms[2 + p] == 0.0f) continue;
                const float pm = part_ms[p];
                const float m_new = fmaxf(m, pm);
                const float so = glibc_expf(m - m_new), sn = glibc_expf(pm - m_new);
                o = __fmaf_rn(o, so, part_acc[p * D + d] * sn);
                s = __fmaf_rn(s, so, part_ms[2 + p] * sn);
                m = m_new;
            }
        }
        const float inv = s == 0.0f ? 0.0f : 1.0f / s;
        orow[d] = o * inv;
    }
    if (OUTF >= 0) {
        // The head's values (in `qs`, free once the scores are done) as
        // whole 32-element blocks: head_dim is a multiple of 32.
        __syncthreads();
        const int bytes = OUTF == 1 ? 36 : 34, blocks = D / 32;
        u8* orow_q = (u8*)out + ((size_t)t * (a.out_stride / 32) + (size_t)h * blocks) * bytes;
        for (int b = tid; b < blocks; b += nt) quant_q8_thread<OUTF>(qs + 32 * b, orow_q + b * bytes);
    }
}

#define ATTN_CHUNK_ENTRY(NAME, K16, V16, OUTF)                                                 \
    extern "C" __global__ void __launch_bounds__(512)                                          \
        NAME(const float* q, const u8* k, const u8* v, void* out, AttnArgs a,                  \
             const u32* step) {                                                                \
        pdl_sync();                                                                            \
        attn_chunk_body<K16, V16, OUTF>(q, k, v, out, a, step);                                \
    }
ATTN_CHUNK_ENTRY(attn_chunk_f16, true, true, -1)
ATTN_CHUNK_ENTRY(attn_chunk_f32, false, false, -1)
ATTN_CHUNK_ENTRY(attn_chunk_f16_q8_0, true, true, 0)
ATTN_CHUNK_ENTRY(attn_chunk_f32_q8_0, false, false, 0)
ATTN_CHUNK_ENTRY(attn_chunk_f16_q8_1, true, true, 1)
ATTN_CHUNK_ENTRY(attn_chunk_f32_q8_1, false, false, 1)

// ---- tiled (64 or more query rows per ubatch) -----------------------------------------
// 16 query rows of one head per block, two per warp; keys and values in
// tiles of 64 (llama.cpp's GGML_FA_TILE_KV), copied asynchronously, the next
// tile while the current one is used when two buffers fit.

#define TILE 64
#define TILED_WARPS 8
#define TILED_ROWS 16

template <bool K16, bool V16>
DEV void attn_tiled_body(const float* q, const u8* kc, const u8* vc, float* out, AttnArgs a,
                         const u32* step) {
    extern __shared__ __align__(16) u8 att_dyn[];
    const int D = a.head_dim;
    const int esz_k = K16 ? 2 : 4, esz_v = V16 ? 2 : 4;
    const int kpad = 16 / esz_k;                 // elements of padding per key row
    const int krow_bytes = (D + kpad) * esz_k;   // a multiple of 16
    const int tile_bytes = TILE * krow_bytes + TILE * D * esz_v;
    const int nbuf = (int)a.chunk;
    float* qsh = (float*)att_dyn;                // [16][D]
    float* psh = qsh + TILED_ROWS * D;           // [16][64]
    u8* tiles = (u8*)(psh + TILED_ROWS * TILE);  // nbuf x (keys [64][D+pad], values [64][D])
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.x;
    const int row0 = a.row_offset + blockIdx.y * TILED_ROWS;
    const int rows = min(TILED_ROWS, a.n - row0);
    const int kvh = h / (a.heads / a.kv_heads);
    const u32 qpos = step ? step[0] : a.q_position;
    const u32 kv_rows = step ? step[1] : a.kv_rows;
    const u32 end = qpos + (u32)a.n;
    const u32 cells = a.ring != NONE_U32 ? min(a.ring, kv_rows) : min(end, kv_rows);
    const size_t kvoff = (size_t)kvh * D;
    for (int idx = tid; idx < TILED_ROWS * D; idx += blockDim.x) {
        const int i = idx / D, d = idx % D;
        qsh[idx] = i < rows ? q[(size_t)(row0 + i) * a.q_stride + (size_t)h * D + d] : 0.0f;
    }
    const u32 first_pos = qpos + row0, last_pos = qpos + row0 + rows - 1;
    // Does the block need tile `ts`? (Skipping a tile no row sees changes
    // nothing: every row would find only masked scores there.)
    auto needed = [&](u32 ts) -> bool {
        if (a.ring != NONE_U32) return true;
        const u32 tlen = min((u32)TILE, cells - ts);
        const bool newest = ts <= last_pos;
        const bool oldest = a.window == NONE_U32 || ts + tlen - 1 + a.window > first_pos;
        return newest && oldest;
    };
    auto next_tile = [&](u32 from) -> u32 {
        u32 ts = from;
        while (ts < cells && !needed(ts)) ts += TILE;
        return ts;
    };
    auto issue = [&](u32 ts, int buf) {
        u8* kt = tiles + (size_t)buf * tile_bytes;
        u8* vt = kt + TILE * krow_bytes;
        const u32 tlen = min((u32)TILE, cells - ts);
        const int kp = D * esz_k / 16, vp = D * esz_v / 16;
        for (int idx = tid; idx < (int)tlen * (kp + vp); idx += blockDim.x) {
            const int j = idx / (kp + vp), piece = idx % (kp + vp);
            const size_t g = (size_t)(ts + j) * a.kv_stride + kvoff;
            if (piece < kp)
                cp_async16(kt + (size_t)j * krow_bytes + piece * 16, kc + g * esz_k + piece * 16);
            else
                cp_async16(vt + (size_t)j * D * esz_v + (piece - kp) * 16,
                           vc + g * esz_v + (piece - kp) * 16);
        }
        cp_async_commit();
    };
    const int dq = D / 32;  // dimensions per lane (D is a multiple of 32)
    float acc[2][8], m[2], ssum[2];
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        m[rr] = NEG_INF;
        ssum[rr] = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) acc[rr][k] = 0.0f;
    }
    u32 ts = next_tile(0);
    int buf = 0;
    if (ts < cells) issue(ts, 0);
    while (ts < cells) {
        const u32 tlen = min((u32)TILE, cells - ts);
        const u32 nts = next_tile(ts + TILE);
        if (nbuf > 1 && nts < cells) {
            issue(nts, buf ^ 1);
            cp_async_wait_one_pending();
        } else {
            cp_async_wait_all();
        }
        __syncthreads();
        const u8* kt = tiles + (size_t)buf * tile_bytes;
        const u8* vt = kt + TILE * krow_bytes;
        // scores of the warp's two rows, keys lane and lane + 32: in-order
        // fma chains over d, from 0
        float s[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
        const u8* k0 = kt + (size_t)lane * krow_bytes;
        const u8* k1 = kt + (size_t)(lane + 32) * krow_bytes;
        const float* q0 = qsh + (2 * warp) * D;
        const float* q1 = q0 + D;
        for (int d0 = 0; d0 < D; d0 += 16) {
            float ka[16], kb[16];
            load16<K16>(k0, d0, ka);
            load16<K16>(k1, d0, kb);
#pragma unroll
            for (int e = 0; e < 16; e++) {
                const float qa = q0[d0 + e], qb = q1[d0 + e];
                s[0][0] = __fmaf_rn(qa, ka[e], s[0][0]);
                s[0][1] = __fmaf_rn(qa, kb[e], s[0][1]);
                s[1][0] = __fmaf_rn(qb, ka[e], s[1][0]);
                s[1][1] = __fmaf_rn(qb, kb[e], s[1][1]);
            }
        }
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int i = 2 * warp + rr;
            if (i >= rows) continue;  // uniform per warp
            const u32 pos = qpos + row0 + i;
            const bool seen0 = (u32)lane < tlen && attn_visible(a, ts + lane, pos, end);
            const bool seen1 = (u32)(lane + 32) < tlen && attn_visible(a, ts + lane + 32, pos, end);
            const float x0 = seen0 ? attn_scaled(a, s[rr][0]) : NEG_INF;
            const float x1 = seen1 ? attn_scaled(a, s[rr][1]) : NEG_INF;
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
#pragma unroll 4
            for (u32 j = 0; j < tlen; j++) {
                const float pj = psh[i * TILE + j];
                const u8* vrow = vt + (size_t)j * D * esz_v;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    if (k < dq) acc[rr][k] = __fmaf_rn(pj, kv_at<V16>(vrow, lane + 32 * k), acc[rr][k]);
            }
        }
        __syncthreads();
        ts = nts;
        buf ^= (nbuf > 1) ? 1 : 0;
        if (nbuf == 1 && ts < cells) issue(ts, 0);
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int i = 2 * warp + rr;
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
        pdl_sync();                                                                            \
        attn_tiled_body<K16, V16>(q, k, v, out, a, step);                                      \
    }
ATTN_TILED_ENTRY(attn_tiled_f16, true, true)
ATTN_TILED_ENTRY(attn_tiled_f32, false, false)
