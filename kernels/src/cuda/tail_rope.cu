// DeepSeek-V4's tail rope: the last n_dims elements of each head turn in
// interleaved pairs (j, j + 1), j = head_dim - n_dims + 2i; the first
// head_dim - n_dims elements pass through. As cpu/tail_rope.rs:
//
// - the frequencies are the CPU's own (TailRopeParams::inv_freq on the
//   host, f64 pow/ln rounded once), passed by value as 32 u64 words of two
//   f32 each (pair 2q in the low half of word q, pair 2q + 1 in the high);
// - the angle is one f32 product `(float)position * f`;
// - (cos, sin) are f64 cos/sin of that angle rounded to f32 (sin negated
//   for the inverse): CUDA's f64 sin/cos here, glibc's on the CPU. Both lie
//   within an ulp or two of the true f64 value, so the f32 pair is the
//   same except where the true value sits within ~2^-52 (relative) of an
//   f32 rounding midpoint: a tolerance, not bits (see the tests);
// - out = (a c - b s, a s + b c), products and sums rounded separately.
//
// Grid (rows, blocks over the row): each block computes its row's
// (cos, sin) once into shared memory, then its threads stride over the
// row's units: per head, the pass-through elements, then the pairs. A
// unit is read and written by the same thread, so `out` may alias `x`.

#define TROPE_MAX_PAIRS 64

extern "C" __global__ void __launch_bounds__(256)
    tail_rope_f32(const float* x, const i32* __restrict__ positions, float* out, int cols,
                  int head_dim, int n_dims, int inverse, u64 w0, u64 w1, u64 w2, u64 w3, u64 w4,
                  u64 w5, u64 w6, u64 w7, u64 w8, u64 w9, u64 w10, u64 w11, u64 w12, u64 w13,
                  u64 w14, u64 w15, u64 w16, u64 w17, u64 w18, u64 w19, u64 w20, u64 w21, u64 w22,
                  u64 w23, u64 w24, u64 w25, u64 w26, u64 w27, u64 w28, u64 w29, u64 w30,
                  u64 w31) {
    pdl_sync();
    __shared__ float2 cs[TROPE_MAX_PAIRS];
    const int r = blockIdx.x;
    const int half = n_dims / 2;  // <= TROPE_MAX_PAIRS (checked on the host)
    const int t = threadIdx.x;
    if (t < half) {
        // The word by a chain of selects (an indexed array would go to local memory).
        const int q = t >> 1;
        u64 word = w0;
#define TROPE_PICK(k) word = q == k ? w##k : word;
        TROPE_PICK(1) TROPE_PICK(2) TROPE_PICK(3) TROPE_PICK(4) TROPE_PICK(5) TROPE_PICK(6)
        TROPE_PICK(7) TROPE_PICK(8) TROPE_PICK(9) TROPE_PICK(10) TROPE_PICK(11) TROPE_PICK(12)
        TROPE_PICK(13) TROPE_PICK(14) TROPE_PICK(15) TROPE_PICK(16) TROPE_PICK(17)
        TROPE_PICK(18) TROPE_PICK(19) TROPE_PICK(20) TROPE_PICK(21) TROPE_PICK(22)
        TROPE_PICK(23) TROPE_PICK(24) TROPE_PICK(25) TROPE_PICK(26) TROPE_PICK(27)
        TROPE_PICK(28) TROPE_PICK(29) TROPE_PICK(30) TROPE_PICK(31)
#undef TROPE_PICK
        const float f = __uint_as_float((t & 1) ? (u32)(word >> 32) : (u32)word);
        const float theta = __fmul_rn(__int2float_rn(positions[r]), f);
        double s, c;
        sincos((double)theta, &s, &c);
        if (inverse) s = -s;
        cs[t] = make_float2(__double2float_rn(c), __double2float_rn(s));
    }
    __syncthreads();
    const int nope = head_dim - n_dims;
    const int per_head = nope + half;
    const int units = (cols / head_dim) * per_head;
    const size_t row = (size_t)r * cols;
    for (int u = blockIdx.y * blockDim.x + t; u < units; u += gridDim.y * blockDim.x) {
        const int h = u / per_head;
        const int k = u - h * per_head;
        const size_t head = row + (size_t)h * head_dim;
        if (k < nope) {
            out[head + k] = x[head + k];
        } else {
            const int i = k - nope;
            const size_t j = head + nope + 2 * i;
            const float a = x[j], b = x[j + 1];
            const float2 q = cs[i];
            out[j] = __fsub_rn(__fmul_rn(a, q.x), __fmul_rn(b, q.y));
            out[j + 1] = __fadd_rn(__fmul_rn(a, q.y), __fmul_rn(b, q.x));
        }
    }
}
