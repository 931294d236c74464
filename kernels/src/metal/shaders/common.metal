// weft's own Metal kernels: shared helpers.
//
// Every weft .metal file is concatenated after this one into a single
// library (see `library.rs`), compiled at run time with fast math off, so
// division and square root are IEEE and `rint` rounds half to even, which
// is what the reference quantizers in weft-ops compute.
//
// Byte layouts follow GGUF (little-endian, blocks packed with alignment 1):
// helpers read f16/u16/u32 fields byte by byte where a block's field can be
// misaligned.

#include <metal_stdlib>
using namespace metal;

// ggml type ids (the `dtype` arguments of the dequantizing kernels).
#define WEFT_F32 0u
#define WEFT_F16 1u
#define WEFT_Q4_0 2u
#define WEFT_Q4_1 3u
#define WEFT_Q5_0 6u
#define WEFT_Q5_1 7u
#define WEFT_Q8_0 8u
#define WEFT_Q8_1 9u
#define WEFT_Q4_K 12u
#define WEFT_Q6_K 14u
#define WEFT_Q8_K 15u
#define WEFT_BF16 30u

// Status codes a kernel writes into its node's slot of the command
// buffer's status words (0: fine). The runtime reports them by label.
#define WEFT_STATUS_BAD_ID 1u

static inline ushort weft_u16_at(device const uchar *p) {
    return ushort(p[0]) | ushort(ushort(p[1]) << 8);
}

static inline uint weft_u32_at(device const uchar *p) {
    return uint(p[0]) | (uint(p[1]) << 8) | (uint(p[2]) << 16) | (uint(p[3]) << 24);
}

static inline float weft_f16_at(device const uchar *p) {
    return float(as_type<half>(weft_u16_at(p)));
}

static inline float weft_bf16_to_f32(ushort bits) {
    return as_type<float>(uint(bits) << 16);
}

// f32 -> bf16 as ggml and weft-ops: round to nearest even, NaNs quiet.
static inline ushort weft_f32_to_bf16(float x) {
    uint u = as_type<uint>(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return ushort((u >> 16) | 64u);
    }
    return ushort((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

static inline void weft_store_u16(device uchar *p, ushort v) {
    p[0] = uchar(v & 0xffu);
    p[1] = uchar(v >> 8);
}

static inline void weft_store_u32(device uchar *p, uint v) {
    p[0] = uchar(v & 0xffu);
    p[1] = uchar((v >> 8) & 0xffu);
    p[2] = uchar((v >> 16) & 0xffu);
    p[3] = uchar(v >> 24);
}

// Element `col` of a row stored as `dtype`, as f32 (the reference's
// dequantization, one element at a time).
static inline float weft_dequant(device const uchar *row, uint col, uint dtype) {
    switch (dtype) {
    case WEFT_F32:
        return as_type<float>(weft_u32_at(row + 4u * col));
    case WEFT_F16:
        return weft_f16_at(row + 2u * col);
    case WEFT_BF16:
        return weft_bf16_to_f32(weft_u16_at(row + 2u * col));
    case WEFT_Q8_0: {
        device const uchar *b = row + 34u * (col / 32u);
        return float(as_type<char>(b[2u + col % 32u])) * weft_f16_at(b);
    }
    case WEFT_Q8_1: {
        device const uchar *b = row + 36u * (col / 32u);
        return float(as_type<char>(b[4u + col % 32u])) * weft_f16_at(b);
    }
    case WEFT_Q4_0: {
        device const uchar *b = row + 18u * (col / 32u);
        uint j = col % 32u;
        uint q = j < 16u ? (b[2u + j] & 0x0fu) : (b[2u + j - 16u] >> 4);
        return float(int(q) - 8) * weft_f16_at(b);
    }
    case WEFT_Q4_1: {
        device const uchar *b = row + 20u * (col / 32u);
        uint j = col % 32u;
        uint q = j < 16u ? (b[4u + j] & 0x0fu) : (b[4u + j - 16u] >> 4);
        return float(q) * weft_f16_at(b) + weft_f16_at(b + 2);
    }
    case WEFT_Q5_0: {
        device const uchar *b = row + 22u * (col / 32u);
        uint j = col % 32u;
        uint qh = weft_u32_at(b + 2);
        uint lo = j < 16u ? (b[6u + j] & 0x0fu) : (b[6u + j - 16u] >> 4);
        uint q = lo | (((qh >> j) & 1u) << 4);
        return float(int(q) - 16) * weft_f16_at(b);
    }
    case WEFT_Q5_1: {
        device const uchar *b = row + 24u * (col / 32u);
        uint j = col % 32u;
        uint qh = weft_u32_at(b + 4);
        uint lo = j < 16u ? (b[8u + j] & 0x0fu) : (b[8u + j - 16u] >> 4);
        uint q = lo | (((qh >> j) & 1u) << 4);
        return float(q) * weft_f16_at(b) + weft_f16_at(b + 2);
    }
    case WEFT_Q8_K: {
        device const uchar *b = row + 292u * (col / 256u);
        return float(as_type<char>(b[4u + col % 256u])) * as_type<float>(weft_u32_at(b));
    }
    case WEFT_Q4_K: {
        device const uchar *b = row + 144u * (col / 256u);
        uint e = col % 256u;
        uint j = e / 32u;
        device const uchar *s = b + 4;
        uint sc;
        uint mn;
        if (j < 4u) {
            sc = s[j] & 63u;
            mn = s[j + 4u] & 63u;
        } else {
            sc = (s[j + 4u] & 0x0fu) | ((s[j - 4u] >> 6) << 4);
            mn = (s[j + 4u] >> 4) | ((s[j] >> 6) << 4);
        }
        uint l = e % 64u;
        uchar byte = b[16u + 32u * (e / 64u) + l % 32u];
        uint q = l < 32u ? (byte & 0x0fu) : (byte >> 4);
        float d = weft_f16_at(b);
        float dmin = weft_f16_at(b + 2);
        return (d * float(sc)) * float(q) - dmin * float(mn);
    }
    case WEFT_Q6_K: {
        device const uchar *b = row + 210u * (col / 256u);
        uint e = col % 256u;
        uint h = e / 128u;
        uint k = (e % 128u) / 32u;
        uint l = e % 32u;
        uchar lo_byte = b[64u * h + l + 32u * (k & 1u)];
        uint lo = k < 2u ? (lo_byte & 0x0fu) : (lo_byte >> 4);
        uint hi = (b[128u + 32u * h + l] >> (2u * k)) & 3u;
        int q = int(lo | (hi << 4)) - 32;
        float scale = float(as_type<char>(b[192u + e / 16u]));
        return weft_f16_at(b + 208) * scale * float(q);
    }
    default:
        return 0.0f;
    }
}
