// Fast quantized matrix products for prefill (numerics `fast`): int8
// tensor-core products (`mma.sync` m16n8k32, and m16n8k16 for Q6_K's
// 16-element scales), the idea of llama.cpp's MMQ.
//
// `out[t][r] = w_row(r) . act_row(t)` over 32-element chunks c: a weight
// chunk is 32 signed codes with a scale and an offset (value = dw * code +
// mw), an activation chunk 32 codes with a scale and, for formats with an
// offset, its scaled code sum sa (Q8_1's s; Q8_K's d times its two
// 16-element sums). Then
//   out[t][r] = sum_c  dw(r,c) da(t,c) isum(r,t,c) + mw(r,c) sa(t,c)
// with isum the exact integer dot product of the chunk's codes. Q4_K's
// sub-block scale and min fold into dw and mw; Q6_K's two 16-element scales
// give two integer sums per chunk.
//
// Tiles: a block of four warps computes BM weight rows x BN tokens; each
// warp 32 rows x 8*NT tokens (two m16 tiles, NT n8 tiles). A stage holds
// MQ_KC chunks of the block's rows and tokens in shared memory as codes
// (one 16-byte-aligned row of 8 words per chunk, rows padded to 36 words so
// a warp's fragment loads hit 32 different banks) and (scale, offset)
// pairs. Two stages alternate: the global loads of the next stage are
// issued before the products of this one and decoded after them.
//
// Float order and bound: each chunk's integer sum is exact (|isum| < 2^20,
// converted exactly); per output, the chunks are accumulated in order by
// two fused multiply-adds each (dw*da rounded once). The CPU's exact order
// sums the same terms in eight lanes: the two differ by the rounding of
// f32 sums of kb terms, |error| <= ~2 kb ulp(sum of |terms|) (the tests
// allow 1e-5 of sum |w||x| over the row).

#define MQ_THREADS 128
#define MQ_KC 4                    // chunks of 32 elements per stage
#define MQ_STRIDE (MQ_KC * 8 + 4)  // words per tile row (padded)

// N words from a 2-aligned address: N aligned loads, one more when the
// address is not 4-aligned, joined by a funnel shift when decoded (so the
// loads stay in flight until then).
template <int N>
struct MqSpan {
    u32 w[N + 1];
    u32 sh;
};
template <int N>
DEV void mq_fetch(MqSpan<N>& s, const u8* p) {
    const size_t a = (size_t)p;
    const u32* q = (const u32*)(a & ~(size_t)3);
    s.sh = (u32)(a & 3) * 8u;
#pragma unroll
    for (int i = 0; i < N; i++) s.w[i] = q[i];
    s.w[N] = s.sh ? q[N] : 0u;
}
template <int N>
DEV u32 mq_word(const MqSpan<N>& s, int i) {
    return __funnelshift_r(s.w[i], s.w[i + 1], s.sh);
}

// The four word-groups of a 32-element nibble block's codes: low nibbles
// of its 16 bytes are elements 0..15, high nibbles 16..31.
DEV void mq_nibbles(const u32* qs, u32* codes) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        codes[i] = qs[i] & 0x0f0f0f0fu;
        codes[i + 4] = (qs[i] >> 4) & 0x0f0f0f0fu;
    }
}

// ---- weight formats: fetch (global loads) and decode (codes, scales) -----

struct MqQ4_0 {
    enum { ELEMS = 32, BYTES = 18, MIN = 0, SPLIT = 0, TABLE = 0 };
    struct Raw {
        u32 d;
        MqSpan<4> qs;
    };
    static __device__ __forceinline__ void fetch(Raw& r, const u8* row, int c) {
        const u8* b = row + (size_t)c * BYTES;
        r.d = ld_u16(b);
        mq_fetch(r.qs, b + 2);
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, u32* codes, float4& s, const u32*) {
        u32 qs[4];
#pragma unroll
        for (int i = 0; i < 4; i++) qs[i] = mq_word(r.qs, i);
        mq_nibbles(qs, codes);
#pragma unroll
        for (int i = 0; i < 8; i++) codes[i] = __vsub4(codes[i], 0x08080808u);
        s = make_float4(h2f((u16)r.d), 0.0f, 0.0f, 0.0f);
    }
};

struct MqQ4_1 {
    enum { ELEMS = 32, BYTES = 20, MIN = 1, SPLIT = 0, TABLE = 0 };
    struct Raw {
        u32 dm;
        u32 qs[4];
    };
    static __device__ __forceinline__ void fetch(Raw& r, const u8* row, int c) {
        const u8* b = row + (size_t)c * BYTES;
        r.dm = ld_u32_a4(b);
#pragma unroll
        for (int i = 0; i < 4; i++) r.qs[i] = ld_u32_a4(b + 4 + 4 * i);
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, u32* codes, float4& s, const u32*) {
        mq_nibbles(r.qs, codes);
        s = make_float4(h2f((u16)(r.dm & 0xffffu)), h2f((u16)(r.dm >> 16)), 0.0f, 0.0f);
    }
};

struct MqQ5_0 {
    enum { ELEMS = 32, BYTES = 22, MIN = 0, SPLIT = 0, TABLE = 0 };
    struct Raw {
        u32 d;
        MqSpan<5> hq;  // qh (4 bytes), then qs (16 bytes)
    };
    static __device__ __forceinline__ void fetch(Raw& r, const u8* row, int c) {
        const u8* b = row + (size_t)c * BYTES;
        r.d = ld_u16(b);
        mq_fetch(r.hq, b + 2);
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, u32* codes, float4& s, const u32*) {
        const u32 qh = mq_word(r.hq, 0);
        u32 qs[4];
#pragma unroll
        for (int i = 0; i < 4; i++) qs[i] = mq_word(r.hq, 1 + i);
        mq_nibbles(qs, codes);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const u32 hb = (qh >> (4 * k)) & 0xfu;
            const u32 high = ((hb & 1u) << 4) | ((hb & 2u) << 11) | ((hb & 4u) << 18) | ((hb & 8u) << 25);
            codes[k] = __vsub4(codes[k] | high, 0x10101010u);
        }
        s = make_float4(h2f((u16)r.d), 0.0f, 0.0f, 0.0f);
    }
};

struct MqQ8_0 {
    enum { ELEMS = 32, BYTES = 34, MIN = 0, SPLIT = 0, TABLE = 0 };
    struct Raw {
        u32 d;
        MqSpan<8> qs;
    };
    static __device__ __forceinline__ void fetch(Raw& r, const u8* row, int c) {
        const u8* b = row + (size_t)c * BYTES;
        r.d = ld_u16(b);
        mq_fetch(r.qs, b + 2);
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, u32* codes, float4& s, const u32*) {
#pragma unroll
        for (int i = 0; i < 8; i++) codes[i] = mq_word(r.qs, i);
        s = make_float4(h2f((u16)r.d), 0.0f, 0.0f, 0.0f);
    }
};

// Q4_K: chunk c is sub-block j = c % 8 of super-block c / 8: its nibbles
// are one half of the 32 bytes of pair j / 2; scale d * sc, offset
// -dmin * mn.
struct MqQ4_K {
    enum { ELEMS = 256, BYTES = 144, MIN = 1, SPLIT = 0, TABLE = 0 };
    struct Raw {
        u32 dd;
        u32 sc[3];
        u32 qs[8];
    };
    static __device__ __forceinline__ void fetch(Raw& r, const u8* row, int c) {
        const u8* b = row + (size_t)(c >> 3) * BYTES;
        const int j = c & 7;
        r.dd = ld_u32_a4(b);
#pragma unroll
        for (int i = 0; i < 3; i++) r.sc[i] = ld_u32_a4(b + 4 + 4 * i);
#pragma unroll
        for (int i = 0; i < 8; i++) r.qs[i] = ld_u32_a4(b + 16 + 32 * (j >> 1) + 4 * i);
    }
    static __device__ __forceinline__ u32 scale_byte(const u32* sc, int i) {
        const u32 w = i < 4 ? sc[0] : (i < 8 ? sc[1] : sc[2]);
        return (w >> (8 * (i & 3))) & 0xffu;
    }
    static __device__ __forceinline__ void decode(const Raw& r, int c, u32* codes, float4& s, const u32*) {
        const int j = c & 7;
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) codes[i] = (r.qs[i] >> shift) & 0x0f0f0f0fu;
        u32 sc, mn;
        if (j < 4) {
            sc = scale_byte(r.sc, j) & 63u;
            mn = scale_byte(r.sc, j + 4) & 63u;
        } else {
            sc = (scale_byte(r.sc, j + 4) & 0x0fu) | ((scale_byte(r.sc, j - 4) >> 6) << 4);
            mn = (scale_byte(r.sc, j + 4) >> 4) | ((scale_byte(r.sc, j) >> 6) << 4);
        }
        const float d = h2f((u16)(r.dd & 0xffffu)), dmin = h2f((u16)(r.dd >> 16));
        s = make_float4(__fmul_rn(d, (float)sc), -__fmul_rn(dmin, (float)mn), 0.0f, 0.0f);
    }
};

// Q6_K: chunk c is elements 32j..32j+31 (j = c % 8) of super-block c / 8:
// half h = j / 4, quarter q = j % 4; low bits in ql[64h + 32(q & 1) + l]
// (high nibble for q >= 2), high bits (qh[32h + l] >> 2q) & 3; the two
// 16-element halves have scales d * scales[2j] and d * scales[2j + 1].
struct MqQ6_K {
    enum { ELEMS = 256, BYTES = 210, MIN = 0, SPLIT = 1, TABLE = 0 };
    struct Raw {
        MqSpan<8> ql, qh;
        u32 sc, d;
    };
    static __device__ __forceinline__ void fetch(Raw& r, const u8* row, int c) {
        const u8* b = row + (size_t)(c >> 3) * BYTES;
        const int j = c & 7, h = j >> 2, q = j & 3;
        mq_fetch(r.ql, b + 64 * h + 32 * (q & 1));
        mq_fetch(r.qh, b + 128 + 32 * h);
        r.sc = ld_u16(b + 192 + 2 * j);
        r.d = ld_u16(b + 208);
    }
    static __device__ __forceinline__ void decode(const Raw& r, int c, u32* codes, float4& s, const u32*) {
        const int q = c & 3;
        const int lshift = 4 * (q >> 1), hshift = 2 * q;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 lo = (mq_word(r.ql, i) >> lshift) & 0x0f0f0f0fu;
            const u32 hi = ((mq_word(r.qh, i) >> hshift) & 0x03030303u) << 4;
            codes[i] = __vsub4(lo | hi, 0x20202020u);
        }
        const float d = h2f((u16)r.d);
        s = make_float4(__fmul_rn(d, (float)(i8)(r.sc & 0xffu)), __fmul_rn(d, (float)(i8)(r.sc >> 8)), 0.0f, 0.0f);
    }
};

// Q2_K: chunk c is elements 32j..32j+31 (j = c % 8) of super-block c / 8:
// half h = j / 4, codes (qs[32h + l] >> 2(j % 4)) & 3; its two 16-element
// halves have scales d * (scales[2j] & 15), d * (scales[2j + 1] & 15) and
// offsets -dmin * (scales[.] >> 4). The 4-bit scales fold into the codes
// (code * scale <= 45), d is the chunk's scale; the offsets take one slot
// per half against the activations' 16-element sums (MIN = 2: four slots).
struct MqQ2_K {
    enum { ELEMS = 256, BYTES = 84, MIN = 2, SPLIT = 0, TABLE = 0 };
    struct Raw {
        u32 qs[8];
        u32 sc, dd;
    };
    static __device__ __forceinline__ void fetch(Raw& r, const u8* row, int c) {
        const u8* b = row + (size_t)(c >> 3) * BYTES;
        const int j = c & 7;
#pragma unroll
        for (int i = 0; i < 8; i++) r.qs[i] = ld_u32_a4(b + 16 + 32 * (j >> 2) + 4 * i);
        r.sc = ld_u16(b + 2 * j);
        r.dd = ld_u32_a4(b + 80);
    }
    static __device__ __forceinline__ void decode(const Raw& r, int c, u32* codes, float4& s, const u32*) {
        const int shift = 2 * (c & 3);
        const u32 s0 = r.sc & 0x0fu, s1 = (r.sc >> 8) & 0x0fu;
#pragma unroll
        for (int i = 0; i < 8; i++) codes[i] = ((r.qs[i] >> shift) & 0x03030303u) * (i < 4 ? s0 : s1);
        const float d = h2f((u16)(r.dd & 0xffffu)), dmin = h2f((u16)(r.dd >> 16));
        s = make_float4(d, -__fmul_rn(dmin, (float)((r.sc >> 4) & 0x0fu)),
                        -__fmul_rn(dmin, (float)(r.sc >> 12)), 0.0f);
    }
};

// IQ2_XXS: chunk c is sub-block s = c % 8 of super-block c / 8: four grid
// patterns of eight magnitudes (the table in shared memory, as
// mmid_iq2xxs_grid lays it out), seven sign bits each (the eighth is their
// parity), scale d * (2 * s4 + 1) / 8.
struct MqIQ2_XXS {
    enum { ELEMS = 256, BYTES = 66, MIN = 0, SPLIT = 0, TABLE = 512 };
    struct Raw {
        u32 d, a, b;
    };
    static __device__ __forceinline__ void fetch(Raw& r, const u8* row, int c) {
        const u8* blk = row + (size_t)(c >> 3) * BYTES;
        const u8* q = blk + 2 + 8 * (c & 7);
        r.d = ld_u16(blk);
        r.a = ld_u32_a2(q);
        r.b = ld_u32_a2(q + 4);
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, u32* codes, float4& s, const u32* grid) {
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const u32 idx = (r.a >> (8 * g)) & 0xffu;
            const u32 s7 = (r.b >> (7 * g)) & 0x7fu;
            const u32 s8 = s7 | ((__popc(s7) & 1u) << 7);
            const u32 m0 = mmid_sign_mask(s8), m1 = mmid_sign_mask(s8 >> 4);
            codes[2 * g] = __vsub4(grid[2 * idx] ^ m0, m0);
            codes[2 * g + 1] = __vsub4(grid[2 * idx + 1] ^ m1, m1);
        }
        const float sc = __fmul_rn(h2f((u16)r.d), (float)(2 * (int)(r.b >> 28) + 1));
        s = make_float4(__fmul_rn(sc, 0.125f), 0.0f, 0.0f, 0.0f);
    }
};

// MXFP4: 32 four-bit indices into {0, 1, 2, 3, 4, 6, 8, 12} with a sign
// bit (low nibbles elements 0..15, high 16..31), scale 2^(e - 128)
// (weft_ops::quant::mxfp4::e8m0_half). Blocks of 17 bytes: any alignment.
DEV u32 mq_fp4_codes(u32 nib) {
    const u32 t = nib & 0x07070707u;
    u32 sel = t | (t >> 4);
    sel = (sel & 0xffu) | ((sel >> 8) & 0xff00u);
    const u32 v = __byte_perm(0x03020100u, 0x0c080604u, sel);
    const u32 m = ((nib >> 3) & 0x01010101u) * 0xffu;
    return __vsub4(v ^ m, m);
}
struct MqMXFP4 {
    enum { ELEMS = 32, BYTES = 17, MIN = 0, SPLIT = 0, TABLE = 0 };
    struct Raw {
        u32 e;
        MqSpan<4> qs;
    };
    static __device__ __forceinline__ void fetch(Raw& r, const u8* row, int c) {
        const u8* b = row + (size_t)c * BYTES;
        r.e = b[0];
        mq_fetch(r.qs, b + 1);
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, u32* codes, float4& s, const u32*) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 q = mq_word(r.qs, i);  // qs bytes 4i..4i+3
            codes[i] = mq_fp4_codes(q & 0x0f0f0f0fu);
            codes[i + 4] = mq_fp4_codes((q >> 4) & 0x0f0f0f0fu);
        }
        const u32 bits = r.e < 2u ? 0x00200000u << r.e : (r.e - 1u) << 23;
        s = make_float4(__uint_as_float(bits), 0.0f, 0.0f, 0.0f);
    }
};

// ---- activation formats ------------------------------------------------------

// Q8_0 activations are Q8_0 weights' blocks (no offset).
typedef MqQ8_0 MqAQ8_0;

struct MqAQ8_1 {
    enum { ELEMS = 32, BYTES = 36 };
    struct Raw {
        u32 ds;
        u32 qs[8];
    };
    static __device__ __forceinline__ void fetch(Raw& r, const u8* row, int c) {
        const u8* b = row + (size_t)c * BYTES;
        r.ds = ld_u32_a4(b);
#pragma unroll
        for (int i = 0; i < 8; i++) r.qs[i] = ld_u32_a4(b + 4 + 4 * i);
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, u32* codes, float4& s, const u32*) {
#pragma unroll
        for (int i = 0; i < 8; i++) codes[i] = r.qs[i];
        s = make_float4(h2f((u16)(r.ds & 0xffffu)), h2f((u16)(r.ds >> 16)), 0.0f, 0.0f);
    }
};

// Q8_K: chunk c is elements 32j.. of super-block c / 8 (j = c % 8); its
// code sum is bsums[2j] + bsums[2j + 1].
struct MqAQ8_K {
    enum { ELEMS = 256, BYTES = Q8K_BYTES };
    struct Raw {
        u32 d;
        u32 qs[8];
        u32 bs;
    };
    static __device__ __forceinline__ void fetch(Raw& r, const u8* row, int c) {
        const u8* b = row + (size_t)(c >> 3) * BYTES;
        const int j = c & 7;
        r.d = ld_u32_a4(b);
#pragma unroll
        for (int i = 0; i < 8; i++) r.qs[i] = ld_u32_a4(b + 4 + 32 * j + 4 * i);
        r.bs = ld_u32_a4(b + 260 + 4 * j);
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, u32* codes, float4& s, const u32*) {
#pragma unroll
        for (int i = 0; i < 8; i++) codes[i] = r.qs[i];
        const float d = __uint_as_float(r.d);
        const int sum = (int)(i16)(r.bs & 0xffffu) + (int)(i16)(r.bs >> 16);
        s = make_float4(d, __fmul_rn(d, (float)sum), 0.0f, 0.0f);
    }
};

// Q8_K against Q2_K's offsets: the chunk's two 16-element code sums apart.
struct MqAQ8_K2 : MqAQ8_K {
    static __device__ __forceinline__ void decode(const Raw& r, int, u32* codes, float4& s, const u32*) {
#pragma unroll
        for (int i = 0; i < 8; i++) codes[i] = r.qs[i];
        const float d = __uint_as_float(r.d);
        s = make_float4(d, __fmul_rn(d, (float)(int)(i16)(r.bs & 0xffffu)),
                        __fmul_rn(d, (float)(int)(i16)(r.bs >> 16)), 0.0f);
    }
};

// ---- the tile product --------------------------------------------------------------

DEV void mq_mma_k32(int* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
DEV void mq_mma_k16(int* c, u32 a0, u32 a1, u32 b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// An integer sum below 2^22 in magnitude as an f32, exactly (no quarter-rate
// conversion): the bits of 1.5 * 2^23 + i, less 1.5 * 2^23.
DEV float mq_i2f(int i) { return __fsub_rn(__int_as_float(0x4B400000 + i), 12582912.0f); }

// One stage buffer: codes [rows][MQ_STRIDE] words, then the scale slots
// [rows][MQ_KC][SLOTS] (scale, offset; Q2_K: scale, two half offsets), for
// BM weight rows then BN tokens.
template <int BM, int BN, int SLOTS>
struct MqStage {
    enum {
        W_CODES = 0,
        X_CODES = BM * MQ_STRIDE * 4,
        W_SCALES = (BM + BN) * MQ_STRIDE * 4,
        X_SCALES = W_SCALES + BM * MQ_KC * 4 * SLOTS,
        BYTES = X_SCALES + BN * MQ_KC * 4 * SLOTS,
    };
};

// Decoded codes and scales of one (row, chunk) item into a stage buffer
// (zeros for rows or chunks past the matrix).
template <int SLOTS>
DEV void mq_put(u8* stage, int codes_off, int scales_off, int row, int ci, const u32* codes,
                float4 s) {
    uint4* dst = (uint4*)(stage + codes_off + (row * MQ_STRIDE + ci * 8) * 4);
    dst[0] = make_uint4(codes[0], codes[1], codes[2], codes[3]);
    dst[1] = make_uint4(codes[4], codes[5], codes[6], codes[7]);
    if (SLOTS == 4)
        ((float4*)(stage + scales_off))[row * MQ_KC + ci] = s;
    else
        ((float2*)(stage + scales_off))[row * MQ_KC + ci] = make_float2(s.x, s.y);
}

template <int SLOTS>
DEV float4 mq_slots(const u8* base, int i) {
    if (SLOTS == 4) return ((const float4*)base)[i];
    const float2 v = ((const float2*)base)[i];
    return make_float4(v.x, v.y, 0.0f, 0.0f);
}

// The tile of weight rows bm0.. and tokens 0..nt-1 of this block: token t
// is activation row xmap[t] and output row omap[t] (bn0 + t without maps).
// `pre`: the weights are constant, so their first loads go out before the
// wait on the kernels before this one.
template <class W, class A, int WM, int NT>
DEV void mq_body(const u8* w, const u8* x, float* out, int m, int nt, int k, int pre, int bm0,
                 int bn0, const int* xmap, const int* omap) {
    constexpr int WN = 4 / WM;
    constexpr int BM = 32 * WM, BN = 8 * NT * WN;
    constexpr int SLOTS = W::MIN == 2 ? 4 : 2;
    constexpr int WI = BM * MQ_KC / MQ_THREADS;                     // weight items per thread
    constexpr int XI = (BN * MQ_KC + MQ_THREADS - 1) / MQ_THREADS;  // activation items
    typedef MqStage<BM, BN, SLOTS> L;
    extern __shared__ __align__(16) u8 mq_smem[];
    __shared__ u32 mq_table[W::TABLE > 0 ? W::TABLE : 1];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const int wr0 = (warp % WM) * 32, wt0 = (warp / WM) * 8 * NT;
    const int nch = k / 32;
    const int stages = (nch + MQ_KC - 1) / MQ_KC;
    const size_t wrow = (size_t)(k / W::ELEMS) * W::BYTES;
    const size_t xrow = (size_t)(k / A::ELEMS) * A::BYTES;
    if (W::TABLE) mmid_iq2xxs_grid(mq_table);

    typename W::Raw wraw[WI];
    typename A::Raw xraw[XI];
    auto fetch_w = [&](int s) {
#pragma unroll
        for (int i = 0; i < WI; i++) {
            const int it = tid + i * MQ_THREADS, row = it / MQ_KC, c = s * MQ_KC + it % MQ_KC;
            if (bm0 + row < m && c < nch) W::fetch(wraw[i], w + (size_t)(bm0 + row) * wrow, c);
        }
    };
    // Weights are constant when `pre`: their first loads go out before the
    // wait on the kernels before this one.
    if (pre) fetch_w(0);
    pdl_sync();
    if (!pre) fetch_w(0);

    // Each thread's activation items keep their token across stages.
    const u8* xp[XI];
#pragma unroll
    for (int i = 0; i < XI; i++) {
        const int it = tid + i * MQ_THREADS, tok = it / MQ_KC;
        xp[i] = it < BN * MQ_KC && tok < nt ? x + (size_t)(xmap ? xmap[tok] : bn0 + tok) * xrow
                                            : nullptr;
    }
    auto fetch_x = [&](int s) {
#pragma unroll
        for (int i = 0; i < XI; i++) {
            const int it = tid + i * MQ_THREADS, c = s * MQ_KC + it % MQ_KC;
            if (xp[i] && c < nch) A::fetch(xraw[i], xp[i], c);
        }
    };
    auto put = [&](int s, u8* stage) {
        u32 codes[8];
        float4 sc;
#pragma unroll
        for (int i = 0; i < WI; i++) {
            const int it = tid + i * MQ_THREADS, row = it / MQ_KC, ci = it % MQ_KC, c = s * MQ_KC + ci;
            if (bm0 + row < m && c < nch) {
                W::decode(wraw[i], c, codes, sc, mq_table);
            } else {
#pragma unroll
                for (int q = 0; q < 8; q++) codes[q] = 0u;
                sc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            mq_put<SLOTS>(stage, L::W_CODES, L::W_SCALES, row, ci, codes, sc);
        }
#pragma unroll
        for (int i = 0; i < XI; i++) {
            const int it = tid + i * MQ_THREADS, tok = it / MQ_KC, ci = it % MQ_KC, c = s * MQ_KC + ci;
            if (it >= BN * MQ_KC) continue;
            if (xp[i] && c < nch) {
                A::decode(xraw[i], c, codes, sc, mq_table);
            } else {
#pragma unroll
                for (int q = 0; q < 8; q++) codes[q] = 0u;
                sc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            mq_put<SLOTS>(stage, L::X_CODES, L::X_SCALES, tok, ci, codes, sc);
        }
    };

    fetch_x(0);
    if (W::TABLE) __syncthreads();
    put(0, mq_smem);
    __syncthreads();

    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][j][i] = 0.0f;

    for (int s = 0; s < stages; s++) {
        const bool next = s + 1 < stages;
        if (next) {
            fetch_w(s + 1);
            fetch_x(s + 1);
        }
        const u8* st = mq_smem + (s & 1) * L::BYTES;
        const u32* wc = (const u32*)(st + L::W_CODES);
        const u32* xc = (const u32*)(st + L::X_CODES);
        // Chunks past the matrix hold zeros: every stage takes MQ_KC.
#pragma unroll
        for (int ci = 0; ci < MQ_KC; ci++) {
            u32 a[2][4], b[NT][2];
            float4 wsc[2][2], xsc[NT][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int r = wr0 + 16 * mt + g;
                const u32* p0 = wc + r * MQ_STRIDE + ci * 8 + tq;
                const u32* p1 = p0 + 8 * MQ_STRIDE;
                a[mt][0] = p0[0];
                a[mt][1] = p1[0];
                a[mt][2] = p0[4];
                a[mt][3] = p1[4];
                wsc[mt][0] = mq_slots<SLOTS>(st + L::W_SCALES, r * MQ_KC + ci);
                wsc[mt][1] = mq_slots<SLOTS>(st + L::W_SCALES, (r + 8) * MQ_KC + ci);
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int t = wt0 + 8 * j;
                const u32* p = xc + (t + g) * MQ_STRIDE + ci * 8 + tq;
                b[j][0] = p[0];
                b[j][1] = p[4];
                xsc[j][0] = mq_slots<SLOTS>(st + L::X_SCALES, (t + 2 * tq) * MQ_KC + ci);
                xsc[j][1] = mq_slots<SLOTS>(st + L::X_SCALES, (t + 2 * tq + 1) * MQ_KC + ci);
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    int c0[4] = {0, 0, 0, 0};
                    int c1[4] = {0, 0, 0, 0};
                    if (W::SPLIT) {
                        mq_mma_k16(c0, a[mt][0], a[mt][1], b[j][0]);
                        mq_mma_k16(c1, a[mt][2], a[mt][3], b[j][1]);
                    } else {
                        mq_mma_k32(c0, a[mt], b[j][0], b[j][1]);
                    }
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float4 wv = wsc[mt][i >> 1], xv = xsc[j][i & 1];
                        float& o = acc[mt][j][i];
                        o = __fmaf_rn(__fmul_rn(wv.x, xv.x), mq_i2f(c0[i]), o);
                        if (W::SPLIT) o = __fmaf_rn(__fmul_rn(wv.y, xv.x), mq_i2f(c1[i]), o);
                        if (W::MIN >= 1) o = __fmaf_rn(wv.y, xv.y, o);
                        if (W::MIN == 2) o = __fmaf_rn(wv.z, xv.z, o);
                    }
                }
        }
        if (next) put(s + 1, mq_smem + ((s + 1) & 1) * L::BYTES);
        __syncthreads();
    }

#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = bm0 + wr0 + 16 * mt + g + 8 * (i >> 1);
                const int t = wt0 + 8 * j + 2 * tq + (i & 1);
                if (r < m && t < nt) out[(size_t)(omap ? omap[t] : bn0 + t) * m + r] = acc[mt][j][i];
            }
}

#define MQ_ENTRY(NAME, W, A, WM, NT)                                                            \
    extern "C" __global__ void __launch_bounds__(MQ_THREADS)                                    \
        mq_##NAME##_w##WM##n##NT(const u8* w, const u8* x, float* out, int m, int n, int k,     \
                                 int pre) {                                                     \
        constexpr int BN = 8 * NT * (4 / WM);                                                   \
        const int bn0 = blockIdx.y * BN;                                                        \
        mq_body<W, A, WM, NT>(w, x, out, m, min(BN, n - bn0), k, pre, blockIdx.x * 32 * WM, bn0, \
                              nullptr, nullptr);                                                \
    }
#define MQ_TILES(NAME, W, A)   \
    MQ_ENTRY(NAME, W, A, 2, 4) \
    MQ_ENTRY(NAME, W, A, 2, 2) \
    MQ_ENTRY(NAME, W, A, 1, 1)
MQ_TILES(q4_0, MqQ4_0, MqAQ8_0)
MQ_TILES(q4_1, MqQ4_1, MqAQ8_1)
MQ_TILES(q5_0, MqQ5_0, MqAQ8_0)
MQ_TILES(q8_0, MqQ8_0, MqAQ8_0)
MQ_TILES(q4_k, MqQ4_K, MqAQ8_K)
MQ_TILES(q6_k, MqQ6_K, MqAQ8_K)
