// Attention with a sink (sink_attention.cu), continued: kernel 2, the
// softmax and the weighted value sums with the output rope.

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
