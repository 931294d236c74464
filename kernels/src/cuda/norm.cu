// RMS norm and LayerNorm, bit-identical to the CPU kernels: the sums run in
// f64 in index order (reproduced exactly by `seq_sum_finish`), the scale is
// `1 / sqrtf(mean + eps)` in f32, the output `(x * scale) * w`.
// One warp (one block) per row; the row is staged in dynamic shared memory
// when the launch gives room for it (`stage_bytes`), else read in place.

DEV float* norm_stage(int cols) {
    extern __shared__ float norm_dyn[];
    return norm_dyn;
}

extern "C" __global__ void __launch_bounds__(32)
    rms_norm(const float* x, const float* w, float* out, int rows, int cols, float eps, int staged,
             int method) {
    pdl_sync();
    __shared__ SeqSumScratch scratch;
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = stage_row(x + (size_t)r * cols, staged ? norm_stage(cols) : 0, cols);
    auto term = [&](int i) -> double {
        const float v = xr[i];
        return (double)(v * v);
    };
    const float mean = seq_sum_finish(term, cols, &scratch, method, [&](double sum) {
        return __double2float_rn(sum / (double)cols);
    });
    const float scale = 1.0f / sqrtf(mean + eps);
    scale_row(xr, w, out + (size_t)r * cols, scale, cols);
}

// LayerNorm: the mean's sum has signed terms (never the exact parallel
// scheme); the squared deviations (exact f64 products) take any method.
extern "C" __global__ void __launch_bounds__(32) layer_norm(const float* x, const float* w,
                                                            const float* b, float* out, int rows,
                                                            int cols, float eps, int staged,
                                                            int method) {
    pdl_sync();
    __shared__ SeqSumScratch scratch;
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = stage_row(x + (size_t)r * cols, staged ? norm_stage(cols) : 0, cols);
    // Signed terms: the exact parallel scheme does not apply; the others do.
    const int mean_method = method == SUM_BOUNDED ? SUM_BOUNDED : SUM_SEQUENTIAL;
    const float mean = seq_sum_finish([&](int i) -> double { return (double)xr[i]; }, cols,
                                      &scratch, mean_method,
                                      [&](double sum) { return __double2float_rn(sum / (double)cols); });
    auto term = [&](int i) -> double {
        const double d = (double)(xr[i] - mean);
        return d * d;
    };
    const float var = seq_sum_finish(term, cols, &scratch, method, [&](double sq) {
        return __double2float_rn(sq / (double)cols);
    });
    const float scale = 1.0f / sqrtf(var + eps);
    float* o = out + (size_t)r * cols;
#pragma unroll 4
    for (int c = lane; c < cols; c += 32) o[c] = __fmaf_rn((xr[c] - mean) * scale, w[c], b[c]);
}

// Test hook: float(sum / n) of `n` doubles (>= 0) by the bounded method;
// out[1] = 1 when it fell back to the sequential loop.
extern "C" __global__ void test_bounded_mean(const double* t, double* out, int n) {
    pdl_sync();
    __shared__ SeqSumScratch scratch;
    auto term = [&](int i) -> double { return t[i]; };
    bool fell_back = false;
    const float m = seq_sum_finish(term, n, &scratch, SUM_BOUNDED,
                                   [&](double s) { return __double2float_rn(s / (double)n); },
                                   &fell_back);
    if (threadIdx.x == 0) {
        out[0] = (double)m;
        out[1] = fell_back ? 1.0 : 0.0;
    }
}

// Test hook: the exact sequential sum of `n` doubles (>= 0), one warp;
// out[1] = 1 when the sequential fallback ran.
extern "C" __global__ void test_seq_sum(const double* t, double* out, int n) {
    pdl_sync();
    __shared__ SeqSumScratch scratch;
    auto term = [&](int i) -> double { return t[i]; };
    bool fell_back = false;
    const double s = seq_sum_nonneg(term, n, &scratch, &fell_back);
    if (threadIdx.x == 0) {
        out[0] = s;
        out[1] = fell_back ? 1.0 : 0.0;
    }
}
