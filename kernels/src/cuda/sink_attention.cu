// DeepSeek-V4 attention with a sink over a window ring plus compressed rows
// (sink_attention.rs says why it is two kernels). The CPU's order, which
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
#define SINK_HR 3        // heads per scores thread (64 heads: 6 blocks of 12)
#define SINK_WARPS 4     // warps per scores block
#define SINK_HB (SINK_HR * SINK_WARPS)  // heads per scores block
#define SINK_DC 128      // columns staged at a time
#define SINK_KSTRIDE (SINK_DC + 4)      // 16-byte rows, conflict-free float4 reads
#define SINK_KREG (SINK_KT * SINK_DC / (32 * SINK_WARPS))  // staged key values per thread
#define SINK_QREG (SINK_HB * SINK_DC / (32 * SINK_WARPS))  // staged query values per thread

#define SINK_AH 8        // heads per attend block (two per warp)
#define SINK_AC 32       // columns per attend block (one per lane)
#define SINK_AT 128      // threads per attend block
#define SINK_WCAP 640    // keys per segment: their weights stay in shared memory
#define SINK_VK 32       // keys per value stage
#define SINK_VS 5        // value stages in flight
#define SINK_PAD 16      // keys of padding past the attend kernel's arrays

// The staging maps thread t to column t (or quad t % 32) of a chunk, and
// the attend block's warps to pairs of its heads, lanes to its columns.
static_assert(SINK_DC == 32 * SINK_WARPS && SINK_QREG == SINK_HB && SINK_QREG % 4 == 0,
              "scores staging");
static_assert(SINK_AC == 32 && SINK_AH == 2 * (SINK_AT / 32), "attend layout");
static_assert(SINK_WCAP % SINK_AT == 0 && SINK_WCAP % 2 == 0 && SINK_VK % 2 == 0, "segments");

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

// What one query row sees: its window's length and first ring slot, and
// the compressed rows it may use ((t + 1) / ratio, at most m).
struct SinkRow {
    u32 count, start, visible;
};

DEV SinkRow sink_row(const SinkGeom& g, int i) {
    const u64 t = (u64)g.qpos + (u64)i;
    const u64 count = t + 1 < g.window ? t + 1 : (u64)g.window;
    SinkRow r;
    r.count = (u32)count;
    u64 v;
    if (t + 1 <= 0xffffffffull) {  // 32-bit division (the usual case)
        r.start = ((u32)t + 1 - (u32)count) % g.ring;
        v = g.ratio ? ((u32)t + 1) / g.ratio : 0;
    } else {
        r.start = (u32)((t + 1 - count) % g.ring);
        v = g.ratio ? (t + 1) / g.ratio : 0;
    }
    r.visible = (u32)(v < g.m ? v : (u64)g.m);
    return r;
}

// Slots of a query worth visiting (the rest hold no key).
DEV int sink_limit(const SinkGeom& g, const SinkRow& r) {
    if (g.ratio == 0) return (int)g.window;
    if (g.sel) return (int)g.window + g.top_k;
    return (int)g.window + (int)r.visible;
}

// The source of slot `slot` of query i, or -1.
DEV int sink_src(const SinkGeom& g, const SinkRow& r, int i, int slot) {
    if (slot < (int)g.window) {
        if ((u32)slot >= r.count) return -1;
        u32 p = r.start + (u32)slot;  // < 2^32: ring + rows and the slots fit an i32
        if (p >= g.ring) {
            p -= g.ring;
            if (p >= g.ring) p %= g.ring;
        }
        return (int)p;
    }
    if (g.ratio == 0) return -1;
    const int k = slot - (int)g.window;
    u32 w;
    if (g.sel) {
        if (k >= g.top_k) return -1;
        const i32 s = g.sel[(size_t)i * g.top_k + k];
        if (s < 0) return -1;
        w = (u32)s;
    } else {
        w = (u32)k;
    }
    // Rows past the visible ones are an error on the CPU; never read here.
    if (w >= r.visible) return -1;
    return (int)(g.ring + w);
}

DEV bool sink_is16(const SinkGeom& g, int src) {
    return (u32)src < g.ring ? (g.flags & 1) != 0 : (g.flags & 2) != 0;
}

// The first byte of source row `src` (>= 0).
DEV const u8* sink_row_ptr(const SinkGeom& g, int src) {
    if ((u32)src < g.ring)
        return (const u8*)g.win + (size_t)src * g.d * ((g.flags & 1) ? 2 : 4);
    return (const u8*)g.rows + (size_t)(src - (int)g.ring) * g.d * ((g.flags & 2) ? 2 : 4);
}

// ---- asynchronous copies into shared memory (sm_80+) ----

DEV void sink_cp4(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src));
}
// Brings the 128-byte lines of [p, p + bytes) into L2.
DEV void sink_prefetch(const u8* p, size_t bytes, int lane, int lanes) {
    for (size_t o = (size_t)lane * 128; o < bytes; o += (size_t)lanes * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
    if (lane == 0 && bytes) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + bytes - 1));
}
DEV void sink_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
DEV void sink_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Kernel 1: scores. Block (slot tile of 32, group of 12 heads, query);
// lane = slot, warp = 3 heads. Each thread runs its 3 dot products in the
// CPU's order (one f32 chain over the columns each), from query and key
// columns staged 128 at a time in shared memory; the next 128 are loaded
// into registers (16-byte loads when `vec`) while these are summed, and
// every row the block reads is asked into L2 at the start (one round trip
// to memory, not one per chunk). Writes s = dot * scale into
// scores[row][head][slot].
extern "C" __global__ void __launch_bounds__(SINK_WARPS * 32, 1)
    sink_scores(const float* q, const void* win, const void* rows, const i32* sel, float* scores,
                const u32* step, u32 qpos, u32 window, u32 ring, u32 ratio, u32 m, int top_k,
                int heads, int d, int flags, int slots, int row0, float scale, int vec) {
    pdl_sync();
    __shared__ __align__(16) float ks[SINK_KT * SINK_KSTRIDE];
    __shared__ __align__(16) float qs[SINK_HB * SINK_DC];
    __shared__ const u8* kp[SINK_KT];
    __shared__ int kf[SINK_KT];
    const SinkGeom g = sink_geom(win, rows, sel, step, qpos, window, ring, ratio, m, top_k, d,
                                 flags);
    const int local = blockIdx.z, i = row0 + local;
    const SinkRow r = sink_row(g, i);
    const int base = blockIdx.x * SINK_KT;
    const int limit = sink_limit(g, r);
    if (base >= limit) return;  // the whole tile holds no key (block-uniform)
    const int h0 = blockIdx.y * SINK_HB;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* qi = q + (size_t)i * heads * d;
    // Staged values of one column chunk: keys then queries, raw (f16 keys
    // are widened when stored). With `vec`, thread t holds quads t + 128 j.
    u32 reg[SINK_KREG + SINK_QREG];
    auto load_q = [&](int c0) {
        const int len = min(SINK_DC, d - c0);
        if (vec) {
            const int c = 4 * lane;
#pragma unroll
            for (int j = 0; j < SINK_QREG / 4; j++) {
                const int head = h0 + warp + SINK_WARPS * j;
                u32* o = reg + SINK_KREG + 4 * j;
                o[0] = o[1] = o[2] = o[3] = 0;
                if (head < heads && c < len) {
                    const uint4 x = *(const uint4*)(qi + (size_t)head * d + c0 + c);
                    o[0] = x.x;
                    o[1] = x.y;
                    o[2] = x.z;
                    o[3] = x.w;
                }
            }
        } else {
            const int c = tid;  // one column per thread, one row per register
#pragma unroll
            for (int j = 0; j < SINK_QREG; j++) {
                const int head = h0 + j;
                reg[SINK_KREG + j] = 0;
                if (head < heads && c < len)
                    reg[SINK_KREG + j] = __float_as_uint(qi[(size_t)head * d + c0 + c]);
            }
        }
    };
    auto load_k = [&](int c0) {
        const int len = min(SINK_DC, d - c0);
        if (vec) {
            const int c = 4 * lane;
#pragma unroll
            for (int j = 0; j < SINK_KREG / 4; j++) {
                const int row = warp + SINK_WARPS * j;
                const u8* p = kp[row];
                u32* o = reg + 4 * j;
                o[0] = o[1] = o[2] = o[3] = 0;
                if (p && c < len) {
                    if (kf[row]) {
                        const uint2 x = *(const uint2*)(p + (size_t)(c0 + c) * 2);
                        o[0] = x.x;
                        o[1] = x.y;
                    } else {
                        const uint4 x = *(const uint4*)(p + (size_t)(c0 + c) * 4);
                        o[0] = x.x;
                        o[1] = x.y;
                        o[2] = x.z;
                        o[3] = x.w;
                    }
                }
            }
        } else {
            const int c = tid;
#pragma unroll
            for (int j = 0; j < SINK_KREG; j++) {
                const u8* p = kp[j];
                reg[j] = 0;
                if (p && c < len)
                    reg[j] = kf[j] ? (u32)((const u16*)p)[c0 + c]
                                   : __float_as_uint(((const float*)p)[c0 + c]);
            }
        }
    };
    auto store = [&]() {
        if (vec) {
            const int c = 4 * lane;
#pragma unroll
            for (int j = 0; j < SINK_KREG / 4; j++) {
                const int row = warp + SINK_WARPS * j;
                const u32* o = reg + 4 * j;
                float4 v;
                if (kf[row]) {
                    v = make_float4(h2f((u16)(o[0] & 0xffffu)), h2f((u16)(o[0] >> 16)),
                                    h2f((u16)(o[1] & 0xffffu)), h2f((u16)(o[1] >> 16)));
                } else {
                    v = make_float4(__uint_as_float(o[0]), __uint_as_float(o[1]),
                                    __uint_as_float(o[2]), __uint_as_float(o[3]));
                }
                *(float4*)&ks[row * SINK_KSTRIDE + c] = v;
            }
#pragma unroll
            for (int j = 0; j < SINK_QREG / 4; j++) {
                const u32* o = reg + SINK_KREG + 4 * j;
                *(float4*)&qs[(warp + SINK_WARPS * j) * SINK_DC + c] =
                    make_float4(__uint_as_float(o[0]), __uint_as_float(o[1]),
                                __uint_as_float(o[2]), __uint_as_float(o[3]));
            }
        } else {
#pragma unroll
            for (int j = 0; j < SINK_KREG; j++)
                ks[j * SINK_KSTRIDE + tid] =
                    kf[j] ? h2f((u16)reg[j]) : __uint_as_float(reg[j]);
#pragma unroll
            for (int j = 0; j < SINK_QREG; j++)
                qs[j * SINK_DC + tid] = __uint_as_float(reg[SINK_KREG + j]);
        }
    };
    // The queries do not wait for the key table: first chunk loading, the
    // rest asked into L2.
    load_q(0);
    for (int hh = warp; hh < SINK_HB && h0 + hh < heads; hh += SINK_WARPS)
        sink_prefetch((const u8*)(qi + (size_t)(h0 + hh) * d), (size_t)d * 4, lane, 32);
    if (tid < SINK_KT) {
        const int slot = base + tid;
        const int src = slot < limit ? sink_src(g, r, i, slot) : -1;
        kp[tid] = src >= 0 ? sink_row_ptr(g, src) : nullptr;
        kf[tid] = src >= 0 && sink_is16(g, src);
    }
    __syncthreads();
    load_k(0);
    for (int row = warp; row < SINK_KT; row += SINK_WARPS)
        if (kp[row]) sink_prefetch(kp[row], (size_t)d * (kf[row] ? 2 : 4), lane, 32);
    float acc[SINK_HR];
#pragma unroll
    for (int u = 0; u < SINK_HR; u++) acc[u] = -0.0f;  // Rust's f32 sum starts at -0.0
    store();
    __syncthreads();
    const float* kr = ks + lane * SINK_KSTRIDE;
    const float* qr = qs + warp * SINK_HR * SINK_DC;
    for (int c0 = 0; c0 < d; c0 += SINK_DC) {
        const int len = min(SINK_DC, d - c0);
        const bool more = c0 + SINK_DC < d;
        if (more) {  // in flight while this chunk is summed
            load_q(c0 + SINK_DC);
            load_k(c0 + SINK_DC);
        }
        // 8 columns at a time from two register sets: the next 8 columns'
        // operands are read while these are summed.
        float4 ka[2], qa[SINK_HR][2], kb[2], qb[SINK_HR][2];
        auto fetch = [&](float4* k8, float4 (*q8)[2], int at) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                k8[h] = *(const float4*)(kr + at + 4 * h);
#pragma unroll
                for (int u = 0; u < SINK_HR; u++)
                    q8[u][h] = *(const float4*)(qr + u * SINK_DC + at + 4 * h);
            }
        };
        auto sum8 = [&](const float4* k8, float4 (*q8)[2]) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
#pragma unroll
                for (int u = 0; u < SINK_HR; u++) {
                    acc[u] = acc[u] + q8[u][h].x * k8[h].x;
                    acc[u] = acc[u] + q8[u][h].y * k8[h].y;
                    acc[u] = acc[u] + q8[u][h].z * k8[h].z;
                    acc[u] = acc[u] + q8[u][h].w * k8[h].w;
                }
            }
        };
        int c = 0;
        const int l8 = len & ~7;
        if (l8 > 0) {
            fetch(ka, qa, 0);
            for (; c + 16 <= l8; c += 16) {
                fetch(kb, qb, c + 8);
                sum8(ka, qa);
                fetch(ka, qa, c + 16 < l8 ? c + 16 : c);  // in bounds when unused
                sum8(kb, qb);
            }
            if (c < l8) {
                sum8(ka, qa);
                c += 8;
            }
        }
        for (; c + 4 <= len; c += 4) {
            const float4 kv = *(const float4*)(kr + c);
#pragma unroll
            for (int u = 0; u < SINK_HR; u++) {
                const float4 qv = *(const float4*)(qr + u * SINK_DC + c);
                acc[u] = acc[u] + qv.x * kv.x;
                acc[u] = acc[u] + qv.y * kv.y;
                acc[u] = acc[u] + qv.z * kv.z;
                acc[u] = acc[u] + qv.w * kv.w;
            }
        }
        for (; c < len; c++) {
            const float kc = kr[c];
#pragma unroll
            for (int u = 0; u < SINK_HR; u++) acc[u] = acc[u] + qr[u * SINK_DC + c] * kc;
        }
        if (more) {
            __syncthreads();  // this chunk consumed
            store();
            __syncthreads();
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

// Where the weight of (key, head) of a segment lives in the attend
// kernel's shared memory: per key pair, per head pair, [key & 1][head & 1],
// so a warp reads its two heads' weights of two keys as one float4 and the
// lane that sums head h's denominator reads conflict-free.
DEV int sink_widx(int key, int h) {
    return ((key >> 1) << 4) | ((h >> 1) << 2) | ((key & 1) << 1) | (h & 1);
}

struct SinkRope {
    int shift, dims;
    float base;
    int yarn;
    float factor;
    u32 orig_ctx;
    float beta_fast, beta_slow;
    int inverse;
};

// Kernel 2 (the body; KIND 0: f32 keys only, 1: f16 only, 2: both). Block
// (32-column chunk, group of 8 heads, query): the softmax of its 8 heads,
// then thread = (2 heads, 1 column) sums its columns over the keys in
// order. The valid keys go in segments of SINK_WCAP (one segment for
// decode shapes; with more, each pass gathers the scores again):
//   list:   the segment's valid slots in order, with their sources;
//   pass 0: scores gathered into shared memory (cp.async), the value rows
//           asked into L2 and the first value stages issued, the rope
//           angle computed meanwhile; max per head;
//   pass 1: e = expf(s - mx) in place (8 per thread at a time); lane h of
//           warp 0 sums head h's denominator in key order;
//   pass 2: w = e / den in place; the value rows' 32 columns come through
//           SINK_VS stages of SINK_VK keys (cp.async), each warp summing
//           its 2 heads over 8 keys while the next 8 are read.
// One warp per scheduler: the loops keep their loads a step ahead by hand
// (ILP), there is no other warp to hide a latency.
// With the output rope, column chunks start at an offset `shift` (0 or 1)
// that makes every rotated pair (nope + 2p, nope + 2p + 1) fall on lanes
// (2l, 2l + 1) of one warp.
template <int KIND>
DEV void sink_attend_body(const SinkGeom& g, const float* sinks, const float* scores, float* out,
                          int heads, int slots, int local, int i, const SinkRope& rp, int vmode,
                          float* w_s, float* vs, int* key_src, u16* key_slot, int* warp_tot,
                          float* mx_s, float* den_s) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const SinkRow r = sink_row(g, i);
    const int limit = sink_limit(g, r);
    const int h0 = blockIdx.y * SINK_AH;
    const int hA = h0 + 2 * warp, hB = hA + 1;
    const int c0 = (int)blockIdx.x * SINK_AC - rp.shift;
    const int c = c0 + lane;
    const int d = g.d;
    const float* sc_row = scores + (size_t)local * heads * slots;
    const int nseg = (limit + SINK_WCAP - 1) / SINK_WCAP;
    const bool resident = nseg == 1;

    // The valid slots of [s0, s1) in order (at most SINK_WCAP): key_src,
    // key_slot (relative to s0); returns their count (block-uniform).
    auto build = [&](int s0, int s1) -> int {
        const int span = s1 - s0;
        const int per = (span + SINK_AT - 1) / SINK_AT;
        int srcs[SINK_WCAP / SINK_AT];
        int cnt = 0;
#pragma unroll
        for (int j = 0; j < SINK_WCAP / SINK_AT; j++) {
            const int o = tid * per + j;
            srcs[j] = (j < per && o < span) ? sink_src(g, r, i, s0 + o) : -1;
            cnt += srcs[j] >= 0;
        }
        int incl = cnt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(FULL_MASK, incl, o);
            if (lane >= o) incl += y;
        }
        __syncthreads();  // the previous list and totals are no longer read
        if (lane == 31) warp_tot[warp] = incl;
        __syncthreads();
        int off = incl - cnt, total = 0;
#pragma unroll
        for (int w = 0; w < SINK_AT / 32; w++) {
            const int t = warp_tot[w];
            if (w < warp) off += t;
            total += t;
        }
#pragma unroll
        for (int j = 0; j < SINK_WCAP / SINK_AT; j++) {
            if (srcs[j] >= 0) {
                key_src[off] = srcs[j];
                key_slot[off] = (u16)(tid * per + j);
                off++;
            }
        }
        __syncthreads();
        return total;
    };
    // Thread t's share of (key, head) pairs: head h0 + (t & 7), keys
    // (t >> 3) + 16 m, 8 at a time (a warp touches 4 keys x 8 heads: 32
    // consecutive words of w_s).
    const int my_h = tid & 7, my_head = h0 + my_h, my_key = tid >> 3;
    // The scores of the segment's keys into w_s (one cp.async group).
    auto gather = [&](int s0, int n) {
        const float* sc = sc_row + (size_t)my_head * slots + s0;
        for (int kb = my_key; kb < n; kb += 16 * 8) {
            int at[8];
#pragma unroll
            for (int u = 0; u < 8; u++) at[u] = kb + 16 * u < n ? key_slot[kb + 16 * u] : -1;
#pragma unroll
            for (int u = 0; u < 8; u++) {
                if (at[u] < 0) continue;
                float* dst = w_s + sink_widx(kb + 16 * u, my_h);
                if (my_head < heads)
                    sink_cp4(dst, sc + at[u]);
                else
                    *dst = 0.0f;
            }
        }
        sink_commit();
    };
    // The value rows' columns of the segment's keys into L2 (they come
    // through the stages later).
    auto prefetch_values = [&](int n) {
        const int lo = max(c0, 0), hi = min(c0 + SINK_AC, d);
        for (int key = tid; key < n; key += SINK_AT) {
            const int src = key_src[key];
            const size_t esz = sink_is16(g, src) ? 2 : 4;
            const u8* row = sink_row_ptr(g, src);
            const u8* first = row + (size_t)lo * esz;
            const u8* last = row + (size_t)hi * esz - 1;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(first));
            if (((size_t)first >> 7) != ((size_t)last >> 7))
                asm volatile("prefetch.global.L2 [%0];" ::"l"(last));
        }
    };
    // Value stage `t` of the segment's `n` keys (one cp.async group, empty
    // past the last stage).
    auto issue = [&](int t, int n) {
        const int ntiles = (n + SINK_VK - 1) / SINK_VK;
        if (t < ntiles) {
            const int kb = t * SINK_VK, cnt = min(SINK_VK, n - kb);
            float* dst = vs + (t % SINK_VS) * SINK_VK * SINK_AC;
            if (KIND == 0 && (vmode & 1)) {
                // 16-byte pieces: d % 4 == 0, c0 % 4 == 0, rows 16-byte aligned.
                for (int p = tid; p < SINK_VK * (SINK_AC / 4); p += SINK_AT) {
                    const int k = p >> 3, q4 = p & 7;
                    const int col = c0 + 4 * q4;
                    if (k < cnt && col < d)
                        cp_async16(dst + k * SINK_AC + 4 * q4,
                                  sink_row_ptr(g, key_src[kb + k]) + (size_t)col * 4);
                }
            } else {
                for (int p = tid; p < SINK_VK * SINK_AC; p += SINK_AT) {
                    const int k = p >> 5, cc = p & 31;
                    if (k >= cnt) continue;
                    const int src = key_src[kb + k];
                    const u8* row = sink_row_ptr(g, src);
                    const bool h16 = KIND == 0 ? false : KIND == 1 ? true : sink_is16(g, src);
                    float* kd = dst + k * SINK_AC;
                    if (!h16) {
                        const int col = c0 + cc;
                        if (col >= 0 && col < d) sink_cp4(kd + cc, row + (size_t)col * 4);
                    } else if (vmode & 2) {
                        // Pairs of halves: d even, c0 even, rows 4-byte aligned.
                        const int col = c0 + 2 * cc;
                        if (cc < SINK_AC / 2 && col < d)
                            sink_cp4((u8*)kd + 4 * cc, row + (size_t)col * 2);
                    } else {
                        const int col = c0 + cc;
                        if (col >= 0 && col < d) ((u16*)kd)[cc] = ((const u16*)row)[col];
                    }
                }
            }
        }
        sink_commit();
    };
    // Column `lane` of key k of a stage, as f32.
    auto value = [&](const float* vt, int k, int key) -> float {
        const bool h16 = KIND == 0 ? false : KIND == 1 ? true : sink_is16(g, key_src[key]);
        return h16 ? h2f(((const u16*)(vt + k * SINK_AC))[lane]) : vt[k * SINK_AC + lane];
    };

    // This column's rope angle (f64 maths) while the first loads fly.
    float rcs = 1.0f, rsn = 0.0f;
    const int nope = d - rp.dims;
    const bool rotated = rp.dims > 0 && c >= nope && c < d && ((c - nope) >> 1) < rp.dims / 2;
    auto rope_angle = [&]() {
        if (rotated)
            sink_rope_cs((c - nope) >> 1, (int)(g.qpos + (u32)i), rp.dims, rp.base, rp.yarn,
                         rp.factor, rp.orig_ctx, rp.beta_fast, rp.beta_slow, rp.inverse, &rcs,
                         &rsn);
    };

    // Before the list: the block's scores (first segment) into L2, the expf
    // table into L1, so the gather and the first exponentials wait on L2.
    for (int hh = warp; hh < SINK_AH && h0 + hh < heads; hh += SINK_AT / 32)
        sink_prefetch((const u8*)(sc_row + (size_t)(h0 + hh) * slots),
                      (size_t)min(limit, SINK_WCAP) * 4, lane, 32);
    prefetch_expf_table(tid);

    // Pass 0: the maxima (each warp its two heads).
    float mA = hA < heads ? sinks[hA] : 0.0f, mB = hB < heads ? sinks[hB] : 0.0f;
    int n = 0;
    for (int seg = 0; seg < nseg; seg++) {
        const int s0 = seg * SINK_WCAP;
        n = build(s0, min(limit, s0 + SINK_WCAP));
        gather(s0, n);
        if (resident) {
            // The first value stages load while the softmax runs.
#pragma unroll 1
            for (int t = 0; t < SINK_VS - 1; t++) issue(t, n);
            prefetch_values(n);
        }
        if (seg == 0) rope_angle();
        if (resident)
            sink_wait<SINK_VS - 1>();
        else
            sink_wait<0>();
        __syncthreads();
        int key = lane;
#pragma unroll 4
        for (; key < n; key += 32) {
            const float2 x = *(const float2*)(w_s + sink_widx(key, 2 * warp));
            mA = fmaxf(mA, x.x);
            mB = fmaxf(mB, x.y);
        }
        __syncthreads();  // w_s read before the next segment's gather
    }
    mA = warp_max(mA);
    mB = warp_max(mB);
    if (lane == 0) {
        mx_s[2 * warp] = mA;
        mx_s[2 * warp + 1] = mB;
    }
    __syncthreads();

    float my_mx = 0.0f, my_den = 0.0f;  // this thread's head's, once known
    // w_s[key][my_h] = f(w_s[key][my_h]) over the thread's keys, 8 at a time;
    // f: 0 the exponential, 1 the weight of an exponential, 2 of a score.
    auto transform = [&](int f) {
        if (my_head >= heads) return;
        for (int kb = my_key; kb < n; kb += 16 * 8) {
            float x[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (kb + 16 * u < n) x[u] = w_s[sink_widx(kb + 16 * u, my_h)];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (kb + 16 * u < n) {
                    float y = x[u];
                    if (f != 1) y = glibc_expf(y - my_mx);
                    if (f != 0) y = y / my_den;
                    w_s[sink_widx(kb + 16 * u, my_h)] = y;
                }
        }
    };
    my_mx = mx_s[my_h];

    // Pass 1: the exponentials and the denominators.
    float den = 0.0f;
    if (tid < SINK_AH && h0 + tid < heads) den = glibc_expf(sinks[h0 + tid] - mx_s[tid]);
    for (int seg = 0; seg < nseg; seg++) {
        if (!resident) {
            const int s0 = seg * SINK_WCAP;
            n = build(s0, min(limit, s0 + SINK_WCAP));
            gather(s0, n);
            sink_wait<0>();
            __syncthreads();
        }
        transform(0);
        __syncthreads();
        if (tid < SINK_AH) {
            // Key 2j of head tid at p[16 j], key 2j + 1 at p[16 j + 2]; 16
            // keys at a time from two register sets (the next 16 read while
            // these are added; reads past the keys land in padding, unused).
            const float* p = w_s + ((tid >> 1) << 2) + (tid & 1);
            float ea[16], eb[16];
            auto fetch16 = [&](float* e, int at) {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    e[2 * j] = p[((at >> 1) + j) * 16];
                    e[2 * j + 1] = p[((at >> 1) + j) * 16 + 2];
                }
            };
            auto add16 = [&](const float* e) {
#pragma unroll
                for (int j = 0; j < 16; j++) den = den + e[j];
            };
            const int blocks16 = n >> 4;
            int key = 0;
            if (blocks16 > 0) {
                fetch16(ea, 0);
                int b16 = 0;
                for (; b16 + 2 <= blocks16; b16 += 2) {
                    fetch16(eb, 16 * b16 + 16);
                    add16(ea);
                    fetch16(ea, 16 * b16 + 32);
                    add16(eb);
                }
                if (b16 < blocks16) add16(ea);
                key = 16 * blocks16;
            }
            for (; key < n; key++) den = den + p[(key >> 1) * 16 + (key & 1) * 2];
        }
        __syncthreads();
    }
    if (tid < SINK_AH) den_s[tid] = den;
    __syncthreads();
    my_den = den_s[my_h];

    // Pass 2: the weights and the weighted value sums.
    float acc0 = 0.0f, acc1 = 0.0f;
    for (int seg = 0; seg < nseg; seg++) {
        if (!resident) {
            const int s0 = seg * SINK_WCAP;
            n = build(s0, min(limit, s0 + SINK_WCAP));
            gather(s0, n);
            prefetch_values(n);
            sink_wait<0>();
            __syncthreads();
            transform(2);
#pragma unroll 1
            for (int t = 0; t < SINK_VS - 1; t++) issue(t, n);
        } else {
            transform(1);
        }
        const int ntiles = (n + SINK_VK - 1) / SINK_VK;
        for (int t = 0; t < ntiles; t++) {
            sink_wait<SINK_VS - 2>();
            // Stage t (and the first time the weights) in; stage t - 1
            // consumed by everyone, so its buffer takes stage t + VS - 1.
            __syncthreads();
            issue(t + SINK_VS - 1, n);
            const int kb = t * SINK_VK, cnt = min(SINK_VK, n - kb);
            const float* vt = vs + (t % SINK_VS) * SINK_VK * SINK_AC;
            const float4* w4 = (const float4*)w_s + (kb >> 1) * 4 + warp;
            int k = 0;
            // Groups of 8 keys from two register sets: the next group's
            // operands are read while one is summed (key order kept within
            // each accumulator; reads past the keys land in padding, unused).
            const int groups = cnt >> 3;
            float4 wa[4], wb[4];
            float va[8], vb[8];
            auto fetch = [&](float4* w8, float* v8, int at) {
#pragma unroll
                for (int j = 0; j < 4; j++) w8[j] = w4[((at >> 1) + j) * 4];
#pragma unroll
                for (int j = 0; j < 8; j++) v8[j] = value(vt, at + j, kb + at + j);
            };
            auto sum8 = [&](const float4* w8, const float* v8) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    acc0 = acc0 + w8[j].x * v8[2 * j];
                    acc1 = acc1 + w8[j].y * v8[2 * j];
                    acc0 = acc0 + w8[j].z * v8[2 * j + 1];
                    acc1 = acc1 + w8[j].w * v8[2 * j + 1];
                }
            };
            if (groups > 0) {
                fetch(wa, va, 0);
                int g = 0;
                for (; g + 2 <= groups; g += 2) {
                    fetch(wb, vb, 8 * g + 8);
                    sum8(wa, va);
                    fetch(wa, va, 8 * g + 16);
                    sum8(wb, vb);
                }
                if (g < groups) sum8(wa, va);
                k = 8 * groups;
            }
            for (; k + 2 <= cnt; k += 2) {
                const float4 w = w4[(k >> 1) * 4];
                const float v0 = value(vt, k, kb + k);
                const float v1 = value(vt, k + 1, kb + k + 1);
                acc0 = acc0 + w.x * v0;
                acc1 = acc1 + w.y * v0;
                acc0 = acc0 + w.z * v1;
                acc1 = acc1 + w.w * v1;
            }
            if (k < cnt) {
                const float2 w = *(const float2*)(w_s + sink_widx(kb + k, 2 * warp));
                const float v0 = value(vt, k, kb + k);
                acc0 = acc0 + w.x * v0;
                acc1 = acc1 + w.y * v0;
            }
        }
        __syncthreads();  // stages, weights and list consumed
    }

    if (rp.dims > 0) {
        const float pA = __shfl_xor_sync(FULL_MASK, acc0, 1);
        const float pB = __shfl_xor_sync(FULL_MASK, acc1, 1);
        if (rotated) {
            if (((c - nope) & 1) == 0) {
                acc0 = acc0 * rcs - pA * rsn;
                acc1 = acc1 * rcs - pB * rsn;
            } else {
                acc0 = pA * rsn + acc0 * rcs;
                acc1 = pB * rsn + acc1 * rcs;
            }
        }
    }
    if (c >= 0 && c < d) {
        if (hA < heads) out[((size_t)i * heads + hA) * d + c] = acc0;
        if (hB < heads) out[((size_t)i * heads + hB) * d + c] = acc1;
    }
}

// Kernel 2: softmax and weighted value sums (sink_attend_body), the output
// rope included. vmode: 1 f32 rows may go in 16-byte pieces, 2 f16 rows in
// pairs of halves.
extern "C" __global__ void __launch_bounds__(SINK_AT, 1)
    sink_attend(const void* win, const void* rows, const i32* sel, const float* sinks,
                const float* scores, float* out, const u32* step, u32 qpos, u32 window, u32 ring,
                u32 ratio, u32 m, int top_k, int heads, int d, int flags, int slots, int row0,
                int shift, int rope_dims, float rope_base, int yarn, float yarn_factor,
                u32 yarn_orig_ctx, float yarn_beta_fast, float yarn_beta_slow, int rope_inverse,
                int vmode) {
    pdl_sync();
    // Padding: the pipelined loops read up to 15 keys past the last one
    // (7 past a stage).
    __shared__ __align__(16) float w_s[(SINK_WCAP + SINK_PAD) * SINK_AH];
    __shared__ __align__(16) float vs[(SINK_VS * SINK_VK + SINK_PAD / 2) * SINK_AC];
    __shared__ int key_src[SINK_WCAP + SINK_PAD];
    __shared__ u16 key_slot[SINK_WCAP];
    __shared__ int warp_tot[SINK_AT / 32];
    __shared__ float mx_s[SINK_AH], den_s[SINK_AH];
    const SinkGeom g = sink_geom(win, rows, sel, step, qpos, window, ring, ratio, m, top_k, d,
                                 flags);
    const int local = blockIdx.z, i = row0 + local;
    SinkRope rp;
    rp.shift = shift;
    rp.dims = rope_dims;
    rp.base = rope_base;
    rp.yarn = yarn;
    rp.factor = yarn_factor;
    rp.orig_ctx = yarn_orig_ctx;
    rp.beta_fast = yarn_beta_fast;
    rp.beta_slow = yarn_beta_slow;
    rp.inverse = rope_inverse;
    // Rows are never read by a window-only layer: its kind is the window's.
    const int f = ratio == 0 ? (flags & 1) * 3 : flags;
    if (f == 0)
        sink_attend_body<0>(g, sinks, scores, out, heads, slots, local, i, rp, vmode, w_s, vs,
                            key_src, key_slot, warp_tot, mx_s, den_s);
    else if (f == 3)
        sink_attend_body<1>(g, sinks, scores, out, heads, slots, local, i, rp, vmode, w_s, vs,
                            key_src, key_slot, warp_tot, mx_s, den_s);
    else
        sink_attend_body<2>(g, sinks, scores, out, heads, slots, local, i, rp, vmode, w_s, vs,
                            key_src, key_slot, warp_tot, mx_s, den_s);
}
