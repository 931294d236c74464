// Rotary embedding with the CPU's angles: (cos, sin) per (position, pair)
// come from a table computed on the host by `cpu::angle_cache` (glibc cosf
// and sinf of llama.cpp's iterated f32 theta) and uploaded once. Positions
// past the table fall back to CUDA's cosf/sinf of the same theta (within
// 2 ulp of glibc, so no longer bit-exact). The rotation is the contraction
// gcc makes of ggml's C: fma(x0, c, -(x1 s)), fma(x0, s, x1 c).
// One thread per (row, head, pair); pass-through elements are copied.

struct RopeArgs {
    int rows, cols, head_dim, n_dims, neox;
    u32 table_positions;
    float theta_scale, freq_scale, ext_factor, mscale, corr_low, corr_high;
};

DEV float2 rope_angle_fallback(const RopeArgs& a, int pos, int pair) {
    float theta_extrap = (float)pos;
    for (int i = 0; i < pair; i++) theta_extrap = theta_extrap * a.theta_scale;
    const float theta_interp = a.freq_scale * theta_extrap;
    float theta = theta_interp;
    float mscale = a.mscale;  // attn_factor, times the YaRN factor when ext_factor != 0
    if (a.ext_factor != 0.0f) {
        const float y = ((float)pair - a.corr_low) / fmaxf(a.corr_high - a.corr_low, 0.001f);
        const float ramp_mix = (1.0f - fminf(fmaxf(y, 0.0f), 1.0f)) * a.ext_factor;
        theta = theta_interp * (1.0f - ramp_mix) + theta_extrap * ramp_mix;
    }
    return make_float2(cosf(theta) * mscale, sinf(theta) * mscale);
}

extern "C" __global__ void rope_f32(const float* x, const i32* positions, float* out,
                                    const float2* table, RopeArgs a) {
    pdl_sync();
    const int heads = a.cols / a.head_dim;
    const int half = a.n_dims / 2;
    const int rest = a.head_dim - a.n_dims;
    const int per_head = half + rest;  // pairs, then pass-through elements
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)a.rows * heads * per_head) return;
    const int r = (int)(i / ((size_t)heads * per_head));
    const int rem = (int)(i % ((size_t)heads * per_head));
    const int h = rem / per_head, j = rem % per_head;
    const size_t base = (size_t)r * a.cols + (size_t)h * a.head_dim;
    if (j >= half) {
        const int d = a.n_dims + (j - half);
        out[base + d] = x[base + d];
        return;
    }
    const int pos = positions[r];
    float2 cs;
    if (pos >= 0 && (u32)pos < a.table_positions) cs = table[(size_t)pos * half + j];
    else cs = rope_angle_fallback(a, pos, j);
    const int ia = a.neox ? j : 2 * j;
    const int ib = a.neox ? j + half : 2 * j + 1;
    const float x0 = x[base + ia], x1 = x[base + ib];
    out[base + ia] = __fmaf_rn(x0, cs.x, -(x1 * cs.y));
    out[base + ib] = __fmaf_rn(x0, cs.y, x1 * cs.x);
}
