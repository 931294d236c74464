// Row softmax of x * scale as the CPU computes it: the max in f32, glibc's
// expf, the sum in f64 in index order (exact scheme), then 1 / sum in f64
// rounded to f32 and one multiply. One warp per row.

#define SOFTMAX_WARPS 4

extern "C" __global__ void __launch_bounds__(128)
    softmax_f32(const float* x, float* out, int rows, int cols, float scale) {
    __shared__ SeqSumScratch scratch[SOFTMAX_WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * SOFTMAX_WARPS + warp;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * cols;
    float mx = NEG_INF;
    for (int c = lane; c < cols; c += 32) mx = fmaxf(mx, xr[c] * scale);
    mx = warp_max(mx);
    auto term = [&](int i) -> double { return (double)glibc_expf(xr[i] * scale - mx); };
    const double sum = seq_sum_nonneg(term, cols, &scratch[warp]);
    const float inv = __double2float_rn(1.0 / sum);
    float* o = out + (size_t)r * cols;
    for (int c = lane; c < cols; c += 32) o[c] = glibc_expf(xr[c] * scale - mx) * inv;
}
