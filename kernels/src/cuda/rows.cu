// Row movement: embedding lookup (any weight format to f32), activation
// quantization (Q8_0, Q8_1, Q8_K, F16, BF16, exactly as the CPU's x86
// quantizers), cache writes (f32 to f16/bf16/f32 rows, ring slots) and
// type-converting copies.

// ---- dequantization of element e of a row (weft_ops::quant's formulas) ----
// Type codes: 0 f32, 1 f16, 2 bf16, 3 q4_0, 4 q4_1, 5 q5_0, 6 q8_0, 7 q4_k, 8 q6_k.

DEV int nibble(const u8* qs, int j) { return j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4); }

template <int T>
DEV float deq(const u8* row, int e) {
    if (T == 0) return ((const float*)row)[e];
    if (T == 1) return h2f(((const u16*)row)[e]);
    if (T == 2) return bf2f(((const u16*)row)[e]);
    const int j = e & 31;
    if (T == 3) {
        const u8* b = row + (e >> 5) * 18;
        return (float)(nibble(b + 2, j) - 8) * ld_f16(b);
    }
    if (T == 4) {
        const u8* b = row + (e >> 5) * 20;
        return (float)nibble(b + 4, j) * ld_f16(b) + ld_f16(b + 2);
    }
    if (T == 5) {
        const u8* b = row + (e >> 5) * 22;
        const u32 qh = ld_u32_a2(b + 2);
        const int q = nibble(b + 6, j) | (int)(((qh >> j) & 1u) << 4);
        return (float)(q - 16) * ld_f16(b);
    }
    if (T == 6) {
        const u8* b = row + (e >> 5) * 34;
        return (float)(i8)b[2 + j] * ld_f16(b);
    }
    if (T == 7) {
        const u8* b = row + (e >> 8) * 144;
        const int w = e & 255, sub = w >> 5, cp = w >> 6, l = w & 63;
        const int q = l < 32 ? (b[16 + 32 * cp + l] & 0x0f) : (b[16 + 32 * cp + l - 32] >> 4);
        int sc, mn;
        q4k_scales_mins(b + 4, sub, &sc, &mn);
        return (ld_f16(b) * (float)sc) * (float)q - ld_f16(b + 2) * (float)mn;
    }
    // T == 8: q6_k
    const u8* b = row + (e >> 8) * 210;
    const int w = e & 255, h = w >> 7, jj = (w & 127) >> 5, l = w & 31;
    const u8 ql = b[64 * h + (jj & 1) * 32 + l];
    const int lo = jj < 2 ? (ql & 0x0f) : (ql >> 4);
    const int hi = (b[128 + 32 * h + l] >> (2 * jj)) & 3;
    const int q = lo | (hi << 4);
    return (ld_f16(b + 208) * (float)(i8)b[192 + (w >> 4)]) * (float)(q - 32);
}

// Encodes a value into a float row: 0 f32, 1 f16, 2 bf16.
template <int D>
DEV void enc(u8* row, int e, float v) {
    if (D == 0) ((float*)row)[e] = v;
    else if (D == 1) ((u16*)row)[e] = f2h(v);
    else ((u16*)row)[e] = f2bf(v);
}

template <int T>
DEV void get_rows_body(const u8* table, const i32* ids, float* out, int n, int cols,
                       int table_rows, size_t row_bytes) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * cols) return;
    const int r = (int)(i / cols), e = (int)(i % cols);
    const int id = ids[r];
    if (id < 0 || id >= table_rows) {
        out[i] = __int_as_float(0x7fc00000);  // an id outside the table: NaN row
        return;
    }
    out[i] = deq<T>(table + (size_t)id * row_bytes, e);
}

#define GET_ROWS_ENTRY(NAME, T)                                                                \
    extern "C" __global__ void NAME(const u8* table, const i32* ids, float* out, int n,        \
                                    int cols, int table_rows, u64 row_bytes) {                 \
        pdl_sync();                                                                            \
        get_rows_body<T>(table, ids, out, n, cols, table_rows, (size_t)row_bytes);             \
    }
GET_ROWS_ENTRY(get_rows_f32, 0)
GET_ROWS_ENTRY(get_rows_f16, 1)
GET_ROWS_ENTRY(get_rows_bf16, 2)
GET_ROWS_ENTRY(get_rows_q4_0, 3)
GET_ROWS_ENTRY(get_rows_q4_1, 4)
GET_ROWS_ENTRY(get_rows_q5_0, 5)
GET_ROWS_ENTRY(get_rows_q8_0, 6)
GET_ROWS_ENTRY(get_rows_q4_k, 7)
GET_ROWS_ENTRY(get_rows_q6_k, 8)

// ---- copy with conversion ----------------------------------------------------

template <int T, int D>
DEV void copy_body(const u8* src, u8* dst, int rows, int cols, size_t src_row, size_t dst_row) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols) return;
    const int r = (int)(i / cols), e = (int)(i % cols);
    enc<D>(dst + (size_t)r * dst_row, e, deq<T>(src + (size_t)r * src_row, e));
}
#define COPY_ENTRY(NAME, T, D)                                                                 \
    extern "C" __global__ void NAME(const u8* src, u8* dst, int rows, int cols, u64 src_row,   \
                                    u64 dst_row) {                                             \
        pdl_sync();                                                                            \
        copy_body<T, D>(src, dst, rows, cols, (size_t)src_row, (size_t)dst_row);               \
    }
#define COPY_ENTRIES(SRC, T)                                                                   \
    COPY_ENTRY(copy_##SRC##_f32, T, 0)                                                         \
    COPY_ENTRY(copy_##SRC##_f16, T, 1)                                                         \
    COPY_ENTRY(copy_##SRC##_bf16, T, 2)
COPY_ENTRIES(f32, 0)
COPY_ENTRIES(f16, 1)
COPY_ENTRIES(bf16, 2)
COPY_ENTRIES(q4_0, 3)
COPY_ENTRIES(q4_1, 4)
COPY_ENTRIES(q5_0, 5)
COPY_ENTRIES(q8_0, 6)
COPY_ENTRIES(q4_k, 7)
COPY_ENTRIES(q6_k, 8)

// ---- set_rows: src f32 [n, cols] into rows start + i (ring: % ring) ----------
// `step` (may be null) holds the start position for graph replays.

template <int D>
DEV void set_rows_body(const float* src, u8* dst, int n, int cols, size_t dst_row, u32 start,
                       u32 ring, const u32* step) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * cols) return;
    const u32 s0 = step ? step[0] : start;
    const int r = (int)(i / cols), e = (int)(i % cols);
    u64 p = (u64)s0 + (u64)r;
    if (ring != NONE_U32) p %= ring;
    enc<D>(dst + (size_t)p * dst_row, e, src[i]);
}
#define SET_ROWS_ENTRY(NAME, D)                                                                \
    extern "C" __global__ void NAME(const float* src, u8* dst, int n, int cols, u64 dst_row,   \
                                    u32 start, u32 ring, const u32* step) {                    \
        pdl_sync();                                                                            \
        set_rows_body<D>(src, dst, n, cols, (size_t)dst_row, start, ring, step);               \
    }
SET_ROWS_ENTRY(set_rows_f32, 0)
SET_ROWS_ENTRY(set_rows_f16, 1)
SET_ROWS_ENTRY(set_rows_bf16, 2)

// ---- activation quantizers -----------------------------------------------------

// Q8_0 / Q8_1: one warp per 32-element block (ggml's x86 quantize_row_q8_*:
// amax, d = amax / 127, id = 127 / amax, round half to even, f16 d and
// s = f16(d * sum(q)) with the unrounded d).
// One 32-element block by the warp, lane l holding element l.
template <int WITH_SUM>
DEV void quant_q8_warp(const float v, u8* blk) {
    const int lane = threadIdx.x & 31;
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int q = __float2int_rn(v * id);
    q = max(-128, min(127, q));
    const int bytes = WITH_SUM ? 36 : 34;
    blk[bytes - 32 + lane] = (u8)(i8)q;
    const int sum = WITH_SUM ? warp_sum_i(q) : 0;
    if (lane == 0) {
        *(u16*)blk = f2h(d);
        if (WITH_SUM) *(u16*)(blk + 2) = f2h(d * (float)sum);
    }
}

template <int WITH_SUM>
DEV void quant_q8_body(const float* x, u8* out, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const size_t gw = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int nbr = cols / 32;
    if (gw >= (size_t)rows * nbr) return;  // uniform per warp
    // Rows are contiguous: block gw covers elements 32 * gw ..
    quant_q8_warp<WITH_SUM>(x[gw * 32 + lane], out + gw * (WITH_SUM ? 36 : 34));
}
extern "C" __global__ void quant_q8_0(const float* x, u8* out, int rows, int cols) {
    pdl_sync();
    quant_q8_body<0>(x, out, rows, cols);
}
extern "C" __global__ void quant_q8_1(const float* x, u8* out, int rows, int cols) {
    pdl_sync();
    quant_q8_body<1>(x, out, rows, cols);
}

// Q8_K quantization of 256 values held by a warp, lane l holding elements
// 8l..8l+7 (quantize_row_q8_K_ref: the element of largest magnitude, the
// first one on ties, gives max; iscale = -127 / max; q = min(127,
// nearest(x * iscale)); d = 1 / iscale; sums of 16). Returns d, and this
// lane's codes in `q` and in `*pair_sum` the sum of the 16 codes of lanes
// 2k and 2k + 1; a block of zeros gives d = 0, codes 0 and sums 0. The
// callers lay the block out (quant_q8k_warp, matmul_id_decode.cu's copy).
DEV float q8k_warp_codes(const float* v, int* q, int* pair_sum) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[i]));
    amax = warp_max(amax);
    if (amax == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = 0;
        *pair_sum = 0;
        return 0.0f;
    }
    int first = 8;
#pragma unroll
    for (int i = 7; i >= 0; i--)
        if (fabsf(v[i]) == amax) first = i;
    const u32 hit = __ballot_sync(FULL_MASK, first < 8);
    const int src_lane = __ffs(hit) - 1;
    const int src_idx = __shfl_sync(FULL_MASK, first, src_lane);
    float chosen = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i == src_idx) chosen = v[i];
    const float mx = __shfl_sync(FULL_MASK, chosen, src_lane);
    const float iscale = -127.0f / mx;
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        q[i] = min(127, __float2int_rn(v[i] * iscale));
        sum += q[i];
    }
    *pair_sum = sum + __shfl_xor_sync(FULL_MASK, sum, 1);
    return 1.0f / iscale;
}

// A Q8_K block (d, 256 codes, 16 sums) quantized by a warp (q8k_warp_codes).
DEV void quant_q8k_warp(const float* v, u8* blk) {
    const int lane = threadIdx.x & 31;
    int q[8], sum;
    const float d = q8k_warp_codes(v, q, &sum);
#pragma unroll
    for (int i = 0; i < 8; i++) blk[4 + lane * 8 + i] = (u8)(i8)q[i];
    if ((lane & 1) == 0) *(i16*)(blk + 260 + lane) = (i16)sum;
    if (lane == 0) *(float*)blk = d;
}

// Q8_0 / Q8_1 block quantized by one thread from its 32 values (the same
// arithmetic as quant_q8_body).
template <int WITH_SUM>
DEV void quant_q8_thread(const float* v, u8* blk) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int bytes = WITH_SUM ? 36 : 34;
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        int q = __float2int_rn(v[i] * id);
        q = max(-128, min(127, q));
        blk[bytes - 32 + i] = (u8)(i8)q;
        sum += q;
    }
    *(u16*)blk = f2h(d);
    if (WITH_SUM) *(u16*)(blk + 2) = f2h(d * (float)sum);
}

extern "C" __global__ void quant_q8_k(const float* x, u8* out, int rows, int cols) {
    pdl_sync();
    const int lane = threadIdx.x & 31;
    const size_t gw = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int nbr = cols / 256;
    if (gw >= (size_t)rows * nbr) return;
    const float* src = x + gw * 256 + lane * 8;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = src[i];
    quant_q8k_warp(v, out + gw * Q8K_BYTES);
}

// F16 / BF16 activations: one element per thread.
extern "C" __global__ void quant_f16(const float* x, u16* out, u64 count) {
    pdl_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = f2h(x[i]);
}
extern "C" __global__ void quant_bf16(const float* x, u16* out, u64 count) {
    pdl_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = f2bf(x[i]);
}
