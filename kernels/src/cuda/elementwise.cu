// Elementwise kernels: add, mul (with a broadcast row), scale, silu(gate) *
// up with ggml's AVX-512 exp, GELU / GEGLU through ggml's f16 table.

extern "C" __global__ void add_f32(const float* a, const float* b, float* out, u64 count,
                                   int cols, int broadcast) {
    pdl_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = a[i] + b[broadcast ? i % cols : i];
}

extern "C" __global__ void mul_f32(const float* a, const float* b, float* out, u64 count,
                                   int cols, int broadcast) {
    pdl_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = a[i] * b[broadcast ? i % cols : i];
}

extern "C" __global__ void scale_f32(const float* a, float* out, u64 count, float factor) {
    pdl_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = a[i] * factor;
}

// out = gate / (1 + v_expf(0 - gate)) * up
extern "C" __global__ void silu_mul_f32(const float* g, const float* u, float* out, u64 count) {
    pdl_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        const float x = g[i];
        out[i] = (x / (1.0f + ggml_v_expf(0.0f - x))) * u[i];
    }
}

DEV float gelu_tab(float x, const u16* table) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return h2f(table[f2h(x)]);
}

extern "C" __global__ void gelu_f32(const float* x, float* out, u64 count, const u16* table) {
    pdl_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = gelu_tab(x[i], table);
}

extern "C" __global__ void gelu_mul_f32(const float* g, const float* u, float* out, u64 count,
                                        const u16* table) {
    pdl_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        const float x = g[i];
        out[i] = x <= -10.0f ? 0.0f : gelu_tab(x, table) * u[i];
    }
}

// Test hooks: the exp ports over a vector.
extern "C" __global__ void test_glibc_expf(const float* x, float* out, u64 count) {
    pdl_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = glibc_expf(x[i]);
}
extern "C" __global__ void test_v_expf(const float* x, float* out, u64 count) {
    pdl_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = ggml_v_expf(x[i]);
}
