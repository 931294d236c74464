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
