// Hyper-connections (DeepSeek-V4), as cpu/hyper.rs and the reference's
// hc_mix_row. Decode (one row) is latency bound: every kernel issues its
// loads together, before using any, and keeps block barriers few.
//
// - hc_mix_f32: one block per row (hyper.rs picks 1024 threads for few
//   rows, 256 for many). The streams' sum of squares (f64 of f32 squares,
//   in any order) is taken in 16-byte loads, four in flight per thread, with
//   a weighted sum beside it that bounds the error of the CPU's sequential
//   sum (hc_mix_margin); every thread gets the block's tree sum. The mixer
//   outputs are scaled by the inverse RMS when both ends of that bound give
//   every scaled f32 (else warp 0 sums exactly, common.cu). Then, for hc <=
//   5, warp 0 runs the whole Sinkhorn in registers (lane a * hc + b holds
//   comb[a][b]; the row and column sums gather their hc values by shuffles
//   and add them in index order, as the CPU) while warp 1 writes pre and
//   post; for more streams the block runs it through shared memory. The f64
//   exp of the sigmoids and of the softmax is CUDA's where the CPU calls
//   glibc's (both within an ulp): a tolerance, not bits (see the tests).
//   The Sinkhorn is the decode floor: 2 * iters dependent phases of a
//   gather, hc f64 additions and an IEEE f64 division (about 4 us of the
//   9.5 us a row takes on the H200 at 20 iterations).
// - hc_mix_cl_f32 (sm_90, hc <= 5, with streams, bounded sums): a cluster
//   of HC_CLUSTER blocks per row splits the streams' loads and sums over
//   that many SMs; each block pushes its partial sums into block 0's shared
//   memory, which finishes the row as above.
// - hc_collapse_f32: one block per row; y = sum_k c_k x_k accumulated in
//   f32 from 0 in stream order (float4 for hc = 4). With the weight, y is
//   staged (in shared memory when it fits, else in the output row) and
//   scaled by f32(1 / sqrt(mean + eps)), computed in f64 from the exact f64
//   sum of f32 squares (bounded tree sum, exact fallback), then (y * scale)
//   * w. When one pass covers the row, the weights are loaded with the
//   streams and y stays in registers. Bit-exact.
// - hc_collapse_cl_f32 (sm_90, hc = 4, d <= 4096, bounded sums): a cluster
//   of HC_CLUSTER blocks per row, one float4 column group per thread; each
//   block pushes its partial sum into every block's shared memory (each
//   adds them in the same tree, so all get the same total); the rare exact
//   fallback reads y from the blocks' shared memory. Bit-exact.
// - hc_expand_f32: grid (rows, blocks over d); a thread owns column i of a
//   row and writes it in every stream j: post_j f + comb[0][j] x_0 + ...,
//   in f32, in that order. Bit-exact.

#define HC_BLOCK 256
#define HC_MAX 16           // streams of hc_mix: the block path has hc * hc <= 256 threads
#define HC_WARP_STREAMS 5   // up to this many streams the Sinkhorn runs in one warp (hc * hc <= 32)
#define HC_CLUSTER 8        // blocks per row of the cluster kernels (the portable maximum)
#define HC_CL_BLOCK 128     // threads per block of the cluster kernels

// ---- clusters (sm_90) ------------------------------------------------------------
#if __CUDA_ARCH__ >= 900
#define HC_CLUSTER_DIMS __cluster_dims__(HC_CLUSTER, 1, 1)
DEV u32 hc_cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// Every thread of every block of the cluster arrives once, then waits once,
// per phase. The relaxed arrival only says "started" (a block's shared
// memory may be accessed once every block has started).
DEV void hc_cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
DEV void hc_cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
DEV void hc_cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// The address of this block's shared `p` in block `rank` of the cluster.
DEV u32 hc_cluster_addr(const void* p, u32 rank) {
    u32 a, ra;
    asm("{ .reg .u64 g; cvta.to.shared.u64 g, %1; cvt.u32.u64 %0, g; }" : "=r"(a) : "l"(p));
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    return ra;
}
DEV double hc_ld_cluster_f64(u32 addr) {
    double v;
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(addr) : "memory");
    return v;
}
DEV float hc_ld_cluster_f32(u32 addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
    return v;
}
DEV void hc_st_cluster_f64(u32 addr, double v) {
    asm volatile("st.shared::cluster.f64 [%0], %1;" ::"r"(addr), "d"(v) : "memory");
}
#else
// No clusters before sm_90: hyper.rs never launches the _cl kernels there.
#define HC_CLUSTER_DIMS
DEV u32 hc_cluster_rank() { return 0; }
DEV void hc_cluster_arrive_relaxed() {}
DEV void hc_cluster_arrive() {}
DEV void hc_cluster_wait() {}
DEV u32 hc_cluster_addr(const void*, u32) { return 0; }
DEV double hc_ld_cluster_f64(u32) { return 0.0; }
DEV float hc_ld_cluster_f32(u32) { return 0.0f; }
DEV void hc_st_cluster_f64(u32, double) {}
#endif

// ---- sums ---------------------------------------------------------------------------

DEV float hc_sq(float v) { return __fmul_rn(v, v); }

// The f64 terms (f32 squares) of four values, summed (any order will do).
DEV double hc_sq4(float4 v) {
    return ((double)hc_sq(v.x) + (double)hc_sq(v.y)) + ((double)hc_sq(v.z) + (double)hc_sq(v.w));
}

// Tree sums over the block (blockDim.x a multiple of 32) of every thread's
// `a` and `b`: butterflies, whose partners add the same two values, so every
// thread gets the same sums. `red` (shared, 64 doubles) is used once.
DEV void hc_block_total2(double* a, double* b, double* red) {
    double u = *a, v = *b;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        u += __shfl_xor_sync(FULL_MASK, u, o);
        v += __shfl_xor_sync(FULL_MASK, v, o);
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) {
        red[w] = u;
        red[32 + w] = v;
    }
    __syncthreads();
    const bool in = lane < (int)(blockDim.x >> 5);
    u = in ? red[lane] : 0.0;
    v = in ? red[32 + lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        u += __shfl_xor_sync(FULL_MASK, u, o);
        v += __shfl_xor_sync(FULL_MASK, v, o);
    }
    *a = u;
    *b = v;
}

// The same for one value (`red`: 32 doubles).
DEV double hc_block_total(double v, double* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    const int lane = threadIdx.x & 31;
    if (lane == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// This thread's share of the sum of the f32 squares of xr[0, n) (terms
// i = lo + ..., the row's first index `first`) and of the same terms
// weighted by (len - i), where i is the index in the whole row of `len`
// values: strided over `threads` threads, four loads in flight.
DEV void hc_sq_partial(const float* xr, int n, int first, int len, bool vec, int t, int threads,
                       double* s, double* p) {
    double a = 0.0, b = 0.0;
    if (vec) {  // xr 16-byte aligned, n a multiple of 4
        const float4* x4 = (const float4*)xr;
        const int n4 = n >> 2;
        for (int q0 = t; q0 < n4; q0 += 4 * threads) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int q = q0 + u * threads;
                v[u] = q < n4 ? x4[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const double i = (double)(len - first - 4 * (q0 + u * threads));
                const double t0 = (double)hc_sq(v[u].x), t1 = (double)hc_sq(v[u].y);
                const double t2 = (double)hc_sq(v[u].z), t3 = (double)hc_sq(v[u].w);
                a += (t0 + t1) + (t2 + t3);
                b += ((t0 * i + t1 * (i - 1.0)) + (t2 * (i - 2.0) + t3 * (i - 3.0)));
            }
        }
    } else {
        for (int i0 = t; i0 < n; i0 += 4 * threads) {
            float v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int i = i0 + u * threads;
                v[u] = i < n ? xr[i] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const double tv = (double)hc_sq(v[u]);
                a += tv;
                b += tv * (double)(len - first - (i0 + u * threads));
            }
        }
    }
    *s = a;
    *p = b;
}

// Where the CPU's sequential sum S of the n terms t_i >= 0 can lie around
// the tree sum `s`: each of its additions rounds by at most 2^-53 of its
// partial sum, so |S - exact| <= 2^-53 sum_i S_i <= 2^-53 (1 + n 2^-53) P,
// P = sum_i t_i (n - i) (`p`, the weighted sum); and the tree sum, whose
// additions chain at most n / 32 + 32 deep, lies within 2^-53 (n / 32 +
// 32) s (1 + ...) of the exact sum. (About n / 2 units of 2^-53 for
// even terms: the exact fallback is needed about once in 4000 rows.)
DEV double hc_mix_margin(double s, double p, int n) {
    const double depth = (double)(n / 32 + 32);
    return __dmul_rn(__dadd_rn(p, __dmul_rn(depth, s)), 0x1.00001p-53);
}

// The CPU's sequential f64 sum of term(i) >= 0, exactly (warp 0: in order,
// or the exact parallel scheme); every thread of the block gets it.
template <class Term>
DEV double hc_exact_sum(Term term, int n, int method, SeqSumScratch* sc, double* slot) {
    if (threadIdx.x < 32) {
        const double s =
            method == SUM_SEQUENTIAL ? seq_sum_plain(term, n) : seq_sum_nonneg(term, n, sc);
        if (threadIdx.x == 0) *slot = s;
    }
    __syncthreads();
    return *slot;
}

// Any order of summing n terms >= 0 lies within (n - 1) 2^-53 of their sum
// of the exact sum, so the CPU's sequential sum lies within this margin
// (twice that bound, and more) of the block's tree sum `s`.
DEV double hc_sum_margin(double s, int n) { return s * ((double)(n + 2) * 0x1p-50); }

// `1.0 / (sum / n + eps).sqrt()` in f64, as the CPU: monotone in `sum`.
DEV double hc_inv_rms(double sum, int n, float eps) {
    return 1.0 / sqrt(sum / (double)n + (double)eps);
}

// hc_inv_rms at both ends of [sum - margin, sum + margin], even lanes
// taking one and odd lanes the other (every lane of the warp calls it):
// `lo` = inv(sum + margin), `hi` = inv(sum - margin).
DEV void hc_inv_rms_pair(double sum, double margin, int n, float eps, double* lo, double* hi) {
    const bool odd = threadIdx.x & 1;
    const double v = hc_inv_rms(odd ? sum - margin : sum + margin, n, eps);
    const double w = __shfl_xor_sync(FULL_MASK, v, 1);
    *lo = odd ? w : v;
    *hi = odd ? v : w;
}

// ---- hc_mix -----------------------------------------------------------------------

// `m as f64 * s as f64 + b as f64`, unfused.
DEV double hc_lin(float m, float s, float b) {
    return __dadd_rn(__dmul_rn((double)m, (double)s), (double)b);
}

DEV double hc_sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

// The base and scale a thread of the warp paths needs, loaded at the start:
// warp 0 lane l: comb entry l; warp 1 lane k: pre (k < hc) or post.
DEV void hc_coeff_preload(const float* scale, const float* base, int mix, int hc, float* mb,
                          float* ms) {
    *mb = 0.0f;
    *ms = 0.0f;
    if (hc > HC_WARP_STREAMS) return;
    const int t = threadIdx.x, lane = t & 31;
    if (t < 32) {
        if (mix == hc) return;
        const int j = 2 * hc + min(lane, hc * hc - 1);
        *mb = base[j];
        *ms = scale[2];
    } else if (t < 64) {
        const int np = mix == hc ? hc : 2 * hc;
        if (np == 0) return;
        const int k = min(lane, np - 1);
        *mb = base[k];
        *ms = scale[k < hc ? 0 : 1];
    }
}

#define HC_GATHER_N(HC) ((HC) > 0 ? (HC) : HC_WARP_STREAMS)

// g[k] = the value `v` of lane first + k * stride, k < hc (k past hc - 1
// reads the last).
template <int HC>
DEV void hc_gather(double v, int first, int stride, int hc, double* g) {
#pragma unroll
    for (int k = 0; k < HC_GATHER_N(HC); k++)
        g[k] = __shfl_sync(FULL_MASK, v, (first + (HC > 0 ? k : min(k, hc - 1)) * stride) & 31);
}

// Their sum in index order, as the CPU's `iter().sum()` (which starts from
// -0.0: adding the first value to it gives that value).
template <int HC>
DEV double hc_gather_sum(double v, int first, int stride, int hc) {
    double g[HC_GATHER_N(HC)];
    hc_gather<HC>(v, first, stride, hc, g);
    double s = g[0];
#pragma unroll
    for (int k = 1; k < HC_GATHER_N(HC); k++)
        if (HC > 0 || k < hc) s = __dadd_rn(s, g[k]);
    return s;
}

// The Sinkhorn comb of hc_mix_row in warp 0 (hc * hc <= 32): lane l =
// a * hc + b holds comb[a][b]; `row` is the scaled row (shared), mb/ms the
// lane's base and scale (hc_coeff_preload).
template <int HC>
DEV void hc_sinkhorn_warp(const float* row, float mb, float ms, float* o, int hc_rt, int iters,
                          double deps) {
    const int hc = HC > 0 ? HC : hc_rt;
    const int lane = threadIdx.x & 31;
    const int a = lane / hc, b = lane - (lane / hc) * hc, first = a * hc;
    const double v = hc_lin(row[2 * hc + min(lane, hc * hc - 1)], ms, mb);
    double g[HC_GATHER_N(HC)];
    hc_gather<HC>(v, first, 1, hc, g);
    double mx = (double)NEG_INF;
#pragma unroll
    for (int k = 0; k < HC_GATHER_N(HC); k++)
        if (HC > 0 || k < hc) mx = fmax(mx, g[k]);
    const double e = exp(__dsub_rn(v, mx));  // softmax: e / sum + eps
    double c = __dadd_rn(__ddiv_rn(e, hc_gather_sum<HC>(e, first, 1, hc)), deps);
    c = __ddiv_rn(c, __dadd_rn(hc_gather_sum<HC>(c, b, hc, hc), deps));  // the first columns
    for (int it = 1; it < iters; it++) {
        c = __ddiv_rn(c, __dadd_rn(hc_gather_sum<HC>(c, first, 1, hc), deps));
        c = __ddiv_rn(c, __dadd_rn(hc_gather_sum<HC>(c, b, hc, hc), deps));
    }
    if (lane < hc * hc) o[2 * hc + lane] = __double2float_rn(c);
}

// Pre (k < hc) and post (hc <= k < 2 hc) in warp 1's lanes.
DEV void hc_pre_post(const float* row, float mb, float ms, float* o, int mix, int hc,
                     double deps) {
    const int k = threadIdx.x & 31;
    if (k >= (mix == hc ? hc : 2 * hc)) return;
    const double sg = hc_sigmoid(hc_lin(row[k], ms, mb));
    o[k] = __double2float_rn(k < hc ? __dadd_rn(sg, deps) : __dmul_rn(2.0, sg));
}

// Pre, post and the Sinkhorn for hc > HC_WARP_STREAMS, by the whole block
// (at least hc * hc threads): thread t = a * hc + b holds comb[a][b];
// phases alternate the two shared buffers, one barrier each (a buffer is
// written two phases after its last reads, a barrier between).
DEV void hc_sinkhorn_block(const float* row, const float* scale, const float* base, float* o,
                           int mix, int hc, int iters, double deps, double* cbuf) {
    const int t = threadIdx.x;
    double* cb0 = cbuf;
    double* cb1 = cbuf + HC_MAX * HC_MAX;
    if (t < hc) {
        o[t] = __double2float_rn(__dadd_rn(hc_sigmoid(hc_lin(row[t], scale[0], base[t])), deps));
        if (mix != hc)
            o[hc + t] = __double2float_rn(
                __dmul_rn(2.0, hc_sigmoid(hc_lin(row[hc + t], scale[1], base[hc + t]))));
    }
    if (mix == hc) return;  // the head: pre only (uniform over the block)
    const bool mine = t < hc * hc;
    const int a = t / hc, b = t - (t / hc) * hc;
    double c = 0.0;
    if (mine) {
        c = hc_lin(row[2 * hc + t], scale[2], base[2 * hc + t]);
        cb0[t] = c;
    }
    __syncthreads();
    if (mine) {  // row softmax: e = exp(v - max)
        double mx = (double)NEG_INF;
        for (int k = 0; k < hc; k++) mx = fmax(mx, cb0[a * hc + k]);
        c = exp(__dsub_rn(c, mx));
        cb1[t] = c;
    }
    __syncthreads();
    if (mine) {  // e / sum + eps
        double sum = 0.0;
        for (int k = 0; k < hc; k++) sum = __dadd_rn(sum, cb1[a * hc + k]);
        c = __dadd_rn(__ddiv_rn(c, sum), deps);
        cb0[t] = c;
    }
    __syncthreads();
    if (mine) {  // the first column normalisation
        double sum = 0.0;
        for (int k = 0; k < hc; k++) sum = __dadd_rn(sum, cb0[k * hc + b]);
        c = __ddiv_rn(c, __dadd_rn(sum, deps));
    }
    for (int it = 1; it < iters; it++) {
        if (mine) cb1[t] = c;
        __syncthreads();
        if (mine) {  // rows
            double sum = 0.0;
            for (int k = 0; k < hc; k++) sum = __dadd_rn(sum, cb1[a * hc + k]);
            c = __ddiv_rn(c, __dadd_rn(sum, deps));
            cb0[t] = c;
        }
        __syncthreads();
        if (mine) {  // columns
            double sum = 0.0;
            for (int k = 0; k < hc; k++) sum = __dadd_rn(sum, cb0[k * hc + b]);
            c = __ddiv_rn(c, __dadd_rn(sum, deps));
        }
    }
    if (mine) o[2 * hc + t] = __double2float_rn(c);
}

// The rest of hc_mix for one row, by every thread of the block (at least
// max(64, mix) threads; hc * hc for the block path): `mv` is this thread's
// mixer output (t < mix), `s` and `p` the block's tree sum of the streams'
// squares and its weighted sum (read with the bounded method only), xr the
// streams or null. `row`: shared, mix floats; cbuf: shared, 2 HC_MAX^2
// doubles (the block path only).
DEV void hc_mix_tail(float mv, double s, double p, const float* xr, float* o, const float* scale,
                     const float* base, float mb, float ms, int mix, int hc, int iters, float eps,
                     float norm_eps, int xc, int method, float* row, double* cbuf, double* exact,
                     SeqSumScratch* scratch) {
    const int t = threadIdx.x;
    if (xr) {
        double inv = 0.0;
        bool exact_needed = method != SUM_BOUNDED;  // uniform over the block
        if (method == SUM_BOUNDED) {
            double inv_hi;
            hc_inv_rms_pair(s, hc_mix_margin(s, p, xc), xc, norm_eps, &inv, &inv_hi);
            bool differ = false;
            if (t < mix)
                differ = __float_as_uint(__double2float_rn(__dmul_rn((double)mv, inv))) !=
                         __float_as_uint(__double2float_rn(__dmul_rn((double)mv, inv_hi)));
            exact_needed = __syncthreads_or(differ) != 0;
        }
        if (exact_needed) {
            auto term = [&](int i) -> double { return (double)hc_sq(xr[i]); };
            inv = hc_inv_rms(hc_exact_sum(term, xc, method, scratch, exact), xc, norm_eps);
        }
        mv = __double2float_rn(__dmul_rn((double)mv, inv));
    }
    if (t < mix) row[t] = mv;
    __syncthreads();
    const double deps = (double)eps;
    if (hc > HC_WARP_STREAMS) {
        hc_sinkhorn_block(row, scale, base, o, mix, hc, iters, deps, cbuf);
    } else if (t < 32) {
        if (mix != hc) {
            if (hc == 4) hc_sinkhorn_warp<4>(row, mb, ms, o, hc, iters, deps);
            else hc_sinkhorn_warp<0>(row, mb, ms, o, hc, iters, deps);
        }
    } else if (t < 64) {
        hc_pre_post(row, mb, ms, o, mix, hc, deps);
    }
}

// m, out: [rows, mix] (out may be m); scale: [3] ([1] when mix == hc);
// base: [mix]; x: [rows, xc] streams, or null (no normalisation).
extern "C" __global__ void __launch_bounds__(1024)
    hc_mix_f32(const float* m, const float* __restrict__ scale, const float* __restrict__ base,
               const float* __restrict__ x, float* out, int mix, int hc, int iters, float eps,
               float norm_eps, int xc, int method) {
    pdl_sync();
    __shared__ float row[HC_MAX * (HC_MAX + 2)];
    __shared__ double cbuf[2 * HC_MAX * HC_MAX];
    __shared__ double red[64];
    __shared__ double exact;
    __shared__ SeqSumScratch scratch;
    const int r = blockIdx.x, t = threadIdx.x;
    // Everything read ahead of the streams (out may alias m: every read of m
    // is before the tail's first barrier).
    const float mv = t < mix ? m[(size_t)r * mix + t] : 0.0f;
    float mb, ms;
    hc_coeff_preload(scale, base, mix, hc, &mb, &ms);
    const float* xr = x ? x + (size_t)r * xc : nullptr;
    double s = 0.0, p = 0.0;
    if (xr) {
        const bool vec = (xc & 3) == 0 && ((size_t)x & 15) == 0;
        hc_sq_partial(xr, xc, 0, xc, vec, t, blockDim.x, &s, &p);
        hc_block_total2(&s, &p, red);
    }
    hc_mix_tail(mv, s, p, xr, out + (size_t)r * mix, scale, base, mb, ms, mix, hc, iters, eps,
                norm_eps, xc, method, row, cbuf, &exact, &scratch);
}

// As hc_mix_f32 with a cluster of HC_CLUSTER blocks of HC_CL_BLOCK threads
// per row (grid: rows * HC_CLUSTER): hc <= HC_WARP_STREAMS, streams
// present, the bounded sum method (hyper.rs checks).
extern "C" __global__ void HC_CLUSTER_DIMS __launch_bounds__(HC_CL_BLOCK)
    hc_mix_cl_f32(const float* m, const float* __restrict__ scale,
                  const float* __restrict__ base, const float* __restrict__ x, float* out,
                  int mix, int hc, int iters, float eps, float norm_eps, int xc, int method) {
    pdl_sync();
    __shared__ float row[HC_WARP_STREAMS * (HC_WARP_STREAMS + 2)];
    __shared__ double red[64];
    __shared__ double part[2 * HC_CLUSTER];  // block 0: block k's sums at k, HC_CLUSTER + k
    __shared__ double exact;
    __shared__ SeqSumScratch scratch;
    hc_cluster_arrive_relaxed();  // this block has started
    const u32 rank = hc_cluster_rank();
    const int r = blockIdx.x / HC_CLUSTER, t = threadIdx.x;
    float mv = 0.0f, mb = 0.0f, ms = 0.0f;
    if (rank == 0) {
        mv = t < mix ? m[(size_t)r * mix + t] : 0.0f;
        hc_coeff_preload(scale, base, mix, hc, &mb, &ms);
    }
    // This block's slice of the streams (whole 16-byte groups when aligned).
    const float* xr = x + (size_t)r * xc;
    const bool vec = (xc & 3) == 0 && ((size_t)x & 15) == 0;
    const int unit = vec ? 4 : 1;
    const int per = (xc / unit + HC_CLUSTER - 1) / HC_CLUSTER * unit;
    const int lo = min(xc, (int)rank * per), n = min(xc - lo, per);
    double s, p;
    hc_sq_partial(xr + lo, n, lo, xc, vec, t, HC_CL_BLOCK, &s, &p);
    hc_block_total2(&s, &p, red);
    hc_cluster_wait();  // every block has started: push the sums into block 0
    if (t == 0) {
        hc_st_cluster_f64(hc_cluster_addr(&part[rank], 0), s);
        hc_st_cluster_f64(hc_cluster_addr(&part[HC_CLUSTER + rank], 0), p);
    }
    hc_cluster_arrive();
    hc_cluster_wait();
    if (rank != 0) return;  // (nothing reads the other blocks' shared memory)
    // The same tree in every thread: lanes 8g + k take block k's sums.
    s = part[t & (HC_CLUSTER - 1)];
    p = part[HC_CLUSTER + (t & (HC_CLUSTER - 1))];
#pragma unroll
    for (int o = HC_CLUSTER / 2; o > 0; o >>= 1) {
        s += __shfl_xor_sync(FULL_MASK, s, o);
        p += __shfl_xor_sync(FULL_MASK, p, o);
    }
    hc_mix_tail(mv, s, p, xr, out + (size_t)r * mix, scale, base, mb, ms, mix, hc, iters, eps,
                norm_eps, xc, method, row, nullptr, &exact, &scratch);
}

// ---- hc_collapse --------------------------------------------------------------------

// ((((0 + c0 a0) + c1 a1) + c2 a2) + c3 a3) in f32, unfused: the CPU's order.
DEV float hc_comb4(float c0, float c1, float c2, float c3, float a0, float a1, float a2,
                   float a3) {
    float acc = __fadd_rn(0.0f, __fmul_rn(c0, a0));
    acc = __fadd_rn(acc, __fmul_rn(c1, a1));
    acc = __fadd_rn(acc, __fmul_rn(c2, a2));
    return __fadd_rn(acc, __fmul_rn(c3, a3));
}

DEV float4 hc_comb4v(float c0, float c1, float c2, float c3, float4 a0, float4 a1, float4 a2,
                     float4 a3) {
    return make_float4(hc_comb4(c0, c1, c2, c3, a0.x, a1.x, a2.x, a3.x),
                       hc_comb4(c0, c1, c2, c3, a0.y, a1.y, a2.y, a3.y),
                       hc_comb4(c0, c1, c2, c3, a0.z, a1.z, a2.z, a3.z),
                       hc_comb4(c0, c1, c2, c3, a0.w, a1.w, a2.w, a3.w));
}

// (y * s) * w, unfused.
DEV float4 hc_scale4(float4 y, float s, float4 w) {
    return make_float4(__fmul_rn(__fmul_rn(y.x, s), w.x), __fmul_rn(__fmul_rn(y.y, s), w.y),
                       __fmul_rn(__fmul_rn(y.z, s), w.z), __fmul_rn(__fmul_rn(y.w, s), w.w));
}

DEV float hc_collapse_scale(double sum, int d, float eps) {
    return __double2float_rn(hc_inv_rms(sum, d, eps));
}

// Whether the bounded sum decides the scale: hc_collapse_scale at both
// ends of the margin around the tree sum `sum` (even and odd lanes, every
// lane of the warp calls it) agree; `s` gets it.
DEV bool hc_collapse_scale_bounded(double sum, int d, float eps, float* s) {
    const bool odd = threadIdx.x & 1;
    const double margin = hc_sum_margin(sum, d);
    const float v = hc_collapse_scale(odd ? sum - margin : sum + margin, d, eps);
    const float w = __shfl_xor_sync(FULL_MASK, v, 1);
    *s = v;
    return __float_as_uint(v) == __float_as_uint(w);
}

// x: [rows, hc * d]; co: [rows, cc >= hc]; w: [d] or null (no norm);
// out: [rows, d]. With `staged`, d floats of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(1024)
    hc_collapse_f32(const float* __restrict__ x, const float* __restrict__ co,
                    const float* __restrict__ w, float* out, int hc, int d, int cc,
                    float norm_eps, int staged, int method) {
    pdl_sync();
    extern __shared__ float4 hc_collapse_stage[];
    __shared__ double red[32];
    __shared__ double exact;
    __shared__ SeqSumScratch scratch;
    const int r = blockIdx.x, t = threadIdx.x, B = blockDim.x;
    const float* xr = x + (size_t)r * hc * d;
    const float* c = co + (size_t)r * cc;
    float* o = out + (size_t)r * d;
    float* y = (w && staged) ? (float*)hc_collapse_stage : o;
    // hc = 4 in 16-byte groups (y's stage is 16-byte aligned either way).
    const bool vec = hc == 4 && (d & 3) == 0 && (((size_t)x | (size_t)out | (size_t)w) & 15) == 0;
    const int n4 = d >> 2;
    const bool one_pass = vec && n4 <= B;  // y and w of the thread's group stay in registers
    float4 y0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), w0 = y0;
    double part = 0.0;
    if (vec) {
        const float c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
        const float4* x4 = (const float4*)xr;
        if (w && one_pass && t < n4) w0 = ((const float4*)w)[t];
#pragma unroll 2
        for (int q = t; q < n4; q += B) {
            const float4 v =
                hc_comb4v(c0, c1, c2, c3, x4[q], x4[n4 + q], x4[2 * n4 + q], x4[3 * n4 + q]);
            if (q == t) y0 = v;
            ((float4*)y)[q] = v;
            if (w) part += hc_sq4(v);
        }
    } else {
        for (int i = t; i < d; i += B) {
            float acc = 0.0f;
            for (int k = 0; k < hc; k++)
                acc = __fadd_rn(acc, __fmul_rn(c[k], xr[(size_t)k * d + i]));
            y[i] = acc;
            if (w) part += (double)hc_sq(acc);
        }
    }
    if (!w) return;  // uniform over the block
    const double sum = hc_block_total(part, red);  // its barrier also publishes y
    float s = 0.0f;
    bool exact_needed = method != SUM_BOUNDED;  // uniform over the block
    if (method == SUM_BOUNDED) exact_needed = !hc_collapse_scale_bounded(sum, d, norm_eps, &s);
    if (exact_needed) {
        auto term = [&](int i) -> double { return (double)hc_sq(y[i]); };
        s = hc_collapse_scale(hc_exact_sum(term, d, method, &scratch, &exact), d, norm_eps);
    }
    if (vec) {
        float4* o4 = (float4*)o;
        if (one_pass) {
            if (t < n4) o4[t] = hc_scale4(y0, s, w0);
        } else {
            for (int q = t; q < n4; q += B)
                o4[q] = hc_scale4(((const float4*)y)[q], s, ((const float4*)w)[q]);
        }
    } else {
        // Every read of y is behind the barriers of the sums above.
        for (int i = t; i < d; i += B) o[i] = __fmul_rn(__fmul_rn(y[i], s), w[i]);
    }
}

// As hc_collapse_f32 for hc = 4 with the norm, d a multiple of 4 and at
// most 4 * HC_CL_BLOCK * HC_CLUSTER, 16-byte aligned x, w and out, the
// bounded sum method (hyper.rs checks): a cluster of HC_CLUSTER blocks per
// row (grid: rows * HC_CLUSTER), a float4 column group per thread.
extern "C" __global__ void HC_CLUSTER_DIMS __launch_bounds__(HC_CL_BLOCK)
    hc_collapse_cl_f32(const float* __restrict__ x, const float* __restrict__ co,
                       const float* __restrict__ w, float* out, int d, int cc, float norm_eps) {
    pdl_sync();
    __shared__ float4 ys[HC_CL_BLOCK];
    __shared__ double red[32];
    __shared__ double part[HC_CLUSTER];  // block k's partial sum at k (pushed into every block)
    __shared__ double exact;
    hc_cluster_arrive_relaxed();  // this block has started
    const u32 rank = hc_cluster_rank();
    const int r = blockIdx.x / HC_CLUSTER, t = threadIdx.x;
    const int n4 = d >> 2, per = (n4 + HC_CLUSTER - 1) / HC_CLUSTER;
    const int q = (int)rank * per + t;
    const bool active = t < per && q < n4;
    const float* c = co + (size_t)r * cc;
    const float c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f), g = v;
    if (active) {
        const float4* x4 = (const float4*)(x + (size_t)r * 4 * d);
        g = ((const float4*)w)[q];
        v = hc_comb4v(c0, c1, c2, c3, x4[q], x4[n4 + q], x4[2 * n4 + q], x4[3 * n4 + q]);
    }
    ys[t] = v;
    const double sb = hc_block_total(active ? hc_sq4(v) : 0.0, red);
    hc_cluster_wait();  // every block has started: thread k pushes the sum into block k
    if (t < HC_CLUSTER) hc_st_cluster_f64(hc_cluster_addr(&part[rank], t), sb);
    hc_cluster_arrive();  // (also publishes ys)
    hc_cluster_wait();
    // The same tree in every thread of every block: lanes 8g + k take block k's sum.
    double sum = part[t & (HC_CLUSTER - 1)];
#pragma unroll
    for (int o = HC_CLUSTER / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o);
    float s;
    if (!hc_collapse_scale_bounded(sum, d, norm_eps, &s)) {
        // Rare (and uniform over the cluster): lane 0 of each block sums
        // the row's y in order, read from the blocks' shared memory.
        auto term = [&](int i) -> double {
            const int gq = i >> 2, owner = gq / per;
            const u32 a = hc_cluster_addr((const float*)&ys[gq - owner * per] + (i & 3), owner);
            return (double)hc_sq(hc_ld_cluster_f32(a));
        };
        if (t < 32) {
            const double e = seq_sum_plain(term, d);
            if (t == 0) exact = e;
        }
        __syncthreads();
        s = hc_collapse_scale(exact, d, norm_eps);
        hc_cluster_arrive();  // done with the other blocks' shared memory
        hc_cluster_wait();
    }
    if (active) ((float4*)(out + (size_t)r * d))[q] = hc_scale4(v, s, g);
}

// ---- hc_expand ----------------------------------------------------------------------

// x, out: [rows, hc * d]; f: [rows, d]; co: [rows, (2 + hc) hc] as hc_mix
// writes it (post at hc + j, comb[a][j] at 2 hc + a hc + j).
extern "C" __global__ void __launch_bounds__(128)
    hc_expand_f32(const float* __restrict__ x, const float* __restrict__ f,
                  const float* __restrict__ co, float* __restrict__ out, int hc, int d) {
    pdl_sync();
    const int r = blockIdx.x;
    const size_t xc = (size_t)hc * d;
    const float* c = co + (size_t)r * (2 + hc) * hc;
    const float* xr = x + (size_t)r * xc;
    float* o = out + (size_t)r * xc;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < d; i += gridDim.y * blockDim.x) {
        const float fv = f[(size_t)r * d + i];
        for (int j = 0; j < hc; j++) {
            float acc = __fmul_rn(c[hc + j], fv);
            for (int a = 0; a < hc; a++)
                acc = __fadd_rn(acc, __fmul_rn(c[2 * hc + a * hc + j], xr[(size_t)a * d + i]));
            o[(size_t)j * d + i] = acc;
        }
    }
}
