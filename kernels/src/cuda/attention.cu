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
//   chunk's keys in order. One query row whose visible cells fit one
//   pass of one part takes a leaner path with the same arithmetic
//   (attn_decode.cu).
// - tiled (64 or more query rows in the ubatch): `attn_tiled`. Per (block
//   of 16 query rows, head): keys and values in tiles of 64 through shared
//   memory (widened to f32 as the CPU does), each score an in-order fma
//   chain, ggml_v_expf probabilities, the f64 tile sums, f32 accumulators.
//
// Step scalars (read from device memory when `step` is not null, so a
// captured graph replays for the next token): step[0] = q_position,
// step[1] = rows of the node's cache view.

struct AttnArgs {
    int heads, kv_heads, head_dim, n;
    int q_stride, kv_stride, out_stride, row_offset;
    float scale, softcap;
    u32 window, ring, kv_capacity, q_position, kv_rows;
    u32 chunk;  // attn_chunk: cells per part per pass; attn_tiled: 1 = staged f16 tiles
    float softcap_scale;  // scale / softcap (the host's division; 0 without a cap)
};

DEV bool attn_visible(const AttnArgs& a, u32 slot, u32 pos, u32 end) {
    if (a.ring == NONE_U32) return slot <= pos && (a.window == NONE_U32 || pos - slot < a.window);
    if (!(slot < a.ring && slot < end)) return false;
    const u32 c = slot + (end - 1 - slot) / a.ring * a.ring;
    return c <= pos && (a.window == NONE_U32 || pos - c < a.window);
}

// A step's extent: the positions it ends at, the cells of the cache view
// it reads, and the padded view the CPU splits in two parts from 512 on.
struct AttnExtent {
    u32 end, cells, n_kv;
};
DEV AttnExtent attn_extent(const AttnArgs& a, u32 qpos, u32 kv_rows) {
    const u32 end = qpos + (u32)a.n;
    const u32 cells = a.ring != NONE_U32 ? min(a.ring, kv_rows) : min(end, kv_rows);
    const u32 capacity = a.kv_capacity ? a.kv_capacity : kv_rows;
    const u32 padded = max((end + 255u) / 256u, 1u) * 256u;
    return {end, cells, min(padded, capacity)};
}

// Score scale and soft cap (tanhf is CUDA's here: soft-capped scores are
// within a few ulp of the CPU's, not bit-exact).
DEV float attn_scaled(const AttnArgs& a, float s) {
    if (a.softcap != 0.0f) return a.softcap * tanhf(s * a.softcap_scale);
    return s * a.scale;
}

// Sixteen f16 values (two 16-byte pieces) widened.
DEV void unpack16_f16(const uint4 u0, const uint4 u1, float* out) {
    const u32 w[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
    for (int k = 0; k < 8; k++) {
        out[2 * k] = h2f((u16)(w[k] & 0xffffu));
        out[2 * k + 1] = h2f((u16)(w[k] >> 16));
    }
}

template <bool F16>
DEV void load16(const void* row, int i, float* out) {
    if (F16) {
        unpack16_f16(*(const uint4*)((const u16*)row + i), *(const uint4*)((const u16*)row + i + 8),
                     out);
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

// ggml's vec_dot_f16 / vec_dot_f32 (AVX-512) over the first `body` elements
// (a multiple of 64): four 16-lane fma accumulators per 64 elements,
// folded (0+2)+(1+3), reduced. load(s, j, kv) widens elements s + 16j ..
// s + 16j + 15 into kv.
template <class Load16>
DEV float ggml_dot_body(Load16 load, const float* q, int body) {
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    for (int s = 0; s < body; s += 64) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float kv[16];
            load(s, j, kv);
#pragma unroll
            for (int l = 0; l < 16; l++)
                acc[16 * j + l] = __fmaf_rn(kv[l], q[s + 16 * j + l], acc[16 * j + l]);
        }
    }
    float f[16];
#pragma unroll
    for (int l = 0; l < 16; l++) f[l] = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
    return reduce16_regs(f);
}

// The whole dot product: the body as above, the tail added in f64.
// `kreg`: the row's first 64 f16 values already loaded (8 x 16 bytes).
template <bool K16>
DEV float attn_dot(const void* krow, const float* q, int d, const uint4* kreg = 0) {
    double total = 0.0;
    const int body = d - d % 64;
    if (body > 0) {
        total = (double)ggml_dot_body(
            [&](int s, int j, float* kv) {
                if (K16 && kreg && s == 0) unpack16_f16(kreg[2 * j], kreg[2 * j + 1], kv);
                else load16<K16>(krow, s + 16 * j, kv);
            },
            q, body);
    }
    for (int i = body; i < d; i++) total += (double)(kv_at<K16>(krow, i) * q[i]);
    return __double2float_rn(total);
}

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
    // The step scalars are the host's, copied before the launch: read
    // before waiting on the kernels before this one.
    const u32 qpos = step ? step[0] : a.q_position;
    const u32 kv_rows = step ? step[1] : a.kv_rows;
    const AttnExtent e = attn_extent(a, qpos, kv_rows);
    const u32 end = e.end, pos = qpos + (u32)t, cells = e.cells, n_kv = e.n_kv;
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
    // The first pass's key and value rows asked of L2 (a hint: the rows
    // this step's kernels write may be among them), then the wait, then
    // the query (the first query row's blocks: the others share the rows).
    for (int idx = tid; blockIdx.y == 0 && idx < 2 * CH; idx += nt) {
        const int p = idx >= CH ? 1 : 0;
        const u32 c = lo_of(p) + (u32)(idx - p * CH);
        if (p < parts && c < hi_of(p)) {
            const size_t row = (size_t)c * a.kv_stride + kvoff;
            prefetch_l2(kc + row * esz_k, (size_t)D * esz_k, 0, 1);
            prefetch_l2(vc + row * esz_v, (size_t)D * esz_v, 0, 1);
        }
    }
    prefetch_expf_table(tid);
    pdl_sync();
    // A head of 64 f16 values: the key row of this thread's first cell is
    // loaded now, beside the query, not after it (the scores wait for both).
    const bool kpre = K16 && D == 64 && tid < CH;
    uint4 kreg[8];
    if (kpre) {
        const u32 c = lo0 + (u32)tid;
        if (c < hi0 && attn_visible(a, c, pos, end)) {
            const uint4* kr = (const uint4*)(kc + ((size_t)c * a.kv_stride + kvoff) * esz_k);
#pragma unroll
            for (int i = 0; i < 8; i++) kreg[i] = kr[i];
        }
    }
    const float* qrow = q + (size_t)t * a.q_stride + (size_t)h * D;
    for (int d = tid; d < D; d += nt) qs[d] = K16 ? round16(qrow[d]) : qrow[d];
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
                const bool pre = kpre && it == 0 && idx == tid;
                sc = attn_scaled(a, attn_dot<K16>(krow, qs, D, pre ? kreg : 0));
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
        for (int b = tid >> 5; b < blocks; b += nt >> 5)  // a warp per block
            quant_q8_warp<OUTF>(qs[32 * b + (tid & 31)], orow_q + b * bytes);
    }
}

// The attn_chunk_* entries are in attn_decode.cu (they pick the one-pass
// decode path when a step fits it).

// ---- tiled (64 or more query rows per ubatch) -----------------------------------------
// 16 query rows of one head per block of 128 threads (two per thread: one
// row per thread measured slower, 60.7 against 58.4 µs at 512 tokens, its
// extra instructions outweighing the shorter blocks). Keys and values come in tiles of 64 (llama.cpp's
// GGML_FA_TILE_KV): an f16 tile is copied asynchronously into a staging
// buffer while the block works on the previous one, then widened to f32
// (keys in padded rows). Thread (g, i) with g = tid % 16, i = tid / 16
// owns query rows 2i and 2i + 1: it scores keys g, g + 16, g + 32, g + 48 (in-order fma
// chains over d), forms their probabilities (a row's 64 live in one
// half-warp, so its max and ggml's 16-lane sums are shuffles), and
// accumulates output dimensions 4(g + 16m) .. +3 over the tile's keys in
// order. Blocks of the last rows (the most tiles) go first.

#define TILE 64
#define TILED_GROUPS 8  // half-warps per block
#define TILED_RPT 2      // query rows per thread

#define TILED_ROWS (TILED_RPT * TILED_GROUPS)
#define TILED_THREADS (16 * TILED_GROUPS)

// ggml's 16-lane sums (`reduce16`) of four chunks of 16 keys, lane g of a
// half-warp holding key g + 16c of chunk c in p[c]: the same pairwise
// additions as reduce16_lanes per chunk, shared out so that each level
// halves the values a lane carries (lane g ends with chunk g / 4), five
// shuffles and four broadcasts instead of twenty. Every lane gets all four.
DEV void chunk_sums16(const float* p, float* out, int tid) {
    const bool hi8 = tid & 8, hi4 = tid & 4;
    const float a0 = (hi8 ? p[2] : p[0]) + __shfl_xor_sync(FULL_MASK, hi8 ? p[0] : p[2], 8);
    const float a1 = (hi8 ? p[3] : p[1]) + __shfl_xor_sync(FULL_MASK, hi8 ? p[1] : p[3], 8);
    const float b = (hi4 ? a1 : a0) + __shfl_xor_sync(FULL_MASK, hi4 ? a0 : a1, 4);
    const float c = b + __shfl_xor_sync(FULL_MASK, b, 2);
    const float d = c + __shfl_xor_sync(FULL_MASK, c, 1);
#pragma unroll
    for (int k = 0; k < 4; k++) out[k] = __shfl_sync(FULL_MASK, d, (tid & 16) + 4 * k);
}

// A thread's output rows (probabilities at pp) over keys j .. j + N - 1:
// all loads first, then the fmas in key order.
template <int N, int MG>
DEV void tiled_pv(const float* pp, const float* const* vg, int D, u32 j, const bool* live,
                  float (&acc)[TILED_RPT][MG][4]) {
    float pj[N][TILED_RPT];
    float4 v4[N][MG];
#pragma unroll
    for (int u = 0; u < N; u++) {
#pragma unroll
        for (int r = 0; r < TILED_RPT; r++) pj[u][r] = pp[(j + u) * TILED_ROWS + r];
#pragma unroll
        for (int k = 0; k < MG; k++) v4[u][k] = *(const float4*)(vg[k] + (j + u) * D);
    }
#pragma unroll
    for (int u = 0; u < N; u++) {
#pragma unroll
        for (int k = 0; k < MG; k++) {
            const float vv[4] = {v4[u][k].x, v4[u][k].y, v4[u][k].z, v4[u][k].w};
#pragma unroll
            for (int e = 0; e < 4; e++)
#pragma unroll
                for (int r = 0; r < TILED_RPT; r++)
                    if (live[r]) acc[r][k][e] = __fmaf_rn(pj[u][r], vv[e], acc[r][k][e]);
        }
    }
}

// MG: groups of four output dimensions per thread and row (head sizes up
// to 64 * MG).
template <bool F16, int MG>
DEV void attn_tiled_body(const float* q, const u8* kc, const u8* vc, float* out, AttnArgs a,
                         const u32* step) {
    extern __shared__ __align__(16) u8 att_dyn[];
    const int D = a.head_dim, KS = D + 4, esz = F16 ? 2 : 4;
    float* qsh = (float*)att_dyn;          // [16][D] queries
    float* psh = qsh + TILED_ROWS * D;     // [64][ROWS] probabilities, key-major
    float* ksh = psh + TILE * TILED_ROWS;  // [64][D + 4] keys (f32)
    float* vsh = ksh + TILE * KS;          // [64][D] values (f32)
    u8* stage = (u8*)(vsh + TILE * D);     // f16: [64][D] keys, [64][D] values, raw
    const int tid = threadIdx.x, g = tid & 15, row_t = (tid >> 4) * TILED_RPT;
    const int h = blockIdx.x;
    const int row0 = a.row_offset + (gridDim.y - 1 - blockIdx.y) * TILED_ROWS;
    const int rows = min(TILED_ROWS, a.n - row0);
    const int kvh = h / (a.heads / a.kv_heads);
    // The block's queries, in batches of 16 loads per thread in flight.
    for (int base = 0; base < TILED_ROWS * D; base += 16 * TILED_THREADS) {
        float qv[16];
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const int idx = base + tid + k * TILED_THREADS, i = idx / D, d = idx - i * D;
            qv[k] = i < rows ? q[(size_t)(row0 + i) * a.q_stride + (size_t)h * D + d] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const int idx = base + tid + k * TILED_THREADS;
            if (idx < TILED_ROWS * D) qsh[idx] = qv[k];
        }
    }
    const u32 qpos = step ? step[0] : a.q_position;
    const u32 kv_rows = step ? step[1] : a.kv_rows;
    const AttnExtent e = attn_extent(a, qpos, kv_rows);
    const u32 end = e.end, cells = e.cells;
    const size_t kvoff = (size_t)kvh * D;
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
    // Rows of tile `ts` as 16-byte pieces: f16 into the staging buffer,
    // f32 straight into the working rows. Thread tid takes pieces tid,
    // tid + 128, ... of the tile's keys (and the same of its values),
    // stepped without divisions.
    const int pieces = D * esz / 16;
    const int piece0 = tid % pieces, prow0 = tid / pieces;
    const int piece_step = TILED_THREADS % pieces, prow_step = TILED_THREADS / pieces;
    auto issue = [&](u32 ts) {
        const int tlen = (int)min((u32)TILE, cells - ts);
        for (int j = prow0, piece = piece0; j < tlen;) {
            const size_t gsrc = ((size_t)(ts + j) * a.kv_stride + kvoff) * esz + piece * 16;
            if (F16) {
                cp_async16(stage + ((size_t)j * D * 2 + piece * 16), kc + gsrc);
                cp_async16(stage + ((size_t)(TILE + j) * D * 2 + piece * 16), vc + gsrc);
            } else {
                cp_async16((u8*)(ksh + j * KS) + piece * 16, kc + gsrc);
                cp_async16((u8*)(vsh + j * D) + piece * 16, vc + gsrc);
            }
            j += prow_step;
            piece += piece_step;
            if (piece >= pieces) {
                piece -= pieces;
                j++;
            }
        }
        cp_async_commit();
    };
    // f16 rows -> f32 working rows, eight values per piece: key row j at
    // kb + j * rstride bytes, value row j at vb + j * rstride (the staging
    // buffer, or the cache itself); a thread's pieces in batches of 4, each
    // batch's loads before its stores.
    auto widen = [&](const u8* kb, const u8* vb, size_t rstride, int tlen) {
        for (int j = prow0, piece = piece0; j < tlen;) {
            uint4 u[2][4];
            int jj[4], cc[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                jj[k] = j < tlen ? j : -1;
                cc[k] = piece * 8;
                if (jj[k] >= 0) {
                    u[0][k] = *(const uint4*)(kb + (size_t)j * rstride + cc[k] * 2);
                    u[1][k] = *(const uint4*)(vb + (size_t)j * rstride + cc[k] * 2);
                }
                j += prow_step;
                piece += piece_step;
                if (piece >= pieces) {
                    piece -= pieces;
                    j++;
                }
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if (jj[k] < 0) continue;
#pragma unroll
                for (int v = 0; v < 2; v++) {
                    float* dst = v ? vsh + jj[k] * D + cc[k] : ksh + jj[k] * KS + cc[k];
                    const u32 w[4] = {u[v][k].x, u[v][k].y, u[v][k].z, u[v][k].w};
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        *(float4*)(dst + 4 * e) = make_float4(
                            h2f((u16)(w[2 * e] & 0xffffu)), h2f((u16)(w[2 * e] >> 16)),
                            h2f((u16)(w[2 * e + 1] & 0xffffu)), h2f((u16)(w[2 * e + 1] >> 16)));
                }
            }
        }
    };
    const int groups = D / 4;
    float acc[TILED_RPT][MG][4], m[TILED_RPT], ssum[TILED_RPT];
#pragma unroll
    for (int r = 0; r < TILED_RPT; r++) {
        m[r] = NEG_INF;
        ssum[r] = 0.0f;
#pragma unroll
        for (int k = 0; k < MG; k++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[r][k][e] = 0.0f;
    }
    const bool staged = F16 && a.chunk == 1;
    u32 ts = next_tile(0);
    if (staged && ts < cells) issue(ts);
    while (ts < cells) {
        const u32 tlen = min((u32)TILE, cells - ts);
        const u32 nts = next_tile(ts + TILE);
        if (staged) {
            cp_async_wait_all();
            __syncthreads();  // the stage is complete, the last tile's readers are done
            widen(stage, stage + (size_t)TILE * D * 2, (size_t)D * 2, (int)tlen);
            __syncthreads();
            if (nts < cells) issue(nts);  // lands while this tile is worked on
        } else if (F16) {
            __syncthreads();  // the last tile's readers are done
            const size_t first = ((size_t)ts * a.kv_stride + kvoff) * 2;
            widen(kc + first, vc + first, (size_t)a.kv_stride * 2, (int)tlen);
            __syncthreads();
        } else {
            __syncthreads();
            issue(ts);
            cp_async_wait_all();
            __syncthreads();
        }
        // 1. scores of the thread's rows against keys g + 16c
        float s[TILED_RPT][4];
#pragma unroll
        for (int r = 0; r < TILED_RPT; r++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[r][c] = 0.0f;
        const float* q0 = qsh + row_t * D;
        for (int d = 0; d < D; d += 8) {  // D is a multiple of 8
            float4 qa[TILED_RPT][2], k4[2][4];
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++) {
#pragma unroll
                for (int r = 0; r < TILED_RPT; r++) qa[r][h2] = *(const float4*)(q0 + r * D + d + 4 * h2);
#pragma unroll
                for (int c = 0; c < 4; c++)
                    k4[h2][c] = *(const float4*)(ksh + (g + 16 * c) * KS + d + 4 * h2);
            }
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++) {
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const float4 kk = k4[h2][c];
#pragma unroll
                    for (int r = 0; r < TILED_RPT; r++) {
                        s[r][c] = __fmaf_rn(qa[r][h2].x, kk.x, s[r][c]);
                        s[r][c] = __fmaf_rn(qa[r][h2].y, kk.y, s[r][c]);
                        s[r][c] = __fmaf_rn(qa[r][h2].z, kk.z, s[r][c]);
                        s[r][c] = __fmaf_rn(qa[r][h2].w, kk.w, s[r][c]);
                    }
                }
            }
        }
        // 2. per row: mask, tile max, rescale, probabilities and their sum
        //    (all 16 threads of the half-warp hold the row's state)
        bool live[TILED_RPT];
#pragma unroll
        for (int r = 0; r < TILED_RPT; r++) {
            const int i = row_t + r;
            const u32 pos = qpos + row0 + i;
            float x[4];
            float tmax = NEG_INF;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const u32 j = (u32)(g + 16 * c);
                const bool seen = i < rows && j < tlen && attn_visible(a, ts + j, pos, end);
                x[c] = seen ? attn_scaled(a, s[r][c]) : NEG_INF;
                tmax = fmaxf(tmax, x[c]);
            }
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(FULL_MASK, tmax, o));
            live[r] = tmax != NEG_INF;
            const float m_new = live[r] ? fmaxf(m[r], tmax) : m[r];
            if (m_new > m[r]) {
                const float ms = glibc_expf(m[r] - m_new);
#pragma unroll
                for (int k = 0; k < MG; k++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[r][k][e] = acc[r][k][e] * ms;
                ssum[r] = ssum[r] * ms;
            }
            m[r] = m_new;
            float p[4], chunk[4];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                p[c] = live[r] ? ggml_v_expf(x[c] - m_new) : 0.0f;
                psh[(g + 16 * c) * TILED_ROWS + i] = p[c];
            }
            chunk_sums16(p, chunk, tid);
            double sum = 0.0;
#pragma unroll
            for (int c = 0; c < 4; c++) sum += (double)chunk[c];
            if (live[r]) ssum[r] = __double2float_rn((double)ssum[r] + sum);
        }
        __syncwarp();
        // 3. the output rows over the tile's keys, in order: eight keys'
        //    loads, then their fmas (a thread's groups past the head size
        //    read a valid group and are never written out)
        const float* pp = psh + row_t;
        const float* vg[MG];
#pragma unroll
        for (int k = 0; k < MG; k++) vg[k] = vsh + 4 * min(g + 16 * k, groups - 1);
        u32 j = 0;
        for (; j + 8 <= tlen; j += 8) tiled_pv<8, MG>(pp, vg, D, j, live, acc);
        for (; j < tlen; j++) tiled_pv<1, MG>(pp, vg, D, j, live, acc);
        ts = nts;
    }
#pragma unroll
    for (int r = 0; r < TILED_RPT; r++) {
        const int i = row_t + r;
        if (i >= rows) continue;
        const float inv = ssum[r] == 0.0f ? 0.0f : 1.0f / ssum[r];
        float* orow = out + (size_t)(row0 + i) * a.out_stride + (size_t)h * D;
#pragma unroll
        for (int k = 0; k < MG; k++)
            if (g + 16 * k < groups)
                *(float4*)(orow + 4 * (g + 16 * k)) =
                    make_float4(acc[r][k][0] * inv, acc[r][k][1] * inv, acc[r][k][2] * inv,
                                acc[r][k][3] * inv);
    }
}

#define ATTN_TILED_ENTRY(NAME, F16, MG)                                                        \
    extern "C" __global__ void __launch_bounds__(TILED_THREADS)                                \
        NAME(const float* q, const u8* k, const u8* v, float* out, AttnArgs a,                 \
             const u32* step) {                                                                \
        prefetch_expf_table(threadIdx.x);                                                      \
        pdl_sync();                                                                            \
        attn_tiled_body<F16, MG>(q, k, v, out, a, step);                                       \
    }
ATTN_TILED_ENTRY(attn_tiled_f16_g1, true, 1)
ATTN_TILED_ENTRY(attn_tiled_f16_g2, true, 2)
ATTN_TILED_ENTRY(attn_tiled_f16_g4, true, 4)
ATTN_TILED_ENTRY(attn_tiled_f32_g1, false, 1)
ATTN_TILED_ENTRY(attn_tiled_f32_g2, false, 2)
ATTN_TILED_ENTRY(attn_tiled_f32_g4, false, 4)
