// RMS norm and LayerNorm, bit-identical to the CPU kernels: the sums run in
// f64 in index order (reproduced exactly by `seq_sum_nonneg`), the scale is
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
    __shared__ SeqSumScratch scratch;
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = stage_row(x + (size_t)r * cols, staged ? norm_stage(cols) : 0, cols);
    auto term = [&](int i) -> double {
        const float v = xr[i];
        return (double)(v * v);
    };
    const double sum = seq_sum(term, cols, &scratch, method);
    const float mean = __double2float_rn(sum / (double)cols);
    const float scale = 1.0f / sqrtf(mean + eps);
    scale_row(xr, w, out + (size_t)r * cols, scale, cols);
}

// LayerNorm: the mean's sum has signed terms and runs sequentially in one
// lane; the squared deviations (exact f64 products) use the exact scheme.
extern "C" __global__ void __launch_bounds__(32) layer_norm(const float* x, const float* w,
                                                            const float* b, float* out, int rows,
                                                            int cols, float eps, int staged,
                                                            int method) {
    __shared__ SeqSumScratch scratch;
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = stage_row(x + (size_t)r * cols, staged ? norm_stage(cols) : 0, cols);
    double sum = 0.0;
    if (lane == 0)
        for (int i = 0; i < cols; i++) sum += (double)xr[i];
    sum = __shfl_sync(FULL_MASK, sum, 0);
    const float mean = __double2float_rn(sum / (double)cols);
    auto term = [&](int i) -> double {
        const double d = (double)(xr[i] - mean);
        return d * d;
    };
    const double sq = seq_sum(term, cols, &scratch, method);
    const float var = __double2float_rn(sq / (double)cols);
    const float scale = 1.0f / sqrtf(var + eps);
    float* o = out + (size_t)r * cols;
#pragma unroll 4
    for (int c = lane; c < cols; c += 32) o[c] = __fmaf_rn((xr[c] - mean) * scale, w[c], b[c]);
}

// Test hook: the exact sequential sum of `n` doubles (>= 0), one warp;
// out[1] = 1 when the sequential fallback ran.
extern "C" __global__ void test_seq_sum(const double* t, double* out, int n) {
    __shared__ SeqSumScratch scratch;
    auto term = [&](int i) -> double { return t[i]; };
    bool fell_back = false;
    const double s = seq_sum_nonneg(term, n, &scratch, &fell_back);
    if (threadIdx.x == 0) {
        out[0] = s;
        out[1] = fell_back ? 1.0 : 0.0;
    }
}
