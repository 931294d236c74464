// Fast decode attention (numerics `fast`): split-K over the cached cells
// (flash-decoding). Up to a few query rows (a decode step), any cache
// length, f16 or f32 keys and values, windows, rings and soft caps.
//
// Grid (blocks of a kv head, splits, query rows). A block serves HG query
// heads of one kv head, so each key and value row it reads feeds all of
// them. Its warps split into groups of L lanes per cell (L = D/8 rounded up
// to a power of two, each lane holding eight consecutive dimensions: one
// 16-byte load of an f16 row, two of an f32 one); a group walks four cells
// per pass with an online softmax in base 2 (scores pre-scaled by
// log2(e)), f32 accumulators. With f16 rows a group loads the next pass's
// rows before it computes the current one, so a split of several passes
// waits about one memory latency, not one per pass; before its wait on the
// kernel before (pdl_sync) the block asks the L2 for its split's rows.
//
// The block's groups are merged in shared memory by log-sum-exp; with one
// split that is the output, otherwise the block writes its values and
// (max, sum) to the node's scratch, and the merge runs as a tree of at
// most two levels of FA_GROUP: the last split of a group of FA_GROUP
// consecutive splits to arrive (a counter per group in the scratch) merges
// the group, and with more than one group writes the group's state to the
// scratch, where the last group to arrive (one more counter) merges the
// groups and writes the row. Each merge: a warp per head turns the
// entries' maxima into weights (a lane per entry), then the block sums the
// entries' values with independent 16-byte loads. Every counter is reset
// by the block that read it last, for the next launch.
//
// The split of the cells depends only on the step's extent and the grid,
// which the host fixes from the recorded view: a captured graph replays for
// every step and a result never depends on timing.
//
// Float order: each dot product is eight in-lane fmas then a butterfly over
// the group; each cell's weight is exp2f of the score less the running max;
// the block's groups, a tree group's splits and the groups are each summed
// in index order with exp2f weights. Bound against an exact softmax: a few
// ulp of f32 per dot product and per weight, accumulated over the cells in
// f32 (relative error ~1e-6 on typical rows; the tests allow 1e-4 of
// |value| + 1e-2).

#define FA_THREADS 128
#define FA_WARPS (FA_THREADS / 32)
#define FA_UNROLL 4
#define FA_LOG2E 1.4426950408889634f
#define FA_GROUP 16                           // entries of one merge (a lane each)
#define FA_MAX_SPLITS (FA_GROUP * FA_GROUP)  // the grid's y extent at most

// The one-pass exact path of proj_attn.cu's block 0 for this step (its
// launch: one block row, 512 threads): a split kernel launched after that
// fused node then has nothing to do.
DEV bool attn_split_proj_attended(const AttnArgs& a, u32 qpos, u32 kv_rows) {
    return attn_decode_fits_shape(a, qpos, kv_rows, 1, 512);
}

DEV float split_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// Eight consecutive values of a row as loaded: one 16-byte word of f16,
// two of f32 (`hi` unused for f16).
struct SplitRaw {
    uint4 lo, hi;
};

template <bool K16>
DEV void split_fetch(const u8* row, SplitRaw& r) {
    r.lo = *(const uint4*)row;
    if (!K16) r.hi = *(const uint4*)(row + 16);
}

template <bool K16>
DEV void split_clear(SplitRaw& r) {
    r.lo = make_uint4(0u, 0u, 0u, 0u);
    if (!K16) r.hi = r.lo;
}

// The eight values widened to f32.
template <bool K16>
DEV void split_widen(const SplitRaw& r, float* out) {
    const u32 w[8] = {r.lo.x, r.lo.y, r.lo.z, r.lo.w, r.hi.x, r.hi.y, r.hi.z, r.hi.w};
    if (K16) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            out[2 * k] = h2f((u16)(w[k] & 0xffffu));
            out[2 * k + 1] = h2f((u16)(w[k] >> 16));
        }
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) out[k] = __uint_as_float(w[k]);
    }
}

// The cells a block walks and how far it goes.
struct SplitCells {
    u32 c1;         // end of the split's cells
    u32 pos, end;   // the row's position, the step's end (attn_visible)
    size_t col;     // byte offset of the lane's eight values in a row
    size_t row;     // bytes per cache row
    bool live;      // whether the lane holds dimensions
};

// Loads (or clears) the rows of cells base .. base + FA_UNROLL - 1 and
// says which of them the row attends.
template <bool K16>
DEV void split_fetch_pass(const u8* kc, const u8* vc, const AttnArgs& a, const SplitCells& sc,
                          u32 base, SplitRaw (&kr)[FA_UNROLL], SplitRaw (&vr)[FA_UNROLL],
                          bool (&ok)[FA_UNROLL]) {
#pragma unroll
    for (int u = 0; u < FA_UNROLL; u++) {
        const u32 c = base + u;
        ok[u] = c < sc.c1 && (a.ring == NONE_U32 || attn_visible(a, c, sc.pos, sc.end));
        if (ok[u] && sc.live) {
            split_fetch<K16>(kc + c * sc.row + sc.col, kr[u]);
            split_fetch<K16>(vc + c * sc.row + sc.col, vr[u]);
        } else {
            split_clear<K16>(kr[u]);
            split_clear<K16>(vr[u]);
        }
    }
}

// One pass of a lane group over its FA_UNROLL cells: scores of the block's
// nh heads, then the online softmax update of (m, s, acc).
template <bool K16, int HG>
DEV void split_pass(const AttnArgs& a, int L, int nh, const float (&qr)[HG][8],
                    const SplitRaw (&kr)[FA_UNROLL], const SplitRaw (&vr)[FA_UNROLL],
                    const bool (&ok)[FA_UNROLL], float (&m)[HG], float (&s)[HG],
                    float (&acc)[HG][8]) {
    float p[FA_UNROLL][HG];
#pragma unroll
    for (int u = 0; u < FA_UNROLL; u++) {
        float kf[8];
        split_widen<K16>(kr[u], kf);
#pragma unroll
        for (int j = 0; j < HG; j++) {
            p[u][j] = NEG_INF;
            if (j >= nh) continue;  // the block's part of a group may hold fewer heads
            float d = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) d = __fmaf_rn(qr[j][k], kf[k], d);
            for (int o = L >> 1; o > 0; o >>= 1) d += __shfl_xor_sync(FULL_MASK, d, o);
            if (a.softcap != 0.0f) d = a.softcap * tanhf(d * a.softcap_scale) * FA_LOG2E;
            if (ok[u]) p[u][j] = d;
        }
    }
    // Scores to weights (in place), the state rescaled to the new max.
#pragma unroll
    for (int j = 0; j < HG; j++) {
        float mx = m[j];
#pragma unroll
        for (int u = 0; u < FA_UNROLL; u++) mx = fmaxf(mx, p[u][j]);
        if (j >= nh || mx == NEG_INF) {
#pragma unroll
            for (int u = 0; u < FA_UNROLL; u++) p[u][j] = 0.0f;
            continue;
        }
        const float corr = exp2f(m[j] - mx);
        s[j] *= corr;
#pragma unroll
        for (int k = 0; k < 8; k++) acc[j][k] *= corr;
#pragma unroll
        for (int u = 0; u < FA_UNROLL; u++) {
            p[u][j] = exp2f(p[u][j] - mx);
            s[j] += p[u][j];
        }
        m[j] = mx;
    }
    // Each value row widened once for all heads (per value: cells in order).
#pragma unroll
    for (int u = 0; u < FA_UNROLL; u++) {
        float vf[8];
        split_widen<K16>(vr[u], vf);
#pragma unroll
        for (int j = 0; j < HG; j++) {
            if (j >= nh) continue;
#pragma unroll
            for (int k = 0; k < 8; k++) acc[j][k] = __fmaf_rn(p[u][j], vf[k], acc[j][k]);
        }
    }
}

// Asks the L2 for the key and value rows of cells [c0, c1) of kv head kvh,
// the block's threads sharing the lines (a hint: it may run before the
// wait on the kernel that writes this step's rows).
DEV void split_prefetch(const u8* kc, const u8* vc, u32 c0, u32 c1, size_t head_col,
                        size_t row_bytes, u32 head_bytes) {
    const u32 lines = (head_bytes + 127u) / 128u, per_cell = 2u * lines;
    const u32 n = (c1 - c0) * per_cell;
    for (u32 i = threadIdx.x; i < n; i += FA_THREADS) {
        const u32 c = c0 + i / per_cell, r = i % per_cell;
        const u8* p = (r < lines ? kc : vc) + c * row_bytes + head_col + (r % lines) * 128u;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
}

// Writes dimension d of query head h (the output row t); a quantized
// output needs the whole warp on one 32-value block (lane l on value l).
template <int OUTF>
DEV void split_store(void* out, const AttnArgs& a, int t, int h, int d, float o) {
    const int D = a.head_dim;
    if (OUTF < 0) {
        ((float*)out)[(size_t)t * a.out_stride + (size_t)h * D + d] = o;
    } else {
        const int bytes = OUTF == 1 ? 36 : 34;
        u8* blk = (u8*)out + ((size_t)t * (a.out_stride / 32) + ((size_t)h * D + d) / 32) * bytes;
        quant_q8_warp<OUTF>(o, blk);
    }
}

// Scratch states of one row and head block: entry i of head j has values
// vals[(j * stride + i) * D ..] and (max, sum) msum[j * stride + i].
struct SplitStates {
    float* vals;
    float2* msum;
    u32 stride;
};

// Merges entries [first, first + n) (n <= FA_GROUP) of the nh heads by
// log-sum-exp into shared memory: merged[j * D + d] the weighted values,
// returned (max, weighted sum) of head j in shared ms[j]. The block's
// threads all call it; it ends with the merged values visible to all.
DEV void split_merge(const SplitStates st, u32 first, u32 n, int nh, int D, float* wgt, float2* ms,
                     float* merged) {
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    if (w < nh) {
        float2 e = make_float2(NEG_INF, 0.0f);
        if ((u32)lane < n) e = __ldcg(st.msum + (size_t)w * st.stride + first + lane);
        const float M = warp_max(e.x);
        const float f = M == NEG_INF ? 0.0f : exp2f(e.x - M);
        const float sum = split_warp_sum(e.y * f);
        if (lane < FA_GROUP) wgt[w * FA_GROUP + lane] = f;
        if (lane == 0) ms[w] = make_float2(M, sum);
    }
    __syncthreads();
    const int quads = D / 4;
    for (int idx = tid; idx < nh * quads; idx += FA_THREADS) {
        const int j = idx / quads, d = (idx % quads) * 4;
        const float4* src = (const float4*)(st.vals + ((size_t)j * st.stride + first) * D + d);
        float4 x[FA_GROUP];
#pragma unroll
        for (int i = 0; i < FA_GROUP; i++)
            if ((u32)i < n) x[i] = __ldcg(src + (size_t)i * quads);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < FA_GROUP; i++) {
            if ((u32)i >= n) break;
            const float f = wgt[j * FA_GROUP + i];
            v.x = __fmaf_rn(x[i].x, f, v.x);
            v.y = __fmaf_rn(x[i].y, f, v.y);
            v.z = __fmaf_rn(x[i].z, f, v.z);
            v.w = __fmaf_rn(x[i].w, f, v.w);
        }
        *(float4*)(merged + j * D + d) = v;
    }
    __syncthreads();
}

// Counts this block's arrival at `counter` of `expected` blocks: true (for
// the whole block) when it is the last, which then resets the counter.
// The block's scratch writes are visible before it counts, the others'
// to it after.
DEV bool split_arrive(u32* counter, u32 expected, u32* flag) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const bool last = atomicAdd(counter, 1u) == expected - 1;
        if (last) *counter = 0u;
        *flag = last ? 1u : 0u;
    }
    __syncthreads();
    const bool last = *flag != 0;
    if (last) __threadfence();
    return last;
}

template <bool K16, int HG, int OUTF>
DEV void attn_split_body(const float* q, const u8* kc, const u8* vc, void* out, const AttnArgs a,
                         const u32* step, float* part, u32* count, u32 split_min, u32 skip_fits) {
    extern __shared__ __align__(16) u8 att_dyn[];
    const int D = a.head_dim;
    int L = 1;
    while (L * 8 < D) L <<= 1;
    const int C = 32 / L;  // cells a warp takes side by side
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int gi = lane / L, li = lane % L;
    const int group = a.heads / a.kv_heads;
    const int hblocks = (group + HG - 1) / HG;
    const int kvh = blockIdx.x / hblocks;
    const int h0 = kvh * group + (blockIdx.x % hblocks) * HG;
    const int nh = min(HG, (kvh + 1) * group - h0);
    const int t = a.row_offset + blockIdx.z;
    // The step scalars and the cells: nothing a kernel still running writes.
    const u32 qpos = step ? step[0] : a.q_position;
    const u32 kv_rows = step ? step[1] : a.kv_rows;
    const bool attended = skip_fits && attn_split_proj_attended(a, qpos, kv_rows);
    const AttnExtent e = attn_extent(a, qpos, kv_rows);
    const u32 pos = qpos + (u32)t;
    // The row's candidate cells: exact bounds without a ring (causal,
    // window), every cell of a ring (each checked below).
    u32 lo = 0, hi = e.cells;
    if (a.ring == NONE_U32) {
        hi = min(hi, pos + 1);
        if (a.window != NONE_U32 && pos + 1 > a.window) lo = pos + 1 - a.window;
    }
    const u32 span = hi > lo ? hi - lo : 0;
    const u32 S = gridDim.y;
    u32 per = max((span + S - 1) / S, split_min);
    per = (per + 15u) & ~15u;
    const u32 active = span ? (span + per - 1) / per : 1;
    const u32 sp = blockIdx.y;
    const u32 c0 = lo + sp * per, c1 = min(c0 + per, hi);
    const int esz = K16 ? 2 : 4;
    const size_t row_bytes = (size_t)a.kv_stride * esz;
    const size_t head_col = (size_t)kvh * D * esz;
    if (!attended && sp < active && c0 < c1)
        split_prefetch(kc, vc, c0, c1, head_col, row_bytes, (u32)(D * esz));
    pdl_sync();
    if (attended || sp >= active) return;

    // This lane's eight query values of each head, pre-scaled into the
    // base-2 domain when there is no soft cap.
    const bool live = li * 8 < D;
    const float qscale = a.softcap != 0.0f ? 1.0f : a.scale * FA_LOG2E;
    float qr[HG][8];
#pragma unroll
    for (int j = 0; j < HG; j++) {
        const bool has = live && j < nh;
        const float* qrow = q + (size_t)t * a.q_stride + (size_t)(h0 + j) * D + li * 8;
#pragma unroll
        for (int k = 0; k < 8; k++) qr[j][k] = has ? qrow[k] * qscale : 0.0f;
    }
    float m[HG], s[HG], acc[HG][8];
#pragma unroll
    for (int j = 0; j < HG; j++) {
        m[j] = NEG_INF;
        s[j] = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) acc[j][k] = 0.0f;
    }
    const SplitCells cells = {c1, pos, e.end, head_col + (size_t)li * 8 * esz, row_bytes, live};
    // Whole warps take the same passes (the butterflies need every lane).
    const u32 stride = FA_WARPS * C * FA_UNROLL;
    u32 wbase = c0 + (u32)(w * C * FA_UNROLL);
    const u32 lane_off = (u32)(gi * FA_UNROLL);
    SplitRaw kr[FA_UNROLL], vr[FA_UNROLL];
    bool ok[FA_UNROLL];
    if (wbase < c1) split_fetch_pass<K16>(kc, vc, a, cells, wbase + lane_off, kr, vr, ok);
    for (; wbase < c1; wbase += stride) {
        if (K16) {
            // The next pass's rows in flight while this one computes.
            SplitRaw kn[FA_UNROLL], vn[FA_UNROLL];
            bool okn[FA_UNROLL];
            split_fetch_pass<K16>(kc, vc, a, cells, wbase + stride + lane_off, kn, vn, okn);
            split_pass<K16, HG>(a, L, nh, qr, kr, vr, ok, m, s, acc);
#pragma unroll
            for (int u = 0; u < FA_UNROLL; u++) {
                kr[u] = kn[u];
                vr[u] = vn[u];
                ok[u] = okn[u];
            }
        } else {
            split_pass<K16, HG>(a, L, nh, qr, kr, vr, ok, m, s, acc);
            split_fetch_pass<K16>(kc, vc, a, cells, wbase + stride + lane_off, kr, vr, ok);
        }
    }

    // The block's lane groups merged: states [NS][HG] of (max, sum) and
    // [NS][HG][D] values, then each state's weight per head in st_f.
    const int NS = FA_WARPS * C;
    float* st_m = (float*)att_dyn;
    float* st_s = st_m + NS * HG;
    float* st_acc = st_s + NS * HG;
    u32* flag = (u32*)(st_acc + NS * HG * D);
    const int si = w * C + gi;
#pragma unroll
    for (int j = 0; j < HG; j++) {
        if (li == 0) {
            st_m[si * HG + j] = m[j];
            st_s[si * HG + j] = s[j];
        }
        if (live) {
#pragma unroll
            for (int k = 0; k < 8; k++) st_acc[(si * HG + j) * D + li * 8 + k] = acc[j][k];
        }
    }
    __syncthreads();
    // Each head's max over the states (in st_s's place, after its sum),
    // then each state's weight in place of its max.
    float* bm = (float*)(flag + 4);  // [HG] beside the flag
    if (tid < nh) {
        float M = NEG_INF;
        for (int i = 0; i < NS; i++) M = fmaxf(M, st_m[i * HG + tid]);
        bm[tid] = M;
    }
    __syncthreads();
    if (tid < NS * HG && tid % HG < nh) {
        const float M = bm[tid % HG];
        st_m[tid] = M == NEG_INF ? 0.0f : exp2f(st_m[tid] - M);
    }
    __syncthreads();
    // Scratch: values [rows][heads][S][D], then the groups' values
    // [rows][heads][G][D], then (max, sum) [rows][heads][S] and
    // [rows][heads][G]; counters [rows][x blocks][G + 1].
    const u32 G = (S + FA_GROUP - 1) / FA_GROUP;
    const size_t row_heads = (size_t)blockIdx.z * a.heads + h0;
    const size_t all_heads = (size_t)gridDim.z * a.heads;
    float* group_vals = part + all_heads * S * D;
    float2* msum = (float2*)(group_vals + all_heads * G * D);
    const SplitStates splits = {part + row_heads * S * D, msum + row_heads * S, S};
    const SplitStates groups = {group_vals + row_heads * G * D, msum + all_heads * S + row_heads * G,
                                G};
    for (int idx = tid; idx < nh * D; idx += FA_THREADS) {
        const int j = idx / D, d = idx % D;
        const float M = bm[j];
        float sum = 0.0f, val = 0.0f;
        if (M != NEG_INF) {
            for (int i = 0; i < NS; i++) {
                const float f = st_m[i * HG + j];
                sum = __fmaf_rn(st_s[i * HG + j], f, sum);
                val = __fmaf_rn(st_acc[(i * HG + j) * D + d], f, val);
            }
        }
        if (active == 1) {
            split_store<OUTF>(out, a, t, h0 + j, d, sum > 0.0f ? val / sum : 0.0f);
        } else {
            splits.vals[((size_t)j * S + sp) * D + d] = val;
            if (d == 0) splits.msum[(size_t)j * S + sp] = make_float2(M, sum);
        }
    }
    if (active == 1) return;

    // The last split of this group to arrive merges it; with one group
    // that is the row, else the group's state goes up a level.
    u32* counter = count + ((size_t)blockIdx.z * gridDim.x + blockIdx.x) * (G + 1);
    const u32 g = sp / FA_GROUP, first = g * FA_GROUP;
    const u32 n_groups = (active + FA_GROUP - 1) / FA_GROUP;
    if (!split_arrive(counter + g, min((u32)FA_GROUP, active - first), flag)) return;
    float* wgt = (float*)att_dyn;                // [HG][FA_GROUP]
    float2* ms = (float2*)(wgt + HG * FA_GROUP);  // [HG]
    float* merged = wgt + HG * (FA_GROUP + 4);   // [HG][D], 16-byte aligned
    split_merge(splits, first, min((u32)FA_GROUP, active - first), nh, D, wgt, ms, merged);
    if (n_groups > 1) {
        for (int idx = tid; idx < nh * D; idx += FA_THREADS) {
            const int j = idx / D, d = idx % D;
            groups.vals[((size_t)j * G + g) * D + d] = merged[j * D + d];
            if (d == 0) groups.msum[(size_t)j * G + g] = ms[j];
        }
        if (!split_arrive(counter + G, n_groups, flag)) return;
        split_merge(groups, 0, n_groups, nh, D, wgt, ms, merged);
    }
    for (int idx = tid; idx < nh * D; idx += FA_THREADS) {
        const int j = idx / D, d = idx % D;
        const float sum = ms[j].y;
        split_store<OUTF>(out, a, t, h0 + j, d, sum > 0.0f ? merged[j * D + d] / sum : 0.0f);
    }
}

#define ATTN_SPLIT_ENTRY(KV, K16, HG, OUT, OUTF)                                                \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                    \
        attn_split_##KV##_h##HG##OUT(const float* q, const u8* k, const u8* v, void* out,       \
                                     AttnArgs a, const u32* step, float* part, u32* count,      \
                                     u32 split_min, u32 skip_fits) {                            \
        attn_split_body<K16, HG, OUTF>(q, k, v, out, a, step, part, count, split_min,           \
                                       skip_fits);                                              \
    }
#define ATTN_SPLIT_HEADS(KV, K16, OUT, OUTF)                                                    \
    ATTN_SPLIT_ENTRY(KV, K16, 1, OUT, OUTF)                                                     \
    ATTN_SPLIT_ENTRY(KV, K16, 2, OUT, OUTF)                                                     \
    ATTN_SPLIT_ENTRY(KV, K16, 4, OUT, OUTF)
ATTN_SPLIT_HEADS(f16, true, , -1)
ATTN_SPLIT_HEADS(f32, false, , -1)
ATTN_SPLIT_HEADS(f16, true, _q8_0, 0)
ATTN_SPLIT_HEADS(f32, false, _q8_0, 0)
ATTN_SPLIT_HEADS(f16, true, _q8_1, 1)
ATTN_SPLIT_HEADS(f32, false, _q8_1, 1)
