// DeepSeek-V4's KV compressor and lightning indexer, in the CPU kernels'
// order of operations (kernels/src/cpu/compress.rs).
//
// compress_rows: one block per output row. Each thread pools whole channels
// (the slots in the CPU's order: f32 logits, running max, glibc expf, f32
// sums), the row's f64 sum of squares is reproduced exactly by warp 0
// (seq_sum_finish), then every thread scales and rotates its elements. The
// rotation's f64 pow/sin/cos are CUDA's (the only values not bit-exact by
// construction).
//
// indexer_scores: block (32 key rows, one query); lanes are rows, warps
// heads. Each (row, head) dot is an f32 sum in index order, the heads' f64
// sum runs in order per row; the f32 score goes to scratch as an
// order-preserving u32 key (f32::total_cmp's order).
// indexer_select: one block per query; a 4-pass radix select finds the
// top_k-th largest key T, then one ordered pass writes the rows with key > T
// and the first (lowest) rows with key == T, ascending.

// ---- compressor ---------------------------------------------------------------

#define COMPRESS_THREADS 512

// TailRopeParams::inv_freq for pair `i`, in f64 and rounded once; the YaRN
// ramp's ends (`lo`, `hi`) come from the host.
DEV float compress_inv_freq(int i, int n_dims, float base, int yarn, float factor, double lo,
                            double hi) {
    const double r = (double)n_dims;
    const double f = pow((double)base, -(double)(2 * i) / r);
    if (!yarn) return __double2float_rn(f);
    double ramp = ((double)i - lo) / (hi - lo);
    ramp = ramp < 0.0 ? 0.0 : (ramp > 1.0 ? 1.0 : ramp);
    return __double2float_rn(f / (double)factor * ramp + f * (1.0 - ramp));
}

// kv, gate [ring, width]; ape [ratio, width]; norm [dc]; out [table, dc],
// the whole row table: block `row` writes table row first_row + row (rows
// past the table, which validation rules out, are skipped). step[0] (when
// step is not null) replaces first_row.
extern "C" __global__ void __launch_bounds__(COMPRESS_THREADS)
    compress_rows(const float* kv, const float* gate, const float* ape, const float* norm,
                  float* out, const u32* step, int rows, u32 table, int dc, int width, u32 ratio, int overlap,
                  u32 first_row, u32 ring, float eps, int n_dims, float base, int inverse,
                  int yarn, float factor, u64 yarn_lo, u64 yarn_hi, int method) {
    pdl_sync();
    extern __shared__ float compress_dyn[];
    __shared__ SeqSumScratch compress_sum_scratch;
    __shared__ float compress_scale;
    const int row = blockIdx.x;
    if (row >= rows) return;
    const u32 w = (step ? step[0] : first_row) + (u32)row;
    if (w >= table) return;
    // Slots in the CPU's order (compress_slots): the previous window's
    // (first half of the columns) when overlapping, then the own window's.
    const bool prev = overlap && w > 0;
    const int nslots = (int)ratio * (prev ? 2 : 1);
    float* pooled = compress_dyn;                        // [dc]
    u32* slot_kv = (u32*)(compress_dyn + dc);            // [nslots] ring slot * width + half
    u32* slot_ape = slot_kv + nslots;                    // [nslots] ape row * width + half
    const u32 own_half = overlap ? (u32)dc : 0u;
    for (int k = threadIdx.x; k < nslots; k += blockDim.x) {
        u32 pos, half, j;
        if (prev && (u32)k < ratio) {
            j = (u32)k;
            pos = (w - 1u) * ratio + j;
            half = 0u;
        } else {
            j = prev ? (u32)k - ratio : (u32)k;
            pos = w * ratio + j;
            half = own_half;
        }
        slot_kv[k] = (pos % ring) * (u32)width + half;
        slot_ape[k] = j * (u32)width + half;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < dc; e += blockDim.x) {
        float mx = NEG_INF;
#pragma unroll 4
        for (int k = 0; k < nslots; k++) {
            const float l = gate[slot_kv[k] + e] + ape[slot_ape[k] + e];
            mx = fmaxf(mx, l);
        }
        float num = 0.0f, den = 0.0f;
#pragma unroll 4
        for (int k = 0; k < nslots; k++) {
            const float l = gate[slot_kv[k] + e] + ape[slot_ape[k] + e];
            const float wt = glibc_expf(l - mx);
            num = num + wt * kv[slot_kv[k] + e];
            den = den + wt;
        }
        pooled[e] = num / den;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        // scale = 1 / sqrt(sum((v * v) as f64) / dc + eps), rounded to f32.
        auto term = [&](int i) -> double {
            const float v = pooled[i];
            return (double)(v * v);
        };
        const float scale =
            seq_sum_finish(term, dc, &compress_sum_scratch, method, [&](double sum) {
                return __double2float_rn(1.0 / sqrt(sum / (double)dc + (double)eps));
            });
        if (threadIdx.x == 0) compress_scale = scale;
    }
    __syncthreads();
    const float scale = compress_scale;
    const int nope = dc - n_dims;
    const int pairs = n_dims / 2;
    const double lo = __longlong_as_double((i64)yarn_lo), hi = __longlong_as_double((i64)yarn_hi);
    // The rotation's position, as the CPU's `(w * ratio) as i32`.
    const float position = (float)(int)(w * ratio);
    float* o = out + (size_t)w * dc;
    for (int it = threadIdx.x; it < nope + pairs; it += blockDim.x) {
        if (it < nope) {
            o[it] = (pooled[it] * scale) * norm[it];
            continue;
        }
        const int k = it - nope;
        const int j = nope + 2 * k;
        const float a = (pooled[j] * scale) * norm[j];
        const float b = (pooled[j + 1] * scale) * norm[j + 1];
        const float f = compress_inv_freq(k, n_dims, base, yarn, factor, lo, hi);
        const float theta = position * f;
        double sd, cd;
        sincos((double)theta, &sd, &cd);
        if (inverse) sd = -sd;
        const float c = __double2float_rn(cd), s = __double2float_rn(sd);
        o[j] = a * c - b * s;
        o[j + 1] = a * s + b * c;
    }
}

// ---- indexer ------------------------------------------------------------------

#define INDEXER_TILE 32
#define INDEXER_SCORE_THREADS 256
#define INDEXER_SELECT_THREADS 1024

// An f32's bits as a u32 whose unsigned order is f32::total_cmp's.
DEV u32 indexer_order_key(float s) {
    const u32 b = __float_as_uint(s);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Rows visible to query `qi`: (q_position + qi + 1) / ratio, at most key_rows.
DEV u32 indexer_visible(u32 q_position, int qi, u32 ratio, int key_rows) {
    const u64 v = ((u64)q_position + (u64)qi + 1ull) / (u64)ratio;
    return v < (u64)key_rows ? (u32)v : (u32)key_rows;
}

// One block: key rows r0.. r0 + 32 of query q0 + blockIdx.y. The key tile
// sits in shared memory with a row stride (`stride`) that keeps the lanes'
// loads on distinct banks; VEC4 reads q and the tile as float4 (q rows
// 16-byte aligned, head_dim a multiple of 4).
template <bool VEC4>
DEV void indexer_scores_body(const float* q, const float* weights, const float* keys,
                             u32* scores, u32 q_position, int heads, int head_dim, int key_rows,
                             u32 ratio, int q0, int stride) {
    extern __shared__ __align__(16) float indexer_dyn[];
    const int qi = q0 + (int)blockIdx.y;
    const u32 visible = indexer_visible(q_position, qi, ratio, key_rows);
    const int r0 = (int)blockIdx.x * INDEXER_TILE;
    if ((u32)r0 >= visible) return;  // the whole block
    const int D = head_dim, H = heads;
    float* tile = indexer_dyn;                        // [32][stride]
    float* dots = indexer_dyn + INDEXER_TILE * stride;  // [H][32]
    const int tile_rows = min(INDEXER_TILE, key_rows - r0);
    const float* src = keys + (size_t)r0 * D;
    for (int i = threadIdx.x; i < INDEXER_TILE * D; i += blockDim.x) {
        const int r = i / D, d = i - r * D;
        tile[r * stride + d] = r < tile_rows ? src[i] : 0.0f;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const float* qrow = q + (size_t)qi * H * D;
    const float* krow = tile + lane * stride;
    for (int h = warp; h < H; h += nwarps) {
        const float* qh = qrow + (size_t)h * D;
        float dot = 0.0f;
        if (VEC4) {
            const float4* q4 = (const float4*)qh;
            const float4* k4 = (const float4*)krow;
#pragma unroll 4
            for (int d4 = 0; d4 < D / 4; d4++) {
                const float4 a = q4[d4], b = k4[d4];
                dot = dot + a.x * b.x;
                dot = dot + a.y * b.y;
                dot = dot + a.z * b.z;
                dot = dot + a.w * b.w;
            }
        } else {
#pragma unroll 4
            for (int d = 0; d < D; d++) dot = dot + qh[d] * krow[d];
        }
        dots[h * INDEXER_TILE + lane] = fmaxf(dot, 0.0f);
    }
    __syncthreads();
    if (warp == 0) {
        const int r = r0 + lane;
        if ((u32)r < visible) {
            const float* wrow = weights + (size_t)qi * H;
            double total = 0.0;
            for (int h = 0; h < H; h++)
                total = total + (double)wrow[h] * (double)dots[h * INDEXER_TILE + lane];
            scores[(size_t)blockIdx.y * key_rows + r] = indexer_order_key(__double2float_rn(total));
        }
    }
}

// Grid (ceil(key_rows / 32), queries of this chunk); scores [chunk][key_rows].
// step[0] (when step is not null) replaces q_position.
extern "C" __global__ void __launch_bounds__(INDEXER_SCORE_THREADS, 6)
    indexer_scores(const float* q, const float* weights, const float* keys, u32* scores,
                   const u32* step, int heads, int head_dim, int key_rows, u32 ratio,
                   u32 q_position, int q0, int stride, int vec4) {
    pdl_sync();
    const u32 qpos = step ? step[0] : q_position;
    if (vec4)
        indexer_scores_body<true>(q, weights, keys, scores, qpos, heads, head_dim, key_rows, ratio,
                                  q0, stride);
    else
        indexer_scores_body<false>(q, weights, keys, scores, qpos, heads, head_dim, key_rows,
                                   ratio, q0, stride);
}

// Grid (queries of this chunk); out [n, top_k] i32.
extern "C" __global__ void __launch_bounds__(INDEXER_SELECT_THREADS)
    indexer_select(const u32* scores, i32* out, const u32* step, int key_rows, int top_k,
                   u32 ratio, u32 q_position, int q0) {
    pdl_sync();
    __shared__ u32 hist[256];
    __shared__ u32 warp_counts[32];
    __shared__ u32 chosen_prefix, chosen_remaining;
    const u32 qpos = step ? step[0] : q_position;
    const int qi = q0 + (int)blockIdx.x;
    const u32 visible = indexer_visible(qpos, qi, ratio, key_rows);
    i32* o = out + (size_t)qi * top_k;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    if (visible <= (u32)top_k) {
        for (int j = tid; j < top_k; j += blockDim.x) o[j] = (u32)j < visible ? j : -1;
        return;
    }
    const u32* sc = scores + (size_t)blockIdx.x * key_rows;
    // Radix select, 8 bits a pass from the top: `prefix` holds the digits of
    // the top_k-th largest key found so far, `remaining` its rank among the
    // keys that share them.
    u32 prefix = 0u, mask = 0u, remaining = (u32)top_k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0u;
        __syncthreads();
        for (u32 r = tid; r < visible; r += blockDim.x) {
            const u32 key = sc[r];
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (warp == 0) {
            // Lane l holds bins 255 - 8l down to 248 - 8l (descending keys).
            u32 c[8], sum = 0u;
#pragma unroll
            for (int u = 0; u < 8; u++) {
                c[u] = hist[255 - 8 * lane - u];
                sum += c[u];
            }
            u32 incl = sum;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const u32 v = __shfl_up_sync(FULL_MASK, incl, off);
                if (lane >= off) incl += v;
            }
            // Some lane reaches `remaining`: the candidates number at least that.
            const u32 ballot = __ballot_sync(FULL_MASK, incl >= remaining);
            if (lane == __ffs(ballot) - 1) {
                u32 cum = incl - sum;
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    if (cum + c[u] >= remaining) {
                        chosen_prefix = prefix | ((u32)(255 - 8 * lane - u) << shift);
                        chosen_remaining = remaining - cum;
                        break;
                    }
                    cum += c[u];
                }
            }
        }
        __syncthreads();
        prefix = chosen_prefix;
        remaining = chosen_remaining;
        mask |= 255u << shift;
    }
    // prefix is the threshold key T: every key > T is kept, and the first
    // `remaining` keys == T in row order (ties: the lower row wins). One
    // ordered pass; a selected row's slot is the count of selected rows
    // before it: (keys > T before it) + min(keys == T before it, remaining).
    const u32 T = prefix, need = remaining;
    const u32 lt_mask = (1u << lane) - 1u;
    u32 gt_run = 0u, eq_run = 0u;
    for (u32 base = 0; base < visible; base += blockDim.x) {
        const u32 r = base + tid;
        const u32 key = r < visible ? sc[r] : 0u;
        const bool gt = r < visible && key > T;
        const bool eq = r < visible && key == T;
        const u32 gtb = __ballot_sync(FULL_MASK, gt), eqb = __ballot_sync(FULL_MASK, eq);
        // Counts per chunk are at most 1024: two 16-bit fields.
        if (lane == 0) warp_counts[warp] = ((u32)__popc(gtb) << 16) | (u32)__popc(eqb);
        __syncthreads();
        u32 before = 0u, total = 0u;
        for (int v = 0; v < nwarps; v++) {
            const u32 cnt = warp_counts[v];
            if (v < warp) before += cnt;
            total += cnt;
        }
        const u32 gt_before = gt_run + (before >> 16) + (u32)__popc(gtb & lt_mask);
        const u32 eq_before = eq_run + (before & 0xffffu) + (u32)__popc(eqb & lt_mask);
        if (gt || (eq && eq_before < need)) o[gt_before + min(eq_before, need)] = (i32)r;
        gt_run += total >> 16;
        eq_run += total & 0xffffu;
        __syncthreads();
        if (gt_run + min(eq_run, need) >= (u32)top_k) break;
    }
}
