// Rotary embedding over rows of several heads (`x [rows, heads * head_dim]`,
// one i32 position per row), both pairings (adjacent pairs: the GGUF llama
// layout; halves: NeoX), partial rotation (`n_dims < head_dim`: the rest
// is copied) and YaRN. The host computes each pair's frequency
// `base^(-2i / n_dims)` and YaRN ramp in f32 exactly as the reference does;
// the kernel forms the angle per position as the reference does.

struct WeftRopeParams {
    uint rows;
    uint cols;
    uint head_dim;
    uint n_dims;
    uint neox;        // 0: adjacent pairs, 1: halves
    uint yarn;        // nonzero when ext_factor != 0
    float freq_scale;
    float mscale;     // attn_factor, times YaRN's magnitude factor
};

// One thread per (pair or pass-through pair, head, row).
kernel void weft_rope_f32(
    device const float *x [[buffer(0)]],
    device const int *positions [[buffer(1)]],
    device float *y [[buffer(2)]],
    device const float *inv_freq [[buffer(3)]],
    device const float *ramp [[buffer(4)]],
    constant WeftRopeParams &p [[buffer(5)]],
    uint3 gid [[thread_position_in_grid]]) {
    const uint i = gid.x;
    const uint head = gid.y;
    const uint row = gid.z;
    const uint heads = p.cols / p.head_dim;
    const uint half_dims = p.n_dims / 2u;
    if (row >= p.rows || head >= heads) {
        return;
    }
    const uint base = row * p.cols + head * p.head_dim;
    if (i >= half_dims) {
        // Pass-through elements n_dims.. (two per thread).
        const uint e = p.n_dims + 2u * (i - half_dims);
        if (e < p.head_dim) {
            y[base + e] = x[base + e];
        }
        if (e + 1u < p.head_dim) {
            y[base + e + 1u] = x[base + e + 1u];
        }
        return;
    }
    const float pos = float(positions[row]);
    const float theta_extrap = pos * inv_freq[i];
    const float theta_interp = p.freq_scale * theta_extrap;
    float theta = theta_interp;
    if (p.yarn != 0u) {
        const float r = ramp[i];
        theta = theta_interp * (1.0f - r) + theta_extrap * r;
    }
    const float c = precise::cos(theta) * p.mscale;
    const float s = precise::sin(theta) * p.mscale;
    const uint a = p.neox != 0u ? i : 2u * i;
    const uint b = p.neox != 0u ? i + half_dims : 2u * i + 1u;
    const float x0 = x[base + a];
    const float x1 = x[base + b];
    y[base + a] = x0 * c - x1 * s;
    y[base + b] = x0 * s + x1 * c;
}
