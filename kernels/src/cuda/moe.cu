// DeepSeek-V4 mixture-of-experts kernels (all but the expert matmul):
// routing (top-k of biased sqrt-softplus scores, or a hash table), the
// expert weights, clamped SwiGLU and the weighted combination. Each follows
// kernels/src/cpu/moe.rs operation by operation; see moe.rs for which are
// bit-exact.

// `weft_ops::reference::sqrt_softplus`: f64 softplus (the identity above 30)
// and square root. exp and log1p are CUDA's (within 1 ulp each), not glibc's,
// so the score may differ from the CPU's in its last bits; sqrt is IEEE.
DEV double moe_sqrt_softplus(float xf) {
    const double x = (double)xf;
    const double sp = x > 30.0 ? x : log1p(exp(x));
    return sqrt(sp);
}

// Rust's `f64::total_cmp` order as a signed integer (larger key = later in
// the order; -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN).
DEV i64 moe_total_key(double v) {
    const i64 b = __double_as_longlong(v);
    return b ^ (i64)(((u64)(b >> 63)) >> 1);
}

#define MOE_ROUTE_THREADS 256

// Top-k routing, one block per token. The keys of the biased scores go to
// shared memory; each expert counts the experts ranked before it (greater
// key, or an equal key and a lower id: the CPU's sort) and, when fewer than
// k, writes itself at that rank. The order is strict and total, so ranks
// 0..k-1 are written exactly once each (k <= experts, checked on the host).
// Dynamic shared memory: experts * 8 bytes.
extern "C" __global__ void __launch_bounds__(MOE_ROUTE_THREADS)
    moe_route_topk(const float* logits, const float* bias, i32* out, int experts, int k) {
    pdl_sync();
    extern __shared__ __align__(16) u8 moe_dyn[];
    i64* key = (i64*)moe_dyn;
    const size_t r = blockIdx.x;
    const float* lr = logits + r * (size_t)experts;
    for (int e = threadIdx.x; e < experts; e += blockDim.x)
        key[e] = moe_total_key(moe_sqrt_softplus(lr[e]) + (double)bias[e]);
    __syncthreads();
    i32* o = out + r * (size_t)k;
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
        const i64 mine = key[e];
        int rank = 0;
        for (int f = 0; f < experts && rank < k; f++) {
            const i64 other = key[f];
            rank += (other > mine || (other == mine && f < e)) ? 1 : 0;
        }
        if (rank < k) o[rank] = e;
    }
}

// Hash routing, one thread per output id: out[r, j] = table[tokens[r], j].
// A token outside 0..table_rows (an error on the CPU; a kernel cannot
// return one) gives -1 in each of its k slots.
extern "C" __global__ void moe_route_hash(const i32* table, const i32* tokens, i32* out, u64 count,
                                          int k, u64 table_rows) {
    pdl_sync();
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const u64 r = i / (u64)k;
    const u64 j = i - r * (u64)k;
    const i32 t = tokens[r];
    out[i] = (t >= 0 && (u64)t < table_rows) ? table[(u64)t * (u64)k + j] : -1;
}

// Expert weights, one warp per token: the unbiased scores of the k selected
// experts (f64, in shared memory; dynamic shared k * 8 bytes), their sum in
// slot order from 0.0 as the CPU adds them, then each weight from the score
// rounded to f32: (s as f64 / total) * scale, rounded to f32. An id outside
// 0..experts (an error on the CPU) scores NaN: its weight is NaN, and so is
// every weight of its token when normalizing.
extern "C" __global__ void __launch_bounds__(32)
    moe_weights_f32(const float* logits, const i32* ids, float* out, int experts, int k,
                    int normalize, float scale) {
    pdl_sync();
    extern __shared__ __align__(16) u8 moe_dyn[];
    double* score = (double*)moe_dyn;
    const size_t r = blockIdx.x;
    const i32* idr = ids + r * (size_t)k;
    const float* lr = logits + r * (size_t)experts;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const i32 id = idr[j];
        score[j] = (id >= 0 && id < experts) ? moe_sqrt_softplus(lr[id])
                                             : __longlong_as_double(0x7ff8000000000000ll);
    }
    __syncthreads();
    double total = 0.0;
    for (int j = 0; j < k; j++) total += score[j];
    float* o = out + r * (size_t)k;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const double v = (double)__double2float_rn(score[j]);
        const double w = normalize ? v / total : v;
        o[j] = __double2float_rn(w * (double)scale);
    }
}

// Clamped SwiGLU, one thread per element: g = min(gate, limit) (Rust's
// f32::min: a NaN gate gives limit, as fminf), u = up clamped as Rust's
// f32::clamp (NaN stays NaN), out = g / (1 + expf(-g)) * u with glibc's expf.
extern "C" __global__ void moe_swiglu_clamp_f32(const float* gate, const float* up, float* out,
                                                u64 count, float limit) {
    pdl_sync();
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const float g = fminf(gate[i], limit);
    float u = up[i];
    if (u < -limit) u = -limit;
    if (u > limit) u = limit;
    out[i] = g / (1.0f + glibc_expf(-g)) * u;
}

// Weighted combination, one thread per output element: from 0.0, add
// w[r, j] * y[r, j, c] for j in order (a separate f32 multiply and add, as
// the CPU), then the shared expert's output when given (`shared` non-null).
extern "C" __global__ void moe_combine_f32(const float* y, const float* w, const float* shared,
                                           float* out, u64 count, int k, int d) {
    pdl_sync();
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const u64 r = i / (u64)d;
    const u64 c = i - r * (u64)d;
    const float* yr = y + r * (u64)k * (u64)d + c;
    const float* wr = w + r * (u64)k;
    float acc = 0.0f;
    for (int j = 0; j < k; j++) acc = acc + wr[j] * yr[(u64)j * (u64)d];
    if (shared) acc = acc + shared[i];
    out[i] = acc;
}
