// Half-precision prefill products on the tensor cores (numerics `fast`):
// out = x @ w^T for f16 or bf16 weights against activation rows already in
// the weights' type (the matmul converts f32 activations into its scratch
// first, as the exact kernels take them), for many tokens at once.
//
// Grid (weight-row tiles of 16 * NR rows, token tiles of MH_TOKENS). A
// block's four warps split its tile 2 x 2: each warp takes 32 tokens and
// 8 * NR weight rows, as m16 x n8 fragments of `mma.sync` m16n8k16 (the
// tokens on the m side, the weight rows on the n side, f32 accumulators).
// The columns go by in stages of MH_KS, copied into shared memory with
// 16-byte `cp.async` one stage ahead (two buffers); shared rows are padded
// by 16 bytes so a warp's fragment loads hit 32 different banks. Rows past
// the end of x or w read the last row and are not stored.
//
// Float order and bound: each mma adds sixteen exact products of the
// half-precision operands into an f32 accumulator, the columns in order
// sixteen at a time. Against an f64 sum of the same products the error is
// at most about (k / 16) * 2^-23 of the sum of |w x| (the tests allow 1e-4
// of it at k <= 4096); the exact kernels' own order is another f32 order
// of the same products.

#define MH_THREADS 128
#define MH_TOKENS 64           // tokens per block (32 per warp)
#define MH_KS 64               // columns per stage
#define MH_STRIDE (MH_KS + 8)  // halves per shared row (16 bytes of padding)

// c += a b for one m16n8k16 fragment, bf16 operands when BF (else f16).
template <int BF>
DEV void mh_mma(float* c, const u32* a, u32 b0, u32 b1) {
    if constexpr (BF) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// BF: bf16 operands (else f16). NR: n8 fragments of weight rows per warp.
// `w`: m rows of k halves; `x`: n rows of k halves; `out`: n rows of m f32.
// k is a multiple of MH_KS; `w` and `x` are 16-byte aligned.
template <int BF, int NR>
DEV void mh_body(const u16* w, const u16* x, float* out, int m, int n, int k) {
    enum { ROWS = 16 * NR };
    extern __shared__ __align__(16) u8 mh_smem[];
    u16* const sx = (u16*)mh_smem;                   // [2][MH_TOKENS][MH_STRIDE]
    u16* const sw = sx + 2 * MH_TOKENS * MH_STRIDE;  // [2][ROWS][MH_STRIDE]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const int r0 = blockIdx.x * ROWS, t0 = blockIdx.y * MH_TOKENS;
    const int wt = (warp >> 1) * 32, wr = (warp & 1) * (8 * NR);
    pdl_sync();
    const int stages = k / MH_KS;

    auto load = [&](int s) {
        const int buf = s & 1;
        const size_t c0 = (size_t)s * MH_KS;
        for (int i = tid; i < (MH_TOKENS + ROWS) * (MH_KS / 8); i += MH_THREADS) {
            const int r = i / (MH_KS / 8), ch = i % (MH_KS / 8);
            if (r < MH_TOKENS) {
                const int t = min(t0 + r, n - 1);
                cp_async16(sx + (buf * MH_TOKENS + r) * MH_STRIDE + ch * 8,
                           x + (size_t)t * k + c0 + ch * 8);
            } else {
                const int rr = r - MH_TOKENS, row = min(r0 + rr, m - 1);
                cp_async16(sw + (buf * ROWS + rr) * MH_STRIDE + ch * 8,
                           w + (size_t)row * k + c0 + ch * 8);
            }
        }
        cp_async_commit();
    };

    float acc[2][NR][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NR; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;

    load(0);
    for (int s = 0; s < stages; s++) {
        if (s + 1 < stages) {
            load(s + 1);
            cp_async_wait_one();
        } else {
            cp_async_wait_all();
        }
        __syncthreads();
        const u16* X = sx + (s & 1) * MH_TOKENS * MH_STRIDE;
        const u16* W = sw + (s & 1) * ROWS * MH_STRIDE;
#pragma unroll
        for (int kk = 0; kk < MH_KS / 16; kk++) {
            u32 a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const u16* p = X + (wt + mt * 16 + g) * MH_STRIDE + kk * 16 + 2 * tq;
                a[mt][0] = *(const u32*)p;
                a[mt][1] = *(const u32*)(p + 8 * MH_STRIDE);
                a[mt][2] = *(const u32*)(p + 8);
                a[mt][3] = *(const u32*)(p + 8 * MH_STRIDE + 8);
            }
#pragma unroll
            for (int nt = 0; nt < NR; nt++) {
                const u16* q = W + (wr + nt * 8 + g) * MH_STRIDE + kk * 16 + 2 * tq;
                const u32 b0 = *(const u32*)q, b1 = *(const u32*)(q + 8);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) mh_mma<BF>(acc[mt][nt], a[mt], b0, b1);
            }
        }
        __syncthreads();
    }

    const bool pairs = (m & 1) == 0 && ((size_t)out & 7) == 0;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NR; nt++) {
            const int row = r0 + wr + nt * 8 + 2 * tq;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int t = t0 + wt + mt * 16 + g + 8 * h;
                if (t >= n || row >= m) continue;
                float* o = out + (size_t)t * m + row;
                if (pairs) {
                    *(float2*)o = make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
                } else {
                    o[0] = acc[mt][nt][2 * h];
                    if (row + 1 < m) o[1] = acc[mt][nt][2 * h + 1];
                }
            }
        }
}

#define MH_ENTRY(NAME, BF, NR)                                                                  \
    extern "C" __global__ void __launch_bounds__(MH_THREADS)                                    \
        NAME(const u16* w, const u16* x, float* out, int m, int n, int k) {                     \
        mh_body<BF, NR>(w, x, out, m, n, k);                                                    \
    }
MH_ENTRY(mh_f16_r64, 0, 4)
MH_ENTRY(mh_f16_r32, 0, 2)
MH_ENTRY(mh_bf16_r64, 1, 4)
MH_ENTRY(mh_bf16_r32, 1, 2)
