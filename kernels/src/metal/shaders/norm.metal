// LayerNorm with bias (mlx-native has RMS norm but no LayerNorm):
// y = (x - mean) / sqrt(var + eps) * w + b per row, two passes over the
// row (mean, then the variance of the deviations), one threadgroup of 256
// threads per row.

struct WeftLayerNormParams {
    uint rows;
    uint cols;
    float eps;
};

static inline float weft_threadgroup_sum(float v, threadgroup float *scratch, uint sg,
                                         uint lane, uint sgs) {
    const float s = simd_sum(v);
    if (lane == 0u) {
        scratch[sg] = s;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = 0.0f;
    for (uint g = 0u; g < sgs; ++g) {
        total += scratch[g];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return total;
}

kernel void weft_layer_norm(
    device const float *x [[buffer(0)]],
    device const float *w [[buffer(1)]],
    device const float *b [[buffer(2)]],
    device float *y [[buffer(3)]],
    constant WeftLayerNormParams &p [[buffer(4)]],
    uint row [[threadgroup_position_in_grid]],
    uint t [[thread_index_in_threadgroup]],
    uint threads [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint sgs [[simdgroups_per_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float scratch[32];
    if (row >= p.rows) {
        return;
    }
    device const float *xr = x + row * p.cols;
    float s = 0.0f;
    for (uint i = t; i < p.cols; i += threads) {
        s += xr[i];
    }
    const float mean = weft_threadgroup_sum(s, scratch, sg, lane, sgs) / float(p.cols);
    float s2 = 0.0f;
    for (uint i = t; i < p.cols; i += threads) {
        const float dv = xr[i] - mean;
        s2 += dv * dv;
    }
    const float var = weft_threadgroup_sum(s2, scratch, sg, lane, sgs) / float(p.cols);
    const float scale = 1.0f / sqrt(var + p.eps);
    device float *yr = y + row * p.cols;
    for (uint i = t; i < p.cols; i += threads) {
        yr[i] = (xr[i] - mean) * scale * w[i] + b[i];
    }
}
