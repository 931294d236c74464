// Hyper-connections (DeepSeek-V4), as cpu/hyper.rs and the reference's
// hc_mix_row:
//
// - hc_mix_f32: one block per row. The row of mixer outputs is staged in
//   shared memory; with the streams input it is first scaled by the
//   streams' f64 inverse RMS (the f64 sum of f32 squares in index order,
//   reproduced exactly: a block tree sum whose error bound fixes every
//   scaled f32, else warp 0's exact sum of common.cu). Then threads k < hc
//   write pre and post, and thread a * hc + b holds comb[a][b] through the
//   Sinkhorn iterations in f64, every row/column sum taken in index order
//   (by each thread of that row/column, from shared memory). The f64 exp
//   of the sigmoids and of the softmax is CUDA's where the CPU calls
//   glibc's (both within an ulp): a tolerance, not bits (see the tests).
// - hc_collapse_f32: one block per row; y = sum_k c_k x_k accumulated in
//   f32 from 0 in stream order. With the weight, y is staged (in shared
//   memory when it fits, else in the output row) and scaled by f32(1 /
//   sqrt(mean + eps)), computed in f64 from the exact f64 sum of f32
//   squares, then (y * scale) * w. Bit-exact.
// - hc_expand_f32: grid (rows, blocks over d); a thread owns column i of a
//   row and writes it in every stream j: post_j f + comb[0][j] x_0 + ...,
//   in f32, in that order. Bit-exact.

#define HC_BLOCK 256
#define HC_MAX 16  // streams of hc_mix: one thread per comb entry, hc * hc <= HC_BLOCK

// Sum of term(i), i in [0, n), over the block in some tree order; every
// thread gets the same value. `red` is shared scratch of HC_BLOCK / 32.
template <class Term>
DEV double hc_block_sum(Term term, int n, double* red) {
    double s0 = 0.0, s1 = 0.0;
    int i = threadIdx.x;
    for (; i + HC_BLOCK < n; i += 2 * HC_BLOCK) {
        s0 += term(i);
        s1 += term(i + HC_BLOCK);
    }
    if (i < n) s0 += term(i);
    double s = s0 + s1;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
    __syncthreads();  // `red` is free (an earlier call may still read it)
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < HC_BLOCK / 32; w++) t += red[w];
    return t;
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

// `m as f64 * s as f64 + b as f64`, unfused.
DEV double hc_lin(float m, float s, float b) {
    return __dadd_rn(__dmul_rn((double)m, (double)s), (double)b);
}

DEV double hc_sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

// m, out: [rows, mix]; scale: [3] ([1] when mix == hc); base: [mix];
// x: [rows, xc] streams, or null (no normalisation).
extern "C" __global__ void __launch_bounds__(HC_BLOCK)
    hc_mix_f32(const float* m, const float* __restrict__ scale, const float* __restrict__ base,
               const float* __restrict__ x, float* out, int mix, int hc, int iters, float eps,
               float norm_eps, int xc, int method) {
    pdl_sync();
    __shared__ float row[HC_MAX * (HC_MAX + 2)];
    __shared__ double cbuf[2][HC_MAX * HC_MAX];
    __shared__ double red[HC_BLOCK / 32];
    __shared__ double exact;
    __shared__ SeqSumScratch scratch;
    const int r = blockIdx.x, t = threadIdx.x;
    for (int j = t; j < mix; j += HC_BLOCK) row[j] = m[(size_t)r * mix + j];
    __syncthreads();
    if (x) {
        const float* xr = x + (size_t)r * xc;
        auto term = [&](int i) -> double {
            const float v = xr[i];
            return (double)(v * v);
        };
        double inv = 0.0;
        bool exact_needed = method != SUM_BOUNDED;  // uniform over the block
        if (method == SUM_BOUNDED) {
            const double s = hc_block_sum(term, xc, red);
            const double margin = hc_sum_margin(s, xc);
            inv = hc_inv_rms(s + margin, xc, norm_eps);
            const double inv_hi = hc_inv_rms(s - margin, xc, norm_eps);
            bool differ = false;
            for (int j = t; j < mix; j += HC_BLOCK) {
                const double v = (double)row[j];
                differ |= __float_as_uint(__double2float_rn(__dmul_rn(v, inv))) !=
                          __float_as_uint(__double2float_rn(__dmul_rn(v, inv_hi)));
            }
            exact_needed = __syncthreads_or(differ) != 0;
        }
        if (exact_needed)
            inv = hc_inv_rms(hc_exact_sum(term, xc, method, &scratch, &exact), xc, norm_eps);
        // Each thread rescales the entries it checked; the barrier publishes them.
        for (int j = t; j < mix; j += HC_BLOCK)
            row[j] = __double2float_rn(__dmul_rn((double)row[j], inv));
        __syncthreads();
    }
    float* o = out + (size_t)r * mix;
    const double deps = (double)eps;
    if (t < hc) {
        o[t] = __double2float_rn(__dadd_rn(hc_sigmoid(hc_lin(row[t], scale[0], base[t])), deps));
        if (mix != hc)
            o[hc + t] = __double2float_rn(
                __dmul_rn(2.0, hc_sigmoid(hc_lin(row[hc + t], scale[1], base[hc + t]))));
    }
    if (mix == hc) return;  // the head: pre only (uniform over the block)
    // Sinkhorn: thread t = a * hc + b holds comb[a][b] in `c`; phases
    // alternate the two shared buffers, one barrier each (a buffer is
    // written two phases after its last reads, a barrier between).
    const bool mine = t < hc * hc;
    const int a = t / hc, b = t - (t / hc) * hc;
    double c = 0.0;
    if (mine) {
        c = hc_lin(row[2 * hc + t], scale[2], base[2 * hc + t]);
        cbuf[0][t] = c;
    }
    __syncthreads();
    if (mine) {  // row softmax: e = exp(v - max)
        double mx = (double)NEG_INF;
        for (int k = 0; k < hc; k++) mx = fmax(mx, cbuf[0][a * hc + k]);
        c = exp(__dsub_rn(c, mx));
        cbuf[1][t] = c;
    }
    __syncthreads();
    if (mine) {  // e / sum + eps
        double sum = 0.0;
        for (int k = 0; k < hc; k++) sum = __dadd_rn(sum, cbuf[1][a * hc + k]);
        c = __dadd_rn(__ddiv_rn(c, sum), deps);
        cbuf[0][t] = c;
    }
    __syncthreads();
    if (mine) {  // the first column normalisation
        double sum = 0.0;
        for (int k = 0; k < hc; k++) sum = __dadd_rn(sum, cbuf[0][k * hc + b]);
        c = __ddiv_rn(c, __dadd_rn(sum, deps));
    }
    for (int it = 1; it < iters; it++) {
        if (mine) cbuf[1][t] = c;
        __syncthreads();
        if (mine) {  // rows
            double sum = 0.0;
            for (int k = 0; k < hc; k++) sum = __dadd_rn(sum, cbuf[1][a * hc + k]);
            c = __ddiv_rn(c, __dadd_rn(sum, deps));
            cbuf[0][t] = c;
        }
        __syncthreads();
        if (mine) {  // columns
            double sum = 0.0;
            for (int k = 0; k < hc; k++) sum = __dadd_rn(sum, cbuf[0][k * hc + b]);
            c = __ddiv_rn(c, __dadd_rn(sum, deps));
        }
    }
    if (mine) o[2 * hc + t] = __double2float_rn(c);
}

// x: [rows, hc * d]; co: [rows, cc >= hc]; w: [d] or null (no norm);
// out: [rows, d]. With `staged`, d floats of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(HC_BLOCK)
    hc_collapse_f32(const float* __restrict__ x, const float* __restrict__ co,
                    const float* __restrict__ w, float* out, int hc, int d, int cc,
                    float norm_eps, int staged, int method) {
    pdl_sync();
    extern __shared__ float hc_collapse_stage[];
    __shared__ double red[HC_BLOCK / 32];
    __shared__ double exact;
    __shared__ SeqSumScratch scratch;
    const int r = blockIdx.x, t = threadIdx.x;
    const float* xr = x + (size_t)r * hc * d;
    const float* c = co + (size_t)r * cc;
    float* o = out + (size_t)r * d;
    float* y = (w && staged) ? hc_collapse_stage : o;
    for (int i = t; i < d; i += HC_BLOCK) {
        float acc = 0.0f;
        for (int k = 0; k < hc; k++) acc = __fadd_rn(acc, __fmul_rn(c[k], xr[(size_t)k * d + i]));
        y[i] = acc;
    }
    if (!w) return;  // uniform over the block
    __syncthreads();
    auto term = [&](int i) -> double {
        const float v = y[i];
        return (double)(v * v);
    };
    auto finish = [&](double sum) -> float {
        return __double2float_rn(hc_inv_rms(sum, d, norm_eps));
    };
    float s = 0.0f;
    bool exact_needed = method != SUM_BOUNDED;  // uniform over the block
    if (method == SUM_BOUNDED) {
        const double sum = hc_block_sum(term, d, red);  // the same value in every thread
        const double margin = hc_sum_margin(sum, d);
        s = finish(sum + margin);
        exact_needed = __float_as_uint(s) != __float_as_uint(finish(sum - margin));
    }
    if (exact_needed) s = finish(hc_exact_sum(term, d, method, &scratch, &exact));
    // Every read of y is behind the barriers of the sums above.
    for (int i = t; i < d; i += HC_BLOCK) o[i] = __fmul_rn(__fmul_rn(y[i], s), w[i]);
}

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
