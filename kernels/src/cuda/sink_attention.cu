// DeepSeek-V4 attention with a sink over a window ring plus compressed rows
// (sink_attention.rs says why it is three kernels). The CPU's order, which
// these kernels keep:
//   s_j   = (sum_c q[c] * k_j[c], f32, in c order from -0.0) * scale
//   mx    = max(sink, s_j...)
//   den   = expf(sink - mx); den += expf(s_j - mx) in key order (f32)
//   out_c = 0; out_c += (e_j / den) * v_j[c] in key order (f32)
// then the output rope: a*c - b*s, a*s + b*c with f32 (cos, sin) of the
// f64 angle. Keys of query i (t = q_position + i) are "slots": slot j <
// window is window position max(0, t + 1 - window) + j (valid while j <
// min(t + 1, window)), slot window + k is compressed row k (all visible
// rows) or selection[i][k] (-1: none). A slot's source is a window ring
// slot (< ring) or ring + a compressed row; -1 when the slot holds no key.

#define SINK_KT 32       // key slots per scores block (one per lane)
#define SINK_HR 4        // heads per scores thread
#define SINK_WARPS 4     // warps per scores block
#define SINK_HB (SINK_HR * SINK_WARPS)  // heads per scores block
#define SINK_DC 128      // columns staged at a time
#define SINK_KSTRIDE (SINK_DC + 4)      // 16-byte rows, conflict-free float4 reads
#define SINK_SM_HEADS 8  // heads per softmax block (one warp each)
#define SINK_OUT_HEADS 4 // heads per output block
#define SINK_OUT_COLS 64 // columns per output block
#define SINK_OUT_KT 64   // key slots staged at a time by the output kernel

struct SinkGeom {
    const void* win;    // f32 or f16 [ring, d]
    const void* rows;   // f32 or f16 [m, d]
    const i32* sel;     // i32 [n, top_k] or null
    u32 qpos, window, ring, ratio, m;
    int top_k, d, flags;  // flags: 1 window f16, 2 rows f16
};

DEV SinkGeom sink_geom(const void* win, const void* rows, const i32* sel, const u32* step,
                       u32 qpos, u32 window, u32 ring, u32 ratio, u32 m, int top_k, int d,
                       int flags) {
    SinkGeom g;
    g.win = win;
    g.rows = rows;
    g.sel = sel;
    g.qpos = step ? step[0] : qpos;
    g.window = window;
    g.ring = ring;
    g.ratio = ratio;
    g.m = m;
    g.top_k = top_k;
    g.d = d;
    g.flags = flags;
    return g;
}

// Compressed rows query i may use: (t + 1) / ratio, at most m.
DEV u64 sink_visible(const SinkGeom& g, int i) {
    if (g.ratio == 0) return 0;
    const u64 t = (u64)g.qpos + (u64)i;
    const u64 v = (t + 1) / g.ratio;
    return v < g.m ? v : (u64)g.m;
}

// Slots of query i worth visiting (the rest hold no key).
DEV int sink_limit(const SinkGeom& g, int i) {
    if (g.ratio == 0) return (int)g.window;
    if (g.sel) return (int)g.window + g.top_k;
    return (int)g.window + (int)sink_visible(g, i);
}

// The source of slot `slot` of query i, or -1.
DEV int sink_source(const SinkGeom& g, int i, int slot) {
    const u64 t = (u64)g.qpos + (u64)i;
    if (slot < (int)g.window) {
        const u64 count = t + 1 < g.window ? t + 1 : (u64)g.window;
        if ((u64)slot >= count) return -1;
        const u64 pos = t + 1 - count + (u64)slot;
        return (int)(pos % g.ring);
    }
    if (g.ratio == 0) return -1;
    const int k = slot - (int)g.window;
    const u64 visible = sink_visible(g, i);
    u64 w;
    if (g.sel) {
        if (k >= g.top_k) return -1;
        const i32 s = g.sel[(size_t)i * g.top_k + k];
        if (s < 0) return -1;
        w = (u64)s;
    } else {
        w = (u64)k;
    }
    // Rows past the visible ones are an error on the CPU; never read here.
    if (w >= visible) return -1;
    return (int)(g.ring + w);
}

// Element c of source row `src` (>= 0), as f32.
DEV float sink_load(const SinkGeom& g, int src, int c) {
    if ((u32)src < g.ring) {
        const size_t at = (size_t)src * g.d + c;
        return (g.flags & 1) ? h2f(((const u16*)g.win)[at]) : ((const float*)g.win)[at];
    }
    const size_t at = (size_t)(src - (int)g.ring) * g.d + c;
    return (g.flags & 2) ? h2f(((const u16*)g.rows)[at]) : ((const float*)g.rows)[at];
}

// Kernel 1: scores. Block (slot tile of 32, group of 16 heads, query);
// lane = slot, warp = 4 heads. Each thread runs its 4 dot products in the
// CPU's order (one f32 chain over the columns each), from query and key
// columns staged 128 at a time in shared memory. Writes s = dot * scale
// into scores[row][head][slot].
extern "C" __global__ void sink_scores(const float* q, const void* win, const void* rows,
                                       const i32* sel, float* scores, const u32* step,
                                       u32 qpos, u32 window, u32 ring, u32 ratio, u32 m,
                                       int top_k, int heads, int d, int flags, int slots,
                                       int row0, float scale) {
    pdl_sync();
    __shared__ __align__(16) float qs[SINK_HB][SINK_DC];
    __shared__ __align__(16) float ks[SINK_KT][SINK_KSTRIDE];
    __shared__ int src_s[SINK_KT];
    const SinkGeom g = sink_geom(win, rows, sel, step, qpos, window, ring, ratio, m, top_k, d,
                                 flags);
    const int local = blockIdx.z, i = row0 + local;
    const int base = blockIdx.x * SINK_KT;
    const int limit = sink_limit(g, i);
    if (base >= limit) return;  // the whole tile holds no key (block-uniform)
    const int h0 = blockIdx.y * SINK_HB;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x < SINK_KT) {
        const int slot = base + threadIdx.x;
        src_s[threadIdx.x] = slot < limit ? sink_source(g, i, slot) : -1;
    }
    float acc[SINK_HR];
#pragma unroll
    for (int u = 0; u < SINK_HR; u++) acc[u] = -0.0f;  // Rust's f32 sum starts at -0.0
    for (int c0 = 0; c0 < d; c0 += SINK_DC) {
        const int len = min(SINK_DC, d - c0);
        __syncthreads();  // src_s written; the previous columns consumed
        for (int hh = warp; hh < SINK_HB; hh += SINK_WARPS) {
            const int head = h0 + hh;
            const float* qr = q + ((size_t)i * heads + head) * d + c0;
#pragma unroll 4
            for (int c = lane; c < len; c += 32) qs[hh][c] = head < heads ? qr[c] : 0.0f;
        }
        for (int r = warp; r < SINK_KT; r += SINK_WARPS) {
            const int src = src_s[r];
#pragma unroll 4
            for (int c = lane; c < len; c += 32)
                ks[r][c] = src >= 0 ? sink_load(g, src, c0 + c) : 0.0f;
        }
        __syncthreads();
        const float* kr = ks[lane];
        int c = 0;
        for (; c + 4 <= len; c += 4) {
            const float4 kv = *(const float4*)(kr + c);
#pragma unroll
            for (int u = 0; u < SINK_HR; u++) {
                const float4 qv = *(const float4*)(&qs[warp * SINK_HR + u][c]);
                acc[u] = acc[u] + qv.x * kv.x;
                acc[u] = acc[u] + qv.y * kv.y;
                acc[u] = acc[u] + qv.z * kv.z;
                acc[u] = acc[u] + qv.w * kv.w;
            }
        }
        for (; c < len; c++) {
            const float kv = kr[c];
#pragma unroll
            for (int u = 0; u < SINK_HR; u++) acc[u] = acc[u] + qs[warp * SINK_HR + u][c] * kv;
        }
    }
    const int slot = base + lane;
    if (slot >= limit) return;
#pragma unroll
    for (int u = 0; u < SINK_HR; u++) {
        const int head = h0 + warp * SINK_HR + u;
        if (head < heads) scores[((size_t)local * heads + head) * slots + slot] = acc[u] * scale;
    }
}

// Kernel 2: softmax weights, one warp per (query, head), in place: the max
// (order-free), then the exponentials by the lanes and the denominator in
// slot order (every lane adds the 32 values of a chunk, read back from
// shared memory in turn), then w = e / den.
extern "C" __global__ void sink_softmax(const void* win, const void* rows, const i32* sel,
                                        const float* sinks, float* scores, const u32* step,
                                        u32 qpos, u32 window, u32 ring, u32 ratio, u32 m,
                                        int top_k, int heads, int d, int flags, int slots,
                                        int row0) {
    pdl_sync();
    const SinkGeom g = sink_geom(win, rows, sel, step, qpos, window, ring, ratio, m, top_k, d,
                                 flags);
    const int local = blockIdx.y, i = row0 + local;
    const int lane = threadIdx.x & 31;
    const int head = blockIdx.x * SINK_SM_HEADS + (threadIdx.x >> 5);
    __shared__ float chunks[SINK_SM_HEADS][32];
    float* chunk = chunks[threadIdx.x >> 5];
    if (head >= heads) return;  // warp-uniform; no block barrier below
    const int limit = sink_limit(g, i);
    float* sc = scores + ((size_t)local * heads + head) * slots;
    const float sink = sinks[head];
    float mx = sink;
    for (int slot = lane; slot < limit; slot += 32)
        if (sink_source(g, i, slot) >= 0) mx = fmaxf(mx, sc[slot]);
    mx = warp_max(mx);
    float den = glibc_expf(sink - mx);
    for (int base = 0; base < limit; base += 32) {
        const int slot = base + lane;
        bool valid = false;
        float e = 0.0f;
        if (slot < limit && sink_source(g, i, slot) >= 0) {
            valid = true;
            e = glibc_expf(sc[slot] - mx);
        }
        if (slot < limit) sc[slot] = e;
        const u32 vb = __ballot_sync(FULL_MASK, valid);
        chunk[lane] = e;
        __syncwarp();
#pragma unroll 8
        for (int k = 0; k < 32; k++)
            if ((vb >> k) & 1u) den = den + chunk[k];
        __syncwarp();  // read before the next chunk overwrites
    }
    // Each lane divides the values it wrote itself.
    for (int slot = lane; slot < limit; slot += 32) sc[slot] = sc[slot] / den;
}

// The output rope's (cos, sin) of pair `pair` at `pos`, as
// TailRopeParams::inv_freq and ::angles compute them (f64 frequency rounded
// to f32, f32 angle, f64 sin/cos rounded to f32). CUDA's pow/log/sincos
// stand in for glibc's: see sink_attention.rs for the tolerance.
DEV void sink_rope_cs(int pair, int pos, int n_dims, float base_f, int yarn, float factor_f,
                      u32 orig_ctx, float beta_fast, float beta_slow, int inverse, float* cs,
                      float* sn) {
    const double r = (double)n_dims;
    const double base = (double)base_f;
    double f = pow(base, -(double)(2 * pair) / r);
    if (yarn) {
        const double two_pi = 2.0 * 3.141592653589793;
        const double lb = 2.0 * log(base);
        const double cf = r * log((double)orig_ctx / (two_pi * (double)beta_fast)) / lb;
        const double cs_ = r * log((double)orig_ctx / (two_pi * (double)beta_slow)) / lb;
        const double lo = fmax(floor(cf), 0.0);
        double hi = fmin(ceil(cs_), r - 1.0);
        if (lo == hi) hi = lo + 0.001;
        const double factor = (double)factor_f;
        double ramp = ((double)pair - lo) / (hi - lo);
        if (ramp < 0.0) ramp = 0.0;
        if (ramp > 1.0) ramp = 1.0;
        f = f / factor * ramp + f * (1.0 - ramp);
    }
    const float freq = __double2float_rn(f);
    const float theta = (float)pos * freq;
    double s, c;
    sincos((double)theta, &s, &c);
    if (inverse) s = -s;
    *cs = __double2float_rn(c);
    *sn = __double2float_rn(s);
}

// Kernel 3: the weighted value sums. Block (64-column chunk, group of 4
// heads, query); thread = (head, column), summing its column over the
// slots in order (weights and sources staged 64 slots at a time; value
// rows read once per block through L1). With the output rope, column
// chunks start at an offset `shift` (0 or 1) that makes every rotated pair
// (nope + 2p, nope + 2p + 1) fall on lanes (2l, 2l + 1) of one warp.
extern "C" __global__ void sink_output(const void* win, const void* rows, const i32* sel,
                                       const float* scores, float* out, const u32* step,
                                       u32 qpos, u32 window, u32 ring, u32 ratio, u32 m,
                                       int top_k, int heads, int d, int flags, int slots,
                                       int row0, int shift, int rope_dims, float rope_base,
                                       int yarn, float yarn_factor, u32 yarn_orig_ctx,
                                       float yarn_beta_fast, float yarn_beta_slow,
                                       int rope_inverse) {
    pdl_sync();
    __shared__ int src_s[SINK_OUT_KT];
    __shared__ float w_s[SINK_OUT_HEADS][SINK_OUT_KT];
    const SinkGeom g = sink_geom(win, rows, sel, step, qpos, window, ring, ratio, m, top_k, d,
                                 flags);
    const int local = blockIdx.z, i = row0 + local;
    const int hl = threadIdx.x / SINK_OUT_COLS, cl = threadIdx.x % SINK_OUT_COLS;
    const int head = blockIdx.y * SINK_OUT_HEADS + hl;
    const int c = (int)blockIdx.x * SINK_OUT_COLS - shift + cl;
    const bool active = head < heads && c >= 0 && c < d;
    const int limit = sink_limit(g, i);
    float acc = 0.0f;
    for (int base = 0; base < limit; base += SINK_OUT_KT) {
        __syncthreads();  // the previous tile consumed
        if (threadIdx.x < SINK_OUT_KT) {
            const int slot = base + threadIdx.x;
            src_s[threadIdx.x] = slot < limit ? sink_source(g, i, slot) : -1;
        }
        {
            const int hh = threadIdx.x / SINK_OUT_KT, k = threadIdx.x % SINK_OUT_KT;
            const int hd = blockIdx.y * SINK_OUT_HEADS + hh;
            const int slot = base + k;
            w_s[hh][k] = (hd < heads && slot < limit)
                             ? scores[((size_t)local * heads + hd) * slots + slot]
                             : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        const int n = min(SINK_OUT_KT, limit - base);
        int k = 0;
        for (; k + 8 <= n; k += 8) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int src = src_s[k + u];
                v[u] = src >= 0 ? sink_load(g, src, c) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (src_s[k + u] >= 0) acc = acc + w_s[hl][k + u] * v[u];
        }
        for (; k < n; k++) {
            const int src = src_s[k];
            if (src >= 0) acc = acc + w_s[hl][k] * sink_load(g, src, c);
        }
    }
    if (rope_dims > 0) {
        const float partner = __shfl_xor_sync(FULL_MASK, acc, 1);
        const int nope = d - rope_dims;
        if (active && c >= nope) {
            const int off = c - nope;
            const int pair = off >> 1;
            if (pair < rope_dims / 2) {
                float cs, sn;
                const int pos = (int)(g.qpos + (u32)i);
                sink_rope_cs(pair, pos, rope_dims, rope_base, yarn, yarn_factor, yarn_orig_ctx,
                             yarn_beta_fast, yarn_beta_slow, rope_inverse, &cs, &sn);
                if ((off & 1) == 0) {
                    const float a = acc, b = partner;
                    acc = a * cs - b * sn;
                } else {
                    const float a = partner, b = acc;
                    acc = a * sn + b * cs;
                }
            }
        }
    }
    if (active) out[((size_t)i * heads + head) * d + c] = acc;
}
