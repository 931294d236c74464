// Matrix products mlx-native has no kernel for: Q4_1 weights (GGUF block
// of 32: f16 d, f16 m, 16 bytes of nibbles; x = q d + m) and dense weights
// with rows shorter than mlx-native's dense kernels accept (k < 32).
// `y[r, n] = sum_k x[r, k] * w[n, k]`, x f32.

struct WeftMulMvParams {
    uint x_rows;      // activation rows
    uint w_rows;      // weight rows (output columns)
    uint k;           // shared dimension
    uint w_row_bytes;
    uint dtype;       // dense kernel: WEFT_F32, WEFT_F16 or WEFT_BF16
};

#define WEFT_Q41_SIMDGROUPS 2u
#define WEFT_Q41_ROWS_PER_SIMDGROUP 2u
#define WEFT_Q41_X_ROWS 4u

// Threadgroups: (w_rows / 4, x_rows / 4); 64 threads. Each simdgroup
// computes two weight rows against up to four activation rows, so every
// dequantized weight is used four times. Lane l works on block l / 4 (then
// every eighth block) and quarter l % 4 of it: bytes 4q..4q+3 of the
// nibbles, i.e. elements 4q..4q+3 (low nibbles) and 16+4q..16+4q+3 (high).
kernel void weft_mul_mv_q4_1_f32(
    device const uchar *w [[buffer(0)]],
    device const float *x [[buffer(1)]],
    device float *y [[buffer(2)]],
    constant WeftMulMvParams &p [[buffer(3)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
    const uint blocks = p.k / 32u;
    const uint x0 = tg.y * WEFT_Q41_X_ROWS;
    const uint quarter = lane % 4u;
    for (uint rr = 0u; rr < WEFT_Q41_ROWS_PER_SIMDGROUP; ++rr) {
        const uint wr = (tg.x * WEFT_Q41_SIMDGROUPS + sg) * WEFT_Q41_ROWS_PER_SIMDGROUP + rr;
        if (wr >= p.w_rows) {
            break;
        }
        device const uchar *row = w + wr * p.w_row_bytes;
        float acc[WEFT_Q41_X_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (uint blk = lane / 4u; blk < blocks; blk += 8u) {
            device const uchar *b = row + 20u * blk;
            const float d = float(*((device const half *)b));
            const float m = float(*((device const half *)(b + 2)));
            const uint qw = *((device const uint *)(b + 4u + 4u * quarter));
            const uint e0 = 32u * blk + 4u * quarter;
            for (uint xr = 0u; xr < WEFT_Q41_X_ROWS; ++xr) {
                if (x0 + xr >= p.x_rows) {
                    break;
                }
                device const float *xp = x + (x0 + xr) * p.k;
                float sq = 0.0f;
                float sx = 0.0f;
                for (uint i = 0u; i < 4u; ++i) {
                    const float lo = float((qw >> (8u * i)) & 0x0fu);
                    const float hi = float((qw >> (8u * i + 4u)) & 0x0fu);
                    const float xl = xp[e0 + i];
                    const float xh = xp[e0 + 16u + i];
                    sq += lo * xl + hi * xh;
                    sx += xl + xh;
                }
                acc[xr] += d * sq + m * sx;
            }
        }
        for (uint xr = 0u; xr < WEFT_Q41_X_ROWS; ++xr) {
            const float s = simd_sum(acc[xr]);
            if (lane == 0u && x0 + xr < p.x_rows) {
                y[(x0 + xr) * p.w_rows + wr] = s;
            }
        }
    }
}

// Dense weights (f32, f16 or bf16), one simdgroup per (weight row,
// activation row); threadgroups (w_rows, x_rows), 32 threads.
kernel void weft_mul_mv_dense_f32(
    device const uchar *w [[buffer(0)]],
    device const float *x [[buffer(1)]],
    device float *y [[buffer(2)]],
    constant WeftMulMvParams &p [[buffer(3)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]]) {
    const uint wr = tg.x;
    const uint xr = tg.y;
    if (wr >= p.w_rows || xr >= p.x_rows) {
        return;
    }
    device const uchar *row = w + wr * p.w_row_bytes;
    device const float *xp = x + xr * p.k;
    float acc = 0.0f;
    for (uint i = lane; i < p.k; i += 32u) {
        acc += weft_dequant(row, i, p.dtype) * xp[i];
    }
    const float s = simd_sum(acc);
    if (lane == 0u) {
        y[xr * p.w_rows + wr] = s;
    }
}
