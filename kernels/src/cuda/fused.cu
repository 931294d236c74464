// Fused ops (made by weft's fusion pass), each computing exactly what its
// chain of ops computes (weft_ops::fused::decompose), without writing the
// intermediate to memory:
//
// - rms_norm then quantize, and add (in place) then rms_norm then quantize:
//   a warp per quantized block for Q8_0 / Q8_1 rows of up to 1024 values
//   (the bounded f64 sum), otherwise one warp per row (the exact f64 sum,
//   then the rows' blocks);
// - silu_mul then quantize: one thread per 32-element block (a warp per
//   256-element Q8_K block);
// - rope then set_rows: one thread per rotated pair, written converted into
//   the cache row (start from the step scalars, ring slots).
//
// Output formats: 0 q8_0, 1 q8_1, 2 q8_k, 3 f16, 4 bf16.

// Quantizes one row of `cols` values val(e) (e in [0, cols)) into `dst`
// with the whole warp.
template <int F, class Val>
DEV void quant_row_warp(Val val, u8* dst, int cols) {
    const int lane = threadIdx.x & 31;
    if (F == 0 || F == 1) {
        const int bytes = F == 1 ? 36 : 34;
        for (int b = lane; b < cols / 32; b += 32) {
            float v[32];
#pragma unroll
            for (int i = 0; i < 32; i++) v[i] = val(32 * b + i);
            quant_q8_thread<F>(v, dst + (size_t)b * bytes);
        }
    } else if (F == 2) {
        for (int b = 0; b < cols / 256; b++) {
            float v[8];
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = val(256 * b + 8 * lane + i);
            quant_q8k_warp(v, dst + (size_t)b * Q8K_BYTES);
        }
    } else {
        u16* o = (u16*)dst;
        for (int c = lane; c < cols; c += 32) o[c] = F == 3 ? f2h(val(c)) : f2bf(val(c));
    }
}

DEV size_t act_row_bytes(int f, int cols) {
    switch (f) {
        case 0: return (size_t)cols / 32 * 34;
        case 1: return (size_t)cols / 32 * 36;
        case 2: return (size_t)cols / 256 * Q8K_BYTES;
        default: return (size_t)cols * 2;
    }
}

// rms_norm(x, w) quantized; with ADD, x + b is first written to `sum_out`
// (which may be x itself) and normalised. Staged, the row (or x and b) is
// loaded with 32 loads per lane in flight: one memory latency for rows of
// up to 1024 values.
//
// The weights of this lane's first Q8_0 / Q8_1 block are loaded before the
// wait on the kernels before (when `pre`: no kernel of the command buffer
// writes them), so the quantization, last on the critical path, reads them
// from registers.
template <int F, bool ADD>
DEV void norm_quant_body(const float* x, const float* b, const float* w, float* sum_out, u8* out,
                         int rows, int cols, float eps, int broadcast, int staged, int method,
                         int pre) {
    __shared__ SeqSumScratch scratch;
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x;
    constexpr bool Q8 = F == 0 || F == 1;
    const bool w_own = Q8 && lane < cols / 32;  // this lane quantizes block `lane` first
    float wv[Q8 ? 32 : 1];
    if (pre & 2) pdl_trigger();  // bit 1: the next kernel may launch first
    pre &= 1;                    // bit 0: the weights are constant
    if (pre && w_own) {
#pragma unroll
        for (int i = 0; i < (Q8 ? 32 : 1); i++) wv[i] = w[32 * lane + i];
    } else if (blockIdx.x == 0) {
        prefetch_l2(w, (size_t)cols * 4, threadIdx.x, blockDim.x);
    }
    pdl_sync();
    if (!pre && w_own) {
#pragma unroll
        for (int i = 0; i < (Q8 ? 32 : 1); i++) wv[i] = w[32 * lane + i];
    }
    if (r >= rows) return;
    const float* xr = x + (size_t)r * cols;
    float* stage = staged ? norm_stage(cols) : 0;
    if (ADD) {
        const float* br = b + (broadcast ? 0 : (size_t)r * cols);
        float* sr = sum_out + (size_t)r * cols;
        for (int c0 = 0; c0 < cols; c0 += 1024) {
            float v[32], bv[32];
#pragma unroll
            for (int u = 0; u < 32; u++) {
                const int c = c0 + lane + 32 * u;
                v[u] = c < cols ? xr[c] : 0.0f;
                bv[u] = c < cols ? br[c] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 32; u++) {
                const int c = c0 + lane + 32 * u;
                if (c < cols) {
                    // In place when sum_out is x: every lane read its
                    // elements of this round before writing them.
                    sr[c] = v[u] + bv[u];
                    if (stage) stage[c] = v[u] + bv[u];
                }
            }
        }
        __syncwarp();
        xr = stage ? stage : sr;
    } else {
        xr = stage_row(xr, stage, cols);
    }
    auto term = [&](int i) -> double {
        const float v = xr[i];
        return (double)(v * v);
    };
    const float mean = seq_sum_finish(term, cols, &scratch, method, [&](double sum) {
        return __double2float_rn(sum / (double)cols);
    });
    const float scale = 1.0f / sqrtf(mean + eps);
    u8* dst = out + (size_t)r * act_row_bytes(F, cols);
    if (Q8) {
        // quant_row_warp's Q8 loop, the first block's weights from registers.
        const int bytes = F == 1 ? 36 : 34;
        for (int blk = lane; blk < cols / 32; blk += 32) {
            float v[32];
#pragma unroll
            for (int i = 0; i < 32; i++) {
                const int e = 32 * blk + i;
                v[i] = (xr[e] * scale) * (blk == lane ? wv[Q8 ? i : 0] : w[e]);
            }
            quant_q8_thread<Q8 ? F : 0>(v, dst + (size_t)blk * bytes);
        }
    } else {
        auto val = [&](int e) -> float { return (xr[e] * scale) * w[e]; };
        quant_row_warp<F>(val, dst, cols);
    }
}

// (norm_quant_body waits on the kernels before.)
#define NORM_QUANT_ENTRIES(SUFFIX, F)                                                          \
    extern "C" __global__ void __launch_bounds__(32) rms_norm_quant_##SUFFIX(                  \
        const float* x, const float* w, u8* out, int rows, int cols, float eps, int staged,    \
        int method, int pre) {                                                                 \
        norm_quant_body<F, false>(x, 0, w, 0, out, rows, cols, eps, 0, staged, method, pre);   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(32) add_rms_norm_quant_##SUFFIX(              \
        const float* x, const float* b, const float* w, float* sum_out, u8* out, int rows,     \
        int cols, float eps, int broadcast, int staged, int method, int pre) {                 \
        norm_quant_body<F, true>(x, b, w, sum_out, out, rows, cols, eps, broadcast, staged,    \
                                 method, pre);                                                 \
    }
NORM_QUANT_ENTRIES(q8_0, 0)
NORM_QUANT_ENTRIES(q8_1, 1)
NORM_QUANT_ENTRIES(q8_k, 2)
NORM_QUANT_ENTRIES(f16, 3)
NORM_QUANT_ENTRIES(bf16, 4)

// rms_norm (after the in-place add, with ADD) then Q8_0 / Q8_1 (F) for a
// row of at most 1024 values, a multiple of 32, under the bounded f64 sum
// (norm_quant_body serves every other case): one block per row, a warp per
// quantized block, thread c holding element c. Each warp sums its 32
// squares by a butterfly, the partial sums meet in shared memory after the
// block's one barrier, and every warp finishes the same tree from them, so
// every warp derives the same scale (the bound of seq_sum_finish holds for
// any order; where it does not decide the f32, lane 0 of each warp sums the
// staged squares in order). The quantization is then one warp reduction
// (quant_q8_warp) instead of a lane's 32-step loop.
// The mean of the squares of the block's row (thread c holding element c,
// blockDim.x == cols) as the CPU's f64 sum gives it: each warp's butterfly,
// the warps' partial sums through `part`, the bound of seq_sum_finish, and
// lane 0's sum of the staged squares in order where the bound does not
// decide. `row` and `part` are free again after the block's next barrier.
DEV float warps_row_mean(float v, float* row, double* part, int cols) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    row[threadIdx.x] = v;
    double s = (double)(v * v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
    if (lane == 0) part[warp] = s;
    __syncthreads();
    s = lane < (cols >> 5) ? part[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
    auto finish = [&](double sum) { return __double2float_rn(sum / (double)cols); };
    // The squares are >= 0, so s is also the sum of their magnitudes.
    const double margin = s * ((double)(cols + 2) * 0x1p-51);
    float mean = finish(s - margin);
    if (__float_as_uint(mean) != __float_as_uint(finish(s + margin))) {
        auto term = [&](int i) -> double { return (double)(row[i] * row[i]); };
        mean = finish(seq_sum_plain(term, cols));
    }
    return mean;
}

template <int F, bool ADD>
DEV void norm_quant_warps_body(const float* x, const float* b, const float* w, float* sum_out,
                               u8* out, int cols, float eps, int broadcast, int pre) {
    __shared__ float row[1024];
    __shared__ double part[32];
    const int warp = threadIdx.x >> 5;
    const int c = threadIdx.x;  // blockDim.x == cols
    const size_t at = (size_t)blockIdx.x * cols + c;
    if (pre & 2) pdl_trigger();  // bit 1: the next kernel may launch first
    pre &= 1;                    // bit 0: the weights are constant
    float wc = pre ? w[c] : 0.0f;
    pdl_sync();
    if (!pre) wc = w[c];
    float v = x[at];
    if (ADD) {
        v = v + b[(broadcast ? 0 : (size_t)blockIdx.x * cols) + c];
        sum_out[at] = v;  // in place when sum_out is x: only this thread reads x[at]
    }
    const float mean = warps_row_mean(v, row, part, cols);
    const float scale = 1.0f / sqrtf(mean + eps);
    u8* dst = out + (size_t)blockIdx.x * act_row_bytes(F, cols);
    quant_q8_warp<F>((v * scale) * wc, dst + (size_t)warp * (F == 1 ? 36 : 34));
}

// rms_norm of b (weights wb), added into x in place, then rms_norm and
// Q8_0 / Q8_1 (F) of the sum: norm_quant_warps_body with b's norm first,
// each norm computed as the CPU's rms_norm computes it.
template <int F>
DEV void norm_add_norm_quant_warps_body(const float* x, const float* b, const float* wb,
                                        const float* w, float* sum_out, u8* out, int cols,
                                        float eps_b, float eps, int broadcast, int pre) {
    __shared__ float row[1024];
    __shared__ double part[32];
    const int warp = threadIdx.x >> 5;
    const int c = threadIdx.x;  // blockDim.x == cols
    const size_t at = (size_t)blockIdx.x * cols + c;
    float wbc = pre ? wb[c] : 0.0f, wc = pre ? w[c] : 0.0f;
    pdl_sync();
    if (!pre) {
        wbc = wb[c];
        wc = w[c];
    }
    const float bv = b[(broadcast ? 0 : (size_t)blockIdx.x * cols) + c];
    const float mean_b = warps_row_mean(bv, row, part, cols);
    const float hb = (bv * (1.0f / sqrtf(mean_b + eps_b))) * wbc;
    __syncthreads();  // row and part are read again below
    const float v = x[at] + hb;
    sum_out[at] = v;  // in place when sum_out is x: only this thread reads x[at]
    const float mean = warps_row_mean(v, row, part, cols);
    const float scale = 1.0f / sqrtf(mean + eps);
    u8* dst = out + (size_t)blockIdx.x * act_row_bytes(F, cols);
    quant_q8_warp<F>((v * scale) * wc, dst + (size_t)warp * (F == 1 ? 36 : 34));
}

// (norm_quant_warps_body waits on the kernels before.)
#define NORM_QUANT_WARPS_ENTRIES(SUFFIX, F)                                                    \
    extern "C" __global__ void __launch_bounds__(1024) rms_norm_quant_warps_##SUFFIX(          \
        const float* x, const float* w, u8* out, int cols, float eps, int pre) {               \
        norm_quant_warps_body<F, false>(x, 0, w, 0, out, cols, eps, 0, pre);                   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(1024) add_rms_norm_quant_warps_##SUFFIX(      \
        const float* x, const float* b, const float* w, float* sum_out, u8* out, int cols,     \
        float eps, int broadcast, int pre) {                                                   \
        norm_quant_warps_body<F, true>(x, b, w, sum_out, out, cols, eps, broadcast, pre);      \
    }
NORM_QUANT_WARPS_ENTRIES(q8_0, 0)
NORM_QUANT_WARPS_ENTRIES(q8_1, 1)

// (norm_add_norm_quant_warps_body waits on the kernels before; `pre`: both
// weights are constant.)
#define NORM_ADD_NORM_ENTRY(SUFFIX, F)                                                         \
    extern "C" __global__ void __launch_bounds__(1024) norm_add_norm_quant_warps_##SUFFIX(     \
        const float* x, const float* b, const float* wb, const float* w, float* sum_out,       \
        u8* out, int cols, float eps_b, float eps, int broadcast, int pre) {                   \
        norm_add_norm_quant_warps_body<F>(x, b, wb, w, sum_out, out, cols, eps_b, eps,         \
                                          broadcast, pre);                                     \
    }
NORM_ADD_NORM_ENTRY(q8_0, 0)
NORM_ADD_NORM_ENTRY(q8_1, 1)

// silu(g) * u as the CPU's silu_mul computes it.
DEV float silu_times(float g, float u) { return (g / (1.0f + ggml_v_expf(0.0f - g))) * u; }

DEV float silu_mul_value(const float* g, const float* u, size_t i) { return silu_times(g[i], u[i]); }

// silu(gate) * up, quantized. Rows are contiguous, so block k of the whole
// tensor is block k of the output.
template <int F>
DEV void silu_quant_body(const float* g, const float* u, u8* out, int rows, int cols) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t total = (size_t)rows * cols;
    if (F == 0 || F == 1) {
        // One warp per 32-element block, one element per lane.
        const size_t gw = tid >> 5;
        if (gw >= total / 32) return;  // uniform per warp
        quant_q8_warp<F>(silu_mul_value(g, u, tid), out + gw * (F == 1 ? 36 : 34));
    } else if (F == 2) {
        const size_t gw = tid >> 5;
        if (gw >= total / 256) return;
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = silu_mul_value(g, u, gw * 256 + (tid & 31) * 8 + i);
        quant_q8k_warp(v, out + gw * Q8K_BYTES);
    } else {
        if (tid >= total) return;
        const float v = silu_mul_value(g, u, tid);
        ((u16*)out)[tid] = F == 3 ? f2h(v) : f2bf(v);
    }
}

#define SILU_QUANT_ENTRY(SUFFIX, F)                                                            \
    extern "C" __global__ void silu_mul_quant_##SUFFIX(const float* g, const float* u, u8* out, \
                                                        int rows, int cols) {                  \
        pdl_sync();                                                                            \
        silu_quant_body<F>(g, u, out, rows, cols);                                             \
    }
SILU_QUANT_ENTRY(q8_0, 0)
SILU_QUANT_ENTRY(q8_1, 1)
SILU_QUANT_ENTRY(q8_k, 2)
SILU_QUANT_ENTRY(f16, 3)
SILU_QUANT_ENTRY(bf16, 4)

// rope then set_rows: the rotated row r goes to cache row start + r (ring:
// modulo), converted to the cache's type (D: 0 f32, 1 f16, 2 bf16).
template <int D>
DEV void rope_set_rows_body(const float* x, const i32* positions, u8* dst, const float2* table,
                            RopeArgs a, u64 dst_row, u32 start, u32 ring, const u32* step) {
    const int heads = a.cols / a.head_dim;
    const int half = a.n_dims / 2;
    const int per_head = half + (a.head_dim - a.n_dims);
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)a.rows * heads * per_head) return;
    const int r = (int)(i / ((size_t)heads * per_head));
    const int rem = (int)(i % ((size_t)heads * per_head));
    const int h = rem / per_head, j = rem % per_head;
    const size_t base = (size_t)r * a.cols + (size_t)h * a.head_dim;
    u64 p = (u64)(step ? step[0] : start) + (u64)r;
    if (ring != NONE_U32) p %= ring;
    u8* row = dst + p * dst_row;
    const int col = h * a.head_dim;
    if (j >= half) {
        const int d = a.n_dims + (j - half);
        enc<D>(row, col + d, x[base + d]);
        return;
    }
    const int pos = positions[r];
    float2 cs;
    if (pos >= 0 && (u32)pos < a.table_positions) cs = table[(size_t)pos * half + j];
    else cs = rope_angle_fallback(a, pos, j);
    const int ia = a.neox ? j : 2 * j;
    const int ib = a.neox ? j + half : 2 * j + 1;
    const float x0 = x[base + ia], x1 = x[base + ib];
    enc<D>(row, col + ia, __fmaf_rn(x0, cs.x, -(x1 * cs.y)));
    enc<D>(row, col + ib, __fmaf_rn(x0, cs.y, x1 * cs.x));
}

#define ROPE_SET_ROWS_ENTRY(SUFFIX, D)                                                         \
    extern "C" __global__ void rope_set_rows_##SUFFIX(const float* x, const i32* positions,    \
                                                       u8* dst, const float2* table,           \
                                                       RopeArgs a, u64 dst_row, u32 start,     \
                                                       u32 ring, const u32* step) {            \
        pdl_sync();                                                                            \
        rope_set_rows_body<D>(x, positions, dst, table, a, dst_row, start, ring, step);        \
    }
ROPE_SET_ROWS_ENTRY(f32, 0)
ROPE_SET_ROWS_ENTRY(f16, 1)
ROPE_SET_ROWS_ENTRY(bf16, 2)

// A decode matvec fused with what reads its rows (`matmul+rope`,
// `matmul+set_rows`, `matmul+rope+set_rows`, each with a bias or not): each
// row's product, plus its bias when `bias` is set, then the
// rope's rotation of its pair (normal mode: rows 2i and 2i + 1 of a head,
// which lie in neighbouring groups of eight threads of one warp), then the
// value converted into cache row `start` (from the step scalars), exactly
// as the separate kernels compute them. D: -1 writes the f32 row itself; 0,
// 1, 2 write an f32, f16, bf16 cache row. mv_rows32 waits on the kernels
// before (after its first weight loads when `pre`); CH is mv_row32's
// MV_CHUNK (0: the rows from shared memory).
template <class F, int CH, bool ROPE, int D>
DEV void matmul_rows_body(const u8* w, const u8* act, u8* out, int m, int nb, const i32* positions,
                          const float2* table, RopeArgs ra, u64 dst_row, u32 start, u32 ring,
                          const u32* step, int pre, int blk, const float* bias) {
    int row;
    float s = mv_row32<F, CH>(w, act, m, nb, &row, pre, blk);
    if (bias) s = __fadd_rn(s, bias[min(row, m - 1)]);
    const float other = __shfl_xor_sync(FULL_MASK, s, 8);  // the pair's other row
    if ((threadIdx.x & 7) != 0 || row >= m) return;
    float v = s;
    if (ROPE) {
        const int j = row % ra.head_dim;
        if (j < ra.n_dims) {
            const int pair = j / 2, half = ra.n_dims / 2;
            const int pos = positions[0];
            float2 cs;
            if (pos >= 0 && (u32)pos < ra.table_positions) cs = table[(size_t)pos * half + pair];
            else cs = rope_angle_fallback(ra, pos, pair);
            const float x0 = (j & 1) ? other : s, x1 = (j & 1) ? s : other;
            v = (j & 1) ? __fmaf_rn(x0, cs.y, x1 * cs.x) : __fmaf_rn(x0, cs.x, -(x1 * cs.y));
        }
    }
    if (D < 0) {
        ((float*)out)[row] = v;
    } else {
        u64 p = (u64)(step ? step[0] : start);
        if (ring != NONE_U32) p %= ring;
        enc<D < 0 ? 0 : D>(out + p * dst_row, row, v);
    }
}

// Decode matvecs of one activation row grouped into one launch (the q, k
// and v projections of a layer): each segment is one node, computed by the
// kernel that node would launch alone (matmul_rows_body; a plain matmul is
// mode 0), on blocks [first_block, next segment's first_block). Mode: 4 *
// rope + (D + 1), D as in matmul_rows_body. Mirrors `RowsSeg` in matmul.rs.
struct RowsSeg {
    const u8* w;
    u8* out;
    const i32* positions;
    const float2* table;
    const u32* step;
    u64 dst_row;
    RopeArgs ra;
    u32 start, ring;
    int m, first_block, mode, pre;
    const float* bias;  // or null
};

template <class F, int CH>
DEV void rows_group_body(const u8* act, int nb, const RowsSeg& s, int blk) {
#define ROWS_GROUP_CASE(MODE, ROPE, D)                                                         \
    case MODE:                                                                                 \
        matmul_rows_body<F, CH, ROPE, D>(s.w, act, s.out, s.m, nb, s.positions, s.table, s.ra, \
                                         s.dst_row, s.start, s.ring, s.step, s.pre, blk,       \
                                         s.bias);                                              \
        break;
    switch (s.mode) {
        ROWS_GROUP_CASE(0, false, -1)
        ROWS_GROUP_CASE(1, false, 0)
        ROWS_GROUP_CASE(2, false, 1)
        ROWS_GROUP_CASE(3, false, 2)
        ROWS_GROUP_CASE(4, true, -1)
        ROWS_GROUP_CASE(5, true, 0)
        ROWS_GROUP_CASE(6, true, 1)
        ROWS_GROUP_CASE(7, true, 2)
    }
#undef ROWS_GROUP_CASE
}

// The segment block `b` of a grouped launch belongs to.
DEV const RowsSeg& group_seg(int b, int segs, const RowsSeg& s0, const RowsSeg& s1,
                             const RowsSeg& s2) {
    return segs > 2 && b >= s2.first_block ? s2 : segs > 1 && b >= s1.first_block ? s1 : s0;
}

// mm_rows_group_*: weight pieces loaded by each lane (mv_rows32);
// mm_rows_group_*_staged: each block's rows copied into shared memory first.
#define ROWS_GROUP_ENTRY(FMT, F)                                                               \
    extern "C" __global__ void __launch_bounds__(256)                                          \
        mm_rows_group_##FMT(const u8* act, int nb, int segs, RowsSeg s0, RowsSeg s1,           \
                            RowsSeg s2) {                                                      \
        const RowsSeg& s = group_seg(blockIdx.x, segs, s0, s1, s2);                            \
        if (nb > 24) rows_group_body<F, 48>(act, nb, s, blockIdx.x - s.first_block);           \
        else rows_group_body<F, 24>(act, nb, s, blockIdx.x - s.first_block);                   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                          \
        mm_rows_group_##FMT##_staged(const u8* act, int nb, int segs, RowsSeg s0, RowsSeg s1,  \
                                     RowsSeg s2) {                                             \
        const RowsSeg& s = group_seg(blockIdx.x, segs, s0, s1, s2);                            \
        rows_group_body<F, 0>(act, nb, s, blockIdx.x - s.first_block);                         \
    }
ROWS_GROUP_ENTRY(q4_0, FmtQ4_0)
ROWS_GROUP_ENTRY(q4_1, FmtQ4_1)
ROWS_GROUP_ENTRY(q5_0, FmtQ5_0)
ROWS_GROUP_ENTRY(q8_0, FmtQ8_0)

// The feed-forward's middle, fused: 32 rows of the gate projection per
// block (and of the up projection, UP; else `u` is read), silu(gate) * up
// per row as silu_mul computes it, and the block's 32 values quantized as
// one Q8_0 / Q8_1 block (F) exactly as silu_mul+quantize quantizes them.
// `pre`: both weight matrices (UP) or the gate's are constant (mv_rows32).
template <class F, bool UP, int OUTF>
DEV void matmul_silu_quant_body(const u8* wg, const u8* wu_or_u, const u8* act, u8* out, int m,
                                int nb, int pre) {
    __shared__ float vals[32];
    int row;
    float s[2];
    if (UP) mv_rows32<F, 24, 2>(wg, wu_or_u, act, m, nb, &row, s, pre, blockIdx.x);
    else s[0] = mv_row32<F, 24>(wg, act, m, nb, &row, pre, blockIdx.x);
    if ((threadIdx.x & 7) == 0) {
        const float g = s[0];
        const float u = UP ? s[1] : ((const float*)wu_or_u)[row];
        vals[threadIdx.x >> 3] = silu_times(g, u);
    }
    __syncthreads();
    if (threadIdx.x < 32) quant_q8_warp<OUTF>(vals[threadIdx.x], out + (size_t)blockIdx.x * (OUTF == 1 ? 36 : 34));
}

// The fused gate/up with both matrices' rows staged, as a cluster of two
// blocks per quantized output block (the one-block form runs on only m / 32
// SMs): each block stages and multiplies 16 rows of both matrices
// (mv_rows32_staged, 128 threads), stores its silu(gate) * up values into
// block 0's shared memory, and after one cluster barrier block 0 quantizes
// the 32 as the one-block form does.
template <class F, int OUTF>
DEV void matmul_silu_quant_pair_body(const u8* wg, const u8* wu, const u8* act, u8* out, int m,
                                     int nb, int pre) {
    __shared__ float vals[32];
    int row;
    float s[2];
    mv_rows32_staged<F, 2>(wg, wu, act, m, nb, &row, s, pre, blockIdx.x);
    const u32 rank = cluster_rank();  // blockIdx.x & 1: which 16 rows of the 32
    if ((threadIdx.x & 7) == 0) {
        const float v = silu_times(s[0], s[1]);
        cluster_st_u32(&vals[rank * 16 + (threadIdx.x >> 3)], 0, __float_as_uint(v));
    }
    cluster_sync();
    if (rank == 0 && threadIdx.x < 32)
        quant_q8_warp<OUTF>(vals[threadIdx.x],
                            out + (size_t)(blockIdx.x >> 1) * (OUTF == 1 ? 36 : 34));
}

#define MATMUL_SILU_PAIR_ENTRY(NAME, F, OUTF)                                                  \
    extern "C" __global__ void CLUSTER_DIMS(2) __launch_bounds__(128)                          \
        NAME(const u8* wg, const u8* wu, const u8* act, u8* out, int m, int nb, int pre) {     \
        matmul_silu_quant_pair_body<F, OUTF>(wg, wu, act, out, m, nb, pre);                    \
    }

#define MATMUL_SILU_ENTRY(NAME, F, UP, OUTF)                                                   \
    extern "C" __global__ void __launch_bounds__(256)                                          \
        NAME(const u8* wg, const u8* wu_or_u, const u8* act, u8* out, int m, int nb,           \
             int pre) {                                                                        \
        matmul_silu_quant_body<F, UP, OUTF>(wg, wu_or_u, act, out, m, nb, pre);                \
    }
#define MATMUL_SILU_FORMAT(FMT, F)                                                             \
    MATMUL_SILU_ENTRY(mm_silu_##FMT##_q8_0, F, false, 0)                                       \
    MATMUL_SILU_ENTRY(mm_silu_##FMT##_q8_1, F, false, 1)                                       \
    MATMUL_SILU_ENTRY(mm_gate_up_silu_##FMT##_q8_0, F, true, 0)                                \
    MATMUL_SILU_ENTRY(mm_gate_up_silu_##FMT##_q8_1, F, true, 1)                                \
    MATMUL_SILU_PAIR_ENTRY(mm_gate_up_silu_##FMT##_q8_0_pair, F, 0)                            \
    MATMUL_SILU_PAIR_ENTRY(mm_gate_up_silu_##FMT##_q8_1_pair, F, 1)
MATMUL_SILU_FORMAT(q4_0, FmtQ4_0)
MATMUL_SILU_FORMAT(q4_1, FmtQ4_1)
MATMUL_SILU_FORMAT(q5_0, FmtQ5_0)
MATMUL_SILU_FORMAT(q8_0, FmtQ8_0)
