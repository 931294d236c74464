// One-pass decode attention: the one-chunk kernel's arithmetic, bit for bit,
// in fewer and shorter phases, for the common decode case (one query row,
// an f16 cache, head_dim 64/128/256, every visible cell in one pass and
// one part). The `attn_chunk_*` entries below take it when the step's
// extent allows and the general body (attention.cu) otherwise, so a
// captured graph replays either way as the context grows.
//
// Why it is faster (H200 phase clocks of the general body at 64 cells:
// ~12k cycles, of which the value copy loop, the block-wide scan and the
// uncoalesced key loads are ~6k):
// - the key and value rows of the cells earlier steps wrote are copied
//   into shared memory *before* the wait on the kernel before, so their
//   latency hides behind that kernel's tail; only the query and the cell
//   this step wrote are read after it;
// - the visible cells are listed (in order) before the wait too: they
//   depend on positions only;
// - keys are staged with coalesced copies (16-byte pieces swizzled by row,
//   so each score thread's reads are free of bank conflicts);
// - each thread scores one cell and, after one barrier for the warps'
//   maxima, forms that cell's factors (a shuffle scan in registers, no
//   second pass over the scores), and the chain loads the next 8 cells'
//   factors and values while it works on the current 8 (glibc_expf's
//   table is copied into shared memory before the wait too);
// - each chain warp holds one 32-value block of the output, so it
//   quantizes its block from registers.

// True when the one-pass path computes exactly what attn_chunk_body does:
// one query row, one part (the padded view below 512 cells) and one pass.
// `grid_y` and `threads`: the launch's (attn_decode_fits: this one's).
DEV bool attn_decode_fits_shape(const AttnArgs& a, u32 qpos, u32 kv_rows, u32 grid_y,
                                u32 threads) {
    if (a.n != 1 || grid_y != 1) return false;
    if (a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256) return false;
    const AttnExtent e = attn_extent(a, qpos, kv_rows);
    return e.cells <= a.chunk && a.chunk <= threads && e.n_kv < 512u;
}
DEV bool attn_decode_fits(const AttnArgs& a, u32 qpos, u32 kv_rows) {
    return attn_decode_fits_shape(a, qpos, kv_rows, gridDim.y, blockDim.x);
}

// ggml's vec_dot_f16 over a staged key row (head_dim a multiple of 64,
// 16-byte piece p of the row at p ^ sw), as attn_dot<true> computes it.
DEV float attn_dot_staged(const u8* krow, int sw, const float* q, int d) {
    return ggml_dot_body(
        [&](int s, int j, float* kv) {
            const int p = s / 8 + 2 * j;
            unpack16_f16(*(const uint4*)(krow + (p ^ sw) * 16),
                         *(const uint4*)(krow + ((p + 1) ^ sw) * 16), kv);
        },
        q, d);
}

// Eight cells of the chain: factors, this thread's value of each (f16
// bits, widened where the chain uses them, so that no instruction before
// the current group's chain waits on the next group's loads), and which
// cells bring a new maximum (ms != 1).
struct ChainGroup {
    float ms[8], vs[8];
    u32 vv[8];
    u32 scaled;
};

// DENSE: every cell of the pass is visible, so compact index = cell.
template <bool DENSE>
DEV ChainGroup chain_group(const float2* f, const u16* ci, const u32* gmask, const u16* vcol,
                           int k, int D) {
    ChainGroup g;
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const float2 p = f[k + u];
        g.ms[u] = p.x;
        g.vs[u] = p.y;
        g.vv[u] = vcol[(DENSE ? k + u : ci[k + u]) * D];
    }
    g.scaled = (gmask[k >> 5] >> (k & 24)) & 0xffu;
    return g;
}

// The in-order accumulation of one output dimension over `cnt` cells,
// re-rounded to f16 after every cell (lane 0 also keeps the sum of the
// factors). Groups of 8 cells, two in flight: a group's loads go out
// right after the chain used its registers, and land while the other
// group runs. A new maximum scales the accumulator (ms == 1 otherwise,
// and scaling by 1 changes no bit); a group without one (the same for
// every thread of the warp) skips the scaling.
template <bool DENSE>
DEV void attn_chain(const float2* f, const u16* ci, const u32* gmask, const u16* vcol, int D,
                    int cnt, int lane, float& acc, float& ssum) {
    auto run = [&](const ChainGroup& g) {
        if (g.scaled) {
#pragma unroll
            for (int u = 0; u < 8; u++) {
                if (g.ms[u] != 1.0f) acc = round16(acc * g.ms[u]);
                acc = round16(__fmaf_rn(h2f((u16)g.vv[u]), g.vs[u], acc));
                if (lane == 0) ssum = __fmaf_rn(ssum, g.ms[u], g.vs[u]);
            }
        } else {
#pragma unroll
            for (int u = 0; u < 8; u++) {
                acc = round16(__fmaf_rn(h2f((u16)g.vv[u]), g.vs[u], acc));
                if (lane == 0) ssum = __fadd_rn(ssum, g.vs[u]);  // fma(ssum, 1, vs)
            }
        }
    };
    const int groups = cnt / 8;
    ChainGroup ga, gb;
    if (groups > 0) ga = chain_group<DENSE>(f, ci, gmask, vcol, 0, D);
    if (groups > 1) gb = chain_group<DENSE>(f, ci, gmask, vcol, 8, D);
    for (int gi = 0; gi < groups; gi += 2) {
        run(ga);
        if (gi + 2 < groups) ga = chain_group<DENSE>(f, ci, gmask, vcol, 8 * (gi + 2), D);
        if (gi + 1 < groups) {
            run(gb);
            if (gi + 3 < groups) gb = chain_group<DENSE>(f, ci, gmask, vcol, 8 * (gi + 3), D);
        }
    }
    for (int k = 8 * groups; k < cnt; k++) {
        const float2 p = f[k];
        const float ms = p.x, vs = p.y, vv = h2f(vcol[(DENSE ? k : ci[k]) * D]);
        if (ms != 1.0f) acc = round16(acc * ms);
        acc = round16(__fmaf_rn(vv, vs, acc));
        if (lane == 0) ssum = __fmaf_rn(ssum, ms, vs);
    }
}

// The wait on the kernels before: the plain entries' (proj_attn.cu's
// entries pass one that also computes the query, key and value rows).
// `filled()`: the wait also put the query (rounded to f16) into `qs` and
// the fresh cell's key and value rows into `ksh` / `vsh`.
struct PdlWait {
    __device__ __forceinline__ void operator()() const { pdl_sync(); }
    __device__ __forceinline__ bool filled() const { return false; }
};

template <int OUTF, class Wait = PdlWait>
DEV void attn_decode_body(const float* q, const u8* kc, const u8* vc, void* out,
                          const AttnArgs& a, u32 qpos, u32 kv_rows, const Wait& wait = Wait()) {
    extern __shared__ __align__(16) u8 att_dyn[];
    const int D = a.head_dim, CH = (int)a.chunk, W = D / 32;  // W: chain warps
    u8* ksh = att_dyn;                                          // [CH][D] f16, swizzled
    u16* vsh = (u16*)(ksh + (size_t)CH * D * 2);                // [CH][D] f16
    float* qs = (float*)(vsh + (size_t)CH * D);                 // [D]
    u64* etab = (u64*)(qs + D);                                 // [32] glibc_expf's table
    float* wmax = (float*)(etab + 32);                          // [CH]: the warps' maxima
    float2* fac = (float2*)(wmax + CH);                         // [CH] factors (ms, vs)
    u16* cidx = (u16*)(fac + CH);                               // [CH] visible cells
    int* pcount = (int*)(cidx + ((CH + 1) & ~1));               // their count
    u32* gmask = (u32*)(pcount + 1);                            // [CH / 32] ms != 1
    const int tid = threadIdx.x, nt = blockDim.x, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.x, t = a.row_offset;
    const int kvh = h / (a.heads / a.kv_heads);
    // attn_extent's end and cells for one row, recomputed here: taking the
    // entry's extent instead re-allocates the whole body's registers, a
    // change not yet measured on the GPU.
    const u32 end = qpos + 1u, pos = qpos;
    const u32 cells = a.ring != NONE_U32 ? min(a.ring, kv_rows) : min(end, kv_rows);
    // The slot this step wrote (read only after the wait).
    const u32 fresh = a.ring != NONE_U32 ? qpos % a.ring : qpos;
    const size_t kvoff = (size_t)kvh * D;
    const int pieces = D / 8, lp = D == 64 ? 3 : D == 128 ? 4 : 5;  // 16-byte pieces per row
    auto copy_piece = [&](u32 c, int p) {
        const size_t src = ((size_t)c * a.kv_stride + kvoff) * 2 + (size_t)p * 16;
        cp_async16(ksh + (size_t)c * D * 2 + ((p ^ (int)(c & 7)) * 16), kc + src);
        cp_async16((u8*)vsh + (size_t)c * D * 2 + p * 16, vc + src);
    };
    // 1. Before the wait: the rows of the visible cells earlier steps wrote,
    //    and the list of visible cells in order (warp 0).
    for (u32 i = tid; i < (cells << lp); i += nt) {
        const u32 c = i >> lp;
        if (c != fresh && attn_visible(a, c, pos, end)) copy_piece(c, (int)(i & (pieces - 1)));
    }
    cp_async_commit();
    if (warp == 0) {
        const int per = CH / 32;
        bool vis[8];
        int lcount = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const u32 c = (u32)(lane * per + k);
            vis[k] = k < per && c < cells && attn_visible(a, c, pos, end);
            lcount += vis[k];
        }
        int cincl = lcount;
        for (int o = 1; o < 32; o <<= 1) {
            const int c = __shfl_up_sync(FULL_MASK, cincl, o);
            if (lane >= o) cincl += c;
        }
        int at = cincl - lcount;
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (vis[k]) cidx[at++] = (u16)(lane * per + k);
        if (lane == 31) *pcount = cincl;
    }
    if (tid < 32) etab[tid] = EXP2F_TAB[tid];
    wait();
    // 2. The query, and the rows of the cell this step wrote.
    if (!wait.filled()) {
        const float* qrow = q + (size_t)t * a.q_stride + (size_t)h * D;
        for (int d = tid; d < D; d += nt) qs[d] = round16(qrow[d]);
        if (tid < pieces && fresh < cells && attn_visible(a, fresh, pos, end)) copy_piece(fresh, tid);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    const int cnt = *pcount;
    // 3. Scores and factors: thread j scores cell j (compact order), each
    //    warp scans its scores for the running maximum with shuffles, the
    //    warps' maxima meet in shared memory after one barrier (a maximum is
    //    the same in any order), and thread j forms cell j's factors from
    //    the maximum before it (one expf per thread, all in parallel).
    {
        const int j = tid;  // blockDim.x >= a.chunk >= cnt (attn_decode_fits)
        float sc = NEG_INF;
        if (j < cnt) {
            const int c = cidx[j];
            sc = attn_scaled(a, attn_dot_staged(ksh + (size_t)c * D * 2, c & 7, qs, D));
        }
        float incl = sc;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float v = __shfl_up_sync(FULL_MASK, incl, o);
            if (lane >= o) incl = fmaxf(incl, v);
        }
        float m = __shfl_up_sync(FULL_MASK, incl, 1);
        if (lane == 0) m = NEG_INF;
        if (lane == 31) wmax[warp] = incl;
        __syncthreads();
        for (int w = 0; w < warp; w++) m = fmaxf(m, wmax[w]);
        float ms = 1.0f, vs = 1.0f;
        if (j < cnt) {
            if (sc > m) ms = glibc_expf_with(m - sc, etab);
            else vs = glibc_expf_with(sc - m, etab);
            fac[j] = make_float2(ms, vs);
        }
        const u32 scaled = __ballot_sync(FULL_MASK, ms != 1.0f);
        if (lane == 0 && warp < CH / 32) gmask[warp] = scaled;
    }
    __syncthreads();
    if (warp >= W) return;
    // 5. The in-order accumulation of dimension `tid` over the visible
    //    cells, one warp per 32 dimensions.
    const int cd = tid;
    float acc = 0.0f, ssum = 0.0f;
    if (cnt == (int)cells) attn_chain<true>(fac, cidx, gmask, vsh + cd, D, cnt, lane, acc, ssum);
    else attn_chain<false>(fac, cidx, gmask, vsh + cd, D, cnt, lane, acc, ssum);
    // 6. The output: dimension `tid` of the head; warp w holds block w.
    const float s = __shfl_sync(FULL_MASK, ssum, 0);
    const float inv = s == 0.0f ? 0.0f : 1.0f / s;
    const float o = acc * inv;
    if (OUTF < 0) {
        ((float*)out)[(size_t)t * a.out_stride + (size_t)h * D + cd] = o;
    } else {
        const int bytes = OUTF == 1 ? 36 : 34;
        u8* orow_q = (u8*)out + ((size_t)t * (a.out_stride / 32) + (size_t)h * W) * bytes;
        quant_q8_warp<OUTF>(o, orow_q + warp * bytes);
    }
}

// The one-chunk entries: the one-pass path when this step fits it.
#define ATTN_CHUNK_ENTRY(NAME, K16, V16, OUTF)                                                 \
    extern "C" __global__ void __launch_bounds__(512)                                          \
        NAME(const float* q, const u8* k, const u8* v, void* out, AttnArgs a,                  \
             const u32* step) {                                                                \
        if (K16 && V16) {                                                                      \
            const u32 qpos = step ? step[0] : a.q_position;                                    \
            const u32 kv_rows = step ? step[1] : a.kv_rows;                                    \
            if (attn_decode_fits(a, qpos, kv_rows)) {                                          \
                attn_decode_body<OUTF>(q, k, v, out, a, qpos, kv_rows); /* waits inside */     \
                return;                                                                        \
            }                                                                                  \
        }                                                                                      \
        attn_chunk_body<K16, V16, OUTF>(q, k, v, out, a, step); /* waits inside */             \
    }
ATTN_CHUNK_ENTRY(attn_chunk_f16, true, true, -1)
ATTN_CHUNK_ENTRY(attn_chunk_f32, false, false, -1)
ATTN_CHUNK_ENTRY(attn_chunk_f16_q8_0, true, true, 0)
ATTN_CHUNK_ENTRY(attn_chunk_f32_q8_0, false, false, 0)
ATTN_CHUNK_ENTRY(attn_chunk_f16_q8_1, true, true, 1)
ATTN_CHUNK_ENTRY(attn_chunk_f32_q8_1, false, false, 1)
