// Fast decode attention (numerics `fast`): split-K over the cached cells
// (flash-decoding). Up to a few query rows (a decode step), any cache
// length, f16 or f32 keys and values, windows, rings and soft caps.
//
// Grid (blocks of a kv head, splits, query rows). A block serves HG query
// heads of one kv head, so each key and value row it reads feeds all of
// them. Its warps split into groups of L lanes per cell (L = D/8 rounded up
// to a power of two, each lane holding eight consecutive dimensions: one
// 16-byte load of an f16 row, two of an f32 one); a group walks four cells
// at a time with an online softmax in base 2 (scores pre-scaled by
// log2(e)), f32 accumulators. The block's groups are merged in shared
// memory by log-sum-exp; with one split that is the output, otherwise the
// block writes its values and (max, sum) to the node's scratch and the
// last split of its row and kv head to arrive (a counter in the scratch,
// reset by that block for the next launch) merges them all and writes the
// row: a warp per head turns the splits' maxima into weights (a lane per
// split), then every thread sums its values' splits with independent loads.
//
// The split of the cells depends only on the step's extent and the grid,
// which the host fixes from the recorded view: a captured graph replays for
// every step and a result never depends on timing.
//
// Float order: each dot product is eight in-lane fmas then a butterfly over
// the group; each cell's weight is exp2f of the score less the running max.
// Bound against an exact softmax: a few ulp of f32 per dot product and per
// weight, accumulated over the cells in f32 (relative error ~1e-6 on
// typical rows; the tests allow 1e-4 of |value| + 1e-2).

#define FA_THREADS 128
#define FA_WARPS (FA_THREADS / 32)
#define FA_UNROLL 4
#define FA_LOG2E 1.4426950408889634f
#define FA_MAX_SPLITS 64  // the grid's y extent at most (two per lane in the merge)

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

// Eight consecutive values of a row (f16 or f32) widened.
template <bool K16>
DEV void split_load8(const u8* row, float* out) {
    if (K16) {
        const uint4 u = *(const uint4*)row;
        const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            out[2 * k] = h2f((u16)(w[k] & 0xffffu));
            out[2 * k + 1] = h2f((u16)(w[k] >> 16));
        }
    } else {
        const float4 a = *(const float4*)row, b = *(const float4*)(row + 16);
        out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
        out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
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
    const bool live = li * 8 < D;
    const int group = a.heads / a.kv_heads;
    const int hblocks = (group + HG - 1) / HG;
    const int kvh = blockIdx.x / hblocks;
    const int h0 = kvh * group + (blockIdx.x % hblocks) * HG;
    const int nh = min(HG, (kvh + 1) * group - h0);
    const int t = a.row_offset + blockIdx.z;
    const u32 qpos = step ? step[0] : a.q_position;
    const u32 kv_rows = step ? step[1] : a.kv_rows;
    pdl_sync();
    if (skip_fits && attn_split_proj_attended(a, qpos, kv_rows)) return;
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
    if (sp >= active) return;
    const u32 c0 = lo + sp * per, c1 = min(c0 + per, hi);

    // This lane's eight query values of each head, pre-scaled into the
    // base-2 domain when there is no soft cap.
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
    const int esz = K16 ? 2 : 4;
    const size_t col = ((size_t)kvh * D + (size_t)li * 8) * esz;
    const size_t row_bytes = (size_t)a.kv_stride * esz;
    // Whole warps take the same passes (the butterflies need every lane).
    for (u32 wbase = c0 + (u32)(w * C * FA_UNROLL); wbase < c1; wbase += FA_WARPS * C * FA_UNROLL) {
        const u32 base = wbase + (u32)(gi * FA_UNROLL);
        float kf[FA_UNROLL][8], vf[FA_UNROLL][8];
        bool ok[FA_UNROLL];
#pragma unroll
        for (int u = 0; u < FA_UNROLL; u++) {
            const u32 c = base + u;
            ok[u] = c < c1 && (a.ring == NONE_U32 || attn_visible(a, c, pos, e.end));
            if (ok[u] && live) {
                split_load8<K16>(kc + c * row_bytes + col, kf[u]);
                split_load8<K16>(vc + c * row_bytes + col, vf[u]);
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++) kf[u][k] = vf[u][k] = 0.0f;
            }
        }
        float sc[FA_UNROLL][HG];
#pragma unroll
        for (int u = 0; u < FA_UNROLL; u++) {
#pragma unroll
            for (int j = 0; j < HG; j++) {
                float d = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) d = __fmaf_rn(qr[j][k], kf[u][k], d);
                for (int o = L >> 1; o > 0; o >>= 1) d += __shfl_xor_sync(FULL_MASK, d, o);
                if (a.softcap != 0.0f) d = a.softcap * tanhf(d * a.softcap_scale) * FA_LOG2E;
                sc[u][j] = ok[u] ? d : NEG_INF;
            }
        }
#pragma unroll
        for (int j = 0; j < HG; j++) {
            float mx = m[j];
#pragma unroll
            for (int u = 0; u < FA_UNROLL; u++) mx = fmaxf(mx, sc[u][j]);
            if (mx == NEG_INF) continue;
            const float corr = exp2f(m[j] - mx);
            s[j] *= corr;
#pragma unroll
            for (int k = 0; k < 8; k++) acc[j][k] *= corr;
#pragma unroll
            for (int u = 0; u < FA_UNROLL; u++) {
                const float p = exp2f(sc[u][j] - mx);
                s[j] += p;
#pragma unroll
                for (int k = 0; k < 8; k++) acc[j][k] = __fmaf_rn(p, vf[u][k], acc[j][k]);
            }
            m[j] = mx;
        }
    }

    // The block's lane groups merged: states [NS][HG] of (max, sum) and
    // [NS][HG][D] values.
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
    // Scratch: values [rows][heads][S][D], then (max, sum) [rows][heads][S].
    const size_t row_heads = (size_t)blockIdx.z * a.heads + h0;
    float* vals = part + row_heads * S * D;  // head h0, split 0
    float2* msum = (float2*)(part + (size_t)gridDim.z * a.heads * S * D) + row_heads * S;
    for (int idx = tid; idx < nh * D; idx += FA_THREADS) {
        const int j = idx / D, d = idx % D;
        float M = NEG_INF;
        for (int i = 0; i < NS; i++) M = fmaxf(M, st_m[i * HG + j]);
        float sum = 0.0f, val = 0.0f;
        if (M != NEG_INF) {
            for (int i = 0; i < NS; i++) {
                const float f = exp2f(st_m[i * HG + j] - M);
                sum = __fmaf_rn(st_s[i * HG + j], f, sum);
                val = __fmaf_rn(st_acc[(i * HG + j) * D + d], f, val);
            }
        }
        if (active == 1) {
            split_store<OUTF>(out, a, t, h0 + j, d, sum > 0.0f ? val / sum : 0.0f);
        } else {
            vals[((size_t)j * S + sp) * D + d] = val;
            if (d == 0) msum[(size_t)j * S + sp] = make_float2(M, sum);
        }
    }
    if (active == 1) return;
    // The last split of this row and kv head block to arrive merges them.
    __threadfence();
    __syncthreads();
    u32* counter = count + (size_t)blockIdx.z * gridDim.x + blockIdx.x;
    if (tid == 0) *flag = atomicAdd(counter, 1u) == active - 1 ? 1u : 0u;
    __syncthreads();
    if (*flag == 0) return;
    __threadfence();
    // Each split's weight (exp2 of its max less the largest) and the
    // inverse of the weighted sums, per head: [HG][FA_MAX_SPLITS], [HG].
    float* wgt = st_m;
    float* inv = wgt + HG * FA_MAX_SPLITS;
    if (w < nh) {
        const float2* mj = msum + (size_t)w * S;
        float2 p0 = make_float2(NEG_INF, 0.0f), p1 = p0;
        if ((u32)lane < active) p0 = __ldcg(mj + lane);
        if ((u32)lane + 32 < active) p1 = __ldcg(mj + lane + 32);
        const float M = warp_max(fmaxf(p0.x, p1.x));
        const float f0 = M == NEG_INF ? 0.0f : exp2f(p0.x - M);
        const float f1 = M == NEG_INF ? 0.0f : exp2f(p1.x - M);
        const float sum = split_warp_sum(__fmaf_rn(p1.y, f1, p0.y * f0));
        wgt[w * FA_MAX_SPLITS + lane] = f0;
        wgt[w * FA_MAX_SPLITS + lane + 32] = f1;
        if (lane == 0) inv[w] = sum > 0.0f ? 1.0f / sum : 0.0f;
    }
    __syncthreads();
    for (int idx = tid; idx < nh * D; idx += FA_THREADS) {
        const int j = idx / D, d = idx % D;
        const float* vj = vals + (size_t)j * S * D + d;
        const float* wj = wgt + j * FA_MAX_SPLITS;
        float val = 0.0f;
#pragma unroll 16
        for (u32 i = 0; i < active; i++) val = __fmaf_rn(__ldcg(vj + (size_t)i * D), wj[i], val);
        split_store<OUTF>(out, a, t, h0 + j, d, val * inv[j]);
    }
    if (tid == 0) *counter = 0u;
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
