// Row softmax of x * scale as the CPU computes it: the max in f32, glibc's
// expf, the sum in f64 in index order (reproduced by `seq_sum_finish`), then 1 / sum in f64
// rounded to f32 and one multiply. One warp per row.

extern "C" __global__ void __launch_bounds__(32)
    softmax_f32(const float* x, float* out, int rows, int cols, float scale, int staged, int method) {
    pdl_sync();
    __shared__ SeqSumScratch scratch;
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * cols;
    float mx = NEG_INF;
#pragma unroll 4
    for (int c = lane; c < cols; c += 32) mx = fmaxf(mx, xr[c] * scale);
    mx = warp_max(mx);
    // The terms, staged (they are read three times).
    float* terms = staged ? norm_stage(cols) : 0;
    if (terms) {
#pragma unroll 4
        for (int c = lane; c < cols; c += 32) terms[c] = glibc_expf(xr[c] * scale - mx);
        __syncwarp();
    }
    auto term = [&](int i) -> double {
        return (double)(terms ? terms[i] : glibc_expf(xr[i] * scale - mx));
    };
    const float inv = seq_sum_finish(term, cols, &scratch, method,
                                     [](double sum) { return __double2float_rn(1.0 / sum); });
    float* o = out + (size_t)r * cols;
#pragma unroll 4
    for (int c = lane; c < cols; c += 32) o[c] = (terms ? terms[c] : glibc_expf(xr[c] * scale - mx)) * inv;
}
