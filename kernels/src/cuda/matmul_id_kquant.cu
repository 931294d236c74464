// Indexed expert matmul (matmul_id.cu), continued: the K-format and float
// formats' dot products, and the kernel body every format's kernel runs.

// ---- K formats x Q8_K ----------------------------------------------------------------

// Super-blocks whose loads one lane issues before using any.
#define MMID_K_CHUNK 4

// Byte i of the little-endian words w.
DEV u32 mmid_byte(const u32* w, int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xffu; }

// Q4_K's six-bit scale and minimum j from the 12 scale bytes (as words).
DEV void mmid_q4k_scale(const u32* s, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = (int)(mmid_byte(s, j) & 63u);
        *mn = (int)(mmid_byte(s, j + 4) & 63u);
    } else {
        *sc = (int)((mmid_byte(s, j + 4) & 0x0fu) | ((mmid_byte(s, j - 4) >> 6) << 4));
        *mn = (int)((mmid_byte(s, j + 4) >> 4) | ((mmid_byte(s, j) >> 6) << 4));
    }
}

// Q4_K's order for slot t (order.rs): 0 vec_dot, 1 repacked gemv, 2 repacked
// gemm, 3 tiled.
DEV int mmid_q4k_order(int m, int ne, int rank) {
    if (m % 8 == 0) return rank < ne - ne % 4 ? 2 : 1;
    return ne >= 8 ? 3 : 0;
}

// matmul.cu's mm_q4k for one weight row and the tile's slots, each slot in
// its own order.
template <int TT>
DEV void mmid_row_q4k(const u8* wrow, const u8* act, int astride, int nb, const int* order,
                      float* res) {
    const int k = threadIdx.x & 7, km = k & 3;
    float acc[TT], accm[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = accm[t] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += MMID_K_CHUNK) {
        u32 wq[MMID_K_CHUNK][4], ws[MMID_K_CHUNK][3], wdm[MMID_K_CHUNK];
#pragma unroll
        for (int c = 0; c < MMID_K_CHUNK; c++) {
            const u8* x = wrow + (size_t)min(b0 + c, nb - 1) * 144;
            wdm[c] = ld_u32_a4(x);
#pragma unroll
            for (int i = 0; i < 3; i++) ws[c][i] = ld_u32_a4(x + 4 + 4 * i);
#pragma unroll
            for (int cp = 0; cp < 4; cp++) wq[c][cp] = ld_u32_a4(x + 16 + 32 * cp + 4 * k);
        }
#pragma unroll
        for (int c = 0; c < MMID_K_CHUNK; c++) {
            const int b = b0 + c;
            if (b >= nb) break;
            int sc[8], mn[8];
#pragma unroll
            for (int j = 0; j < 8; j++) mmid_q4k_scale(ws[c], j, &sc[j], &mn[j]);
            u32 lo[4], hi[4];
#pragma unroll
            for (int cp = 0; cp < 4; cp++) {
                lo[cp] = wq[c][cp] & 0x0f0f0f0fu;
                hi[cp] = (wq[c][cp] >> 4) & 0x0f0f0f0fu;
            }
            const float wd = h2f((u16)(wdm[c] & 0xffffu)), wdmin = h2f((u16)(wdm[c] >> 16));
#pragma unroll
            for (int t = 0; t < TT; t++) {
                const u8* y = act + (size_t)t * astride + (size_t)b * Q8K_BYTES;
                int pair[4];
#pragma unroll
                for (int cp = 0; cp < 4; cp++)
                    pair[cp] = sc[2 * cp] * __dp4a((int)lo[cp], (int)ld_u32_a4(y + 4 + 64 * cp + 4 * k), 0) +
                               sc[2 * cp + 1] * __dp4a((int)hi[cp], (int)ld_u32_a4(y + 36 + 64 * cp + 4 * k), 0);
                const float yd = __int_as_float((int)ld_u32_a4(y));
                const i16* bs = (const i16*)(y + 260);
                auto imin = [&](int p) {
                    const int b0s = (int)bs[4 * p] + (int)bs[4 * p + 1];
                    const int b1s = (int)bs[4 * p + 2] + (int)bs[4 * p + 3];
                    return mn[2 * p] * b0s + mn[2 * p + 1] * b1s;
                };
                if (order[t] == 0) {
                    const int sumi = (pair[0] + pair[1]) + (pair[2] + pair[3]);
                    const float d = __fmul_rn(yd, wd);
                    const float dmin = __fmul_rn(-yd, wdmin);
                    // imin(km), selected (a register array indexed by the lane
                    // would live in local memory).
                    const int im = km == 0 ? imin(0) : km == 1 ? imin(1) : km == 2 ? imin(2) : imin(3);
                    acc[t] = __fmaf_rn(d, (float)sumi, acc[t]);
                    accm[t] = __fmaf_rn(dmin, (float)im, accm[t]);
                    continue;
                }
                // Whole integer sums over the eight lanes (exact, any order).
#pragma unroll
                for (int cp = 0; cp < 4; cp++)
#pragma unroll
                    for (int o = 1; o < 8; o <<= 1) pair[cp] += __shfl_xor_sync(FULL_MASK, pair[cp], o, 8);
                const int isum = pair[0] + pair[1] + pair[2] + pair[3];
                const int msum = imin(0) + imin(1) + imin(2) + imin(3);
                if (order[t] == 3) {
                    const float rr = __fmaf_rn(-wdmin, (float)msum, __fmul_rn((float)isum, wd));
                    acc[t] = __fmaf_rn(rr, yd, acc[t]);
                } else {
                    const float dd = __fmul_rn(wd, yd), dm = __fmul_rn(wdmin, yd);
                    if (order[t] == 2) {
#pragma unroll
                        for (int cp = 0; cp < 4; cp++) {
                            acc[t] = __fmaf_rn((float)pair[cp], dd, acc[t]);
                            accm[t] = __fmaf_rn((float)imin(cp), dm, accm[t]);
                        }
                    } else {
                        acc[t] = __fmaf_rn((float)isum, dd, acc[t]);
                        accm[t] = __fmaf_rn((float)msum, dm, accm[t]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        if (order[t] == 0) {
            const float s = hsum8_lanes(acc[t]);
            // lanes 0..3 hold acc_m[0..3]: (m0 + m2) + (m1 + m3)
            const float u = accm[t] + __shfl_down_sync(FULL_MASK, accm[t], 2, 8);
            const float mm = u + __shfl_down_sync(FULL_MASK, u, 1, 8);
            res[t] = s + mm;
        } else {
            res[t] = order[t] == 3 ? acc[t] : acc[t] - accm[t];
        }
    }
}

// matmul.cu's mm_q6k for one weight row: vec_dot's order, or the tiled one
// (the expert's group has 8 or more pairs).
template <int TT>
DEV void mmid_row_q6k(const u8* wrow, const u8* act, int astride, int nb, bool tiled, float* res) {
    const int k = threadIdx.x & 7;
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const u8* x = wrow + (size_t)b * 210;
        u32 wq[8];
        int sc[8];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const u32 ql0 = ld_u32_a2(x + 64 * h + 4 * k);
            const u32 ql1 = ld_u32_a2(x + 64 * h + 32 + 4 * k);
            const u32 qh = ld_u32_a2(x + 128 + 32 * h + 4 * k);
            const u32 nib[4] = {ql0 & 0x0f0f0f0fu, ql1 & 0x0f0f0f0fu, (ql0 >> 4) & 0x0f0f0f0fu,
                                (ql1 >> 4) & 0x0f0f0f0fu};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u32 high = ((qh >> (2 * j)) & 0x03030303u) << 4;
                wq[4 * h + j] = nib[j] | high;  // 0..63
                sc[4 * h + j] = (int)(i8)x[192 + 2 * (4 * h + j) + (k >> 2)];
            }
        }
        const int off_sc0 = (int)(i8)x[192 + 2 * k], off_sc1 = (int)(i8)x[192 + 2 * k + 1];
        const float wd = ld_f16(x + 208);
#pragma unroll
        for (int t = 0; t < TT; t++) {
            const u8* y = act + (size_t)t * astride + (size_t)b * Q8K_BYTES;
            int sumi = 0;
#pragma unroll
            for (int c = 0; c < 8; c++)
                sumi += sc[c] * __dp4a((int)wq[c], (int)ld_u32_a4(y + 4 + 32 * c + 4 * k), 0);
            const i16* bs = (const i16*)(y + 260);
            sumi -= 32 * ((int)bs[2 * k] * off_sc0 + (int)bs[2 * k + 1] * off_sc1);
            const float yd = __int_as_float((int)ld_u32_a4(y));
            if (tiled) {
#pragma unroll
                for (int o = 1; o < 8; o <<= 1) sumi += __shfl_xor_sync(FULL_MASK, sumi, o, 8);
                acc[t] = __fmaf_rn(__fmul_rn((float)sumi, wd), yd, acc[t]);
            } else {
                acc[t] = __fmaf_rn(__fmul_rn(yd, wd), (float)sumi, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) res[t] = tiled ? acc[t] : hsum8_lanes(acc[t]);
}

DEV int mmid_sum8(int v) {
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) v += __shfl_xor_sync(FULL_MASK, v, o, 8);
    return v;
}

// Q2_K (weft_ops::quant::q2_k::dot, ggml's generic order): per super-block
// sumf += d_a d * isum - d_a dmin * summs. Lane l takes the quant bytes
// 4l..4l+3 of each 32-byte half (elements 128h + 32kk + 4l + i, sub-block
// 8h + 2kk + l / 4) and the minimums of sub-blocks 2l, 2l + 1.
template <int TT>
DEV void mmid_row_q2k(const u8* wrow, const u8* act, int astride, int nb, float* res) {
    const int l = threadIdx.x & 7, half = l >> 2;
    float sum[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) sum[t] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += MMID_K_CHUNK) {
        u32 wq[MMID_K_CHUNK][2], ws[MMID_K_CHUNK][4], wdm[MMID_K_CHUNK], wsm[MMID_K_CHUNK];
#pragma unroll
        for (int c = 0; c < MMID_K_CHUNK; c++) {
            const u8* x = wrow + (size_t)min(b0 + c, nb - 1) * 84;
#pragma unroll
            for (int i = 0; i < 4; i++) ws[c][i] = ld_u32_a4(x + 4 * i);
            wq[c][0] = ld_u32_a4(x + 16 + 4 * l);
            wq[c][1] = ld_u32_a4(x + 48 + 4 * l);
            wdm[c] = ld_u32_a4(x + 80);
            wsm[c] = ld_u16(x + 2 * l);  // scales[2l], scales[2l + 1]
        }
#pragma unroll
        for (int c = 0; c < MMID_K_CHUNK; c++) {
            const int b = b0 + c;
            if (b >= nb) break;
            int scl[8];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    scl[4 * h + kk] = (int)((ws[c][2 * h + (kk >> 1)] >> (8 * (2 * (kk & 1) + half))) & 0xfu);
            const int m0 = (int)((wsm[c] >> 4) & 0xfu), m1 = (int)((wsm[c] >> 12) & 0xfu);
            const float wd = h2f((u16)(wdm[c] & 0xffffu)), wdmin = h2f((u16)(wdm[c] >> 16));
#pragma unroll
            for (int t = 0; t < TT; t++) {
                const u8* y = act + (size_t)t * astride + (size_t)b * Q8K_BYTES;
                int isum = 0;
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) {
                        const u32 codes = (wq[c][h] >> (2 * kk)) & 0x03030303u;
                        const u32 yw = ld_u32_a4(y + 4 + 128 * h + 32 * kk + 4 * l);
                        isum += scl[4 * h + kk] * __dp4a((int)codes, (int)yw, 0);
                    }
                const u32 bs = ld_u32_a4(y + 260 + 4 * l);
                int summs = (int)(i16)(bs & 0xffffu) * m0 + (int)(i16)(bs >> 16) * m1;
                isum = mmid_sum8(isum);
                summs = mmid_sum8(summs);
                const float yd = __int_as_float((int)ld_u32_a4(y));
                const float dall = __fmul_rn(yd, wd), dmin = __fmul_rn(yd, wdmin);
                const float term = __fsub_rn(__fmul_rn(dall, (float)isum), __fmul_rn(dmin, (float)summs));
                sum[t] = __fadd_rn(sum[t], term);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) res[t] = sum[t];
}

// ggml's iq2xxs_grid: 256 eight-value patterns, value j in bits 2j..2j+1 as
// an index into {8, 25, 43} (weft_ops::quant::iq2_xxs::GRID).
static __device__ const u16 MMID_IQ2XXS_GRID[256] = {
    0x0000, 0x0002, 0x0005, 0x0008, 0x000a, 0x0011, 0x0014, 0x0020, 0x0022, 0x0028, 0x002a, 0x0041,
    0x0044, 0x0050, 0x0058, 0x0061, 0x0064, 0x0080, 0x0082, 0x008a, 0x00a2, 0x0101, 0x0104, 0x0110,
    0x0115, 0x0140, 0x0184, 0x0198, 0x0200, 0x0202, 0x0222, 0x0282, 0x0401, 0x0404, 0x0410, 0x0421,
    0x0424, 0x0440, 0x0442, 0x0448, 0x0460, 0x0481, 0x0484, 0x0490, 0x04a4, 0x0500, 0x0502, 0x0508,
    0x0520, 0x0546, 0x0569, 0x0580, 0x0591, 0x0609, 0x0610, 0x0640, 0x0684, 0x06a4, 0x0800, 0x0805,
    0x0808, 0x0814, 0x0828, 0x0841, 0x0844, 0x0850, 0x0852, 0x0888, 0x0904, 0x0940, 0x0a02, 0x0a14,
    0x1001, 0x1004, 0x1010, 0x1021, 0x1040, 0x1060, 0x1084, 0x1090, 0x1095, 0x1100, 0x1108, 0x1120,
    0x1150, 0x115a, 0x1180, 0x1224, 0x1245, 0x1400, 0x1408, 0x1420, 0x1425, 0x1449, 0x1480, 0x1518,
    0x1562, 0x1600, 0x1616, 0x1801, 0x1804, 0x1810, 0x1840, 0x1881, 0x1900, 0x1905, 0x19a0, 0x1a51,
    0x2000, 0x2002, 0x200a, 0x2044, 0x2061, 0x2080, 0x2082, 0x2129, 0x2148, 0x2200, 0x2202, 0x2401,
    0x2404, 0x2410, 0x2440, 0x2456, 0x2500, 0x2541, 0x2564, 0x2690, 0x2808, 0x2820, 0x2894, 0x2a44,
    0x4001, 0x4004, 0x4010, 0x4018, 0x4021, 0x4024, 0x4040, 0x4048, 0x4056, 0x4060, 0x4081, 0x4084,
    0x4090, 0x4100, 0x4120, 0x4161, 0x4180, 0x4185, 0x4201, 0x4210, 0x4248, 0x4256, 0x4268, 0x4400,
    0x4408, 0x4420, 0x4480, 0x4499, 0x4512, 0x4524, 0x4600, 0x4801, 0x4804, 0x4810, 0x4840, 0x4845,
    0x4900, 0x4958, 0x4961, 0x4982, 0x4a45, 0x4a90, 0x5000, 0x5008, 0x5011, 0x5019, 0x5020, 0x5080,
    0x5088, 0x5104, 0x5142, 0x51a4, 0x5291, 0x5490, 0x5492, 0x550a, 0x5601, 0x5654, 0x5800, 0x5811,
    0x5819, 0x5864, 0x5940, 0x5a08, 0x6004, 0x6010, 0x6040, 0x6068, 0x6100, 0x6155, 0x6218, 0x6260,
    0x6400, 0x6405, 0x6510, 0x6512, 0x6584, 0x6842, 0x8000, 0x8002, 0x800a, 0x8041, 0x8082, 0x8104,
    0x8118, 0x8140, 0x8211, 0x8401, 0x8404, 0x8410, 0x8415, 0x8440, 0x8460, 0x8500, 0x8546, 0x8594,
    0x8609, 0x8640, 0x8660, 0x8802, 0x8904, 0x8a11, 0x9004, 0x9010, 0x9024, 0x9040, 0x90a1, 0x9116,
    0x9180, 0x9245, 0x9400, 0x9422, 0x9444, 0x9551, 0x9881, 0x9920, 0xa002, 0xa050, 0xa085, 0xa109,
    0xa200, 0xa418, 0xa850, 0xa904,
};

// The grid as bytes in shared memory: pattern i's values 0..3 in word 2i,
// 4..7 in word 2i + 1.
DEV void mmid_iq2xxs_grid(u32* grid) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        const u32 g = MMID_IQ2XXS_GRID[i];
        u32 w[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const u32 c = (g >> (2 * j)) & 3u;
            const u32 v = c == 0 ? 8u : c == 1 ? 25u : c == 2 ? 43u : 0u;
            w[j >> 2] |= v << (8 * (j & 3));
        }
        grid[2 * i] = w[0];
        grid[2 * i + 1] = w[1];
    }
}

// 0xff in byte j where bit j of the four sign bits s is set.
DEV u32 mmid_sign_mask(u32 s) { return (((s & 0xfu) * 0x00204081u) & 0x01010101u) * 0xffu; }

// IQ2_XXS (weft_ops::quant::iq2_xxs::dot): per super-block sumf += d d_a *
// bsum, then 0.125 * sumf. Lane l takes sub-block l (32 elements).
template <int TT>
DEV void mmid_row_iq2xxs(const u8* wrow, const u8* act, int astride, int nb, const u32* grid,
                         float* res) {
    const int l = threadIdx.x & 7;
    float sum[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) sum[t] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += MMID_K_CHUNK) {
        u32 wa[MMID_K_CHUNK], wb[MMID_K_CHUNK];
        u16 wd[MMID_K_CHUNK];
#pragma unroll
        for (int c = 0; c < MMID_K_CHUNK; c++) {
            const u8* x = wrow + (size_t)min(b0 + c, nb - 1) * 66;
            wd[c] = ld_u16(x);
            wa[c] = ld_u32_a2(x + 2 + 8 * l);
            wb[c] = ld_u32_a2(x + 6 + 8 * l);
        }
#pragma unroll
        for (int c = 0; c < MMID_K_CHUNK; c++) {
            const int b = b0 + c;
            if (b >= nb) break;
            u32 v[8];
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const u32 idx = (wa[c] >> (8 * g)) & 0xffu;
                const u32 s7 = (wb[c] >> (7 * g)) & 0x7fu;
                const u32 s8 = s7 | ((__popc(s7) & 1u) << 7);
                const u32 m0 = mmid_sign_mask(s8), m1 = mmid_sign_mask(s8 >> 4);
                v[2 * g] = __vsub4(grid[2 * idx] ^ m0, m0);
                v[2 * g + 1] = __vsub4(grid[2 * idx + 1] ^ m1, m1);
            }
            const int mul = 2 * (int)(wb[c] >> 28) + 1;
            const float xd = h2f(wd[c]);
#pragma unroll
            for (int t = 0; t < TT; t++) {
                const u8* y = act + (size_t)t * astride + (size_t)b * Q8K_BYTES;
                int si = 0;
#pragma unroll
                for (int i = 0; i < 8; i++) si = __dp4a((int)v[i], (int)ld_u32_a4(y + 4 + 32 * l + 4 * i), si);
                const int bsum = mmid_sum8(si * mul);
                const float yd = __int_as_float((int)ld_u32_a4(y));
                sum[t] = __fadd_rn(sum[t], __fmul_rn(__fmul_rn(xd, yd), (float)bsum));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) res[t] = __fmul_rn(0.125f, sum[t]);
}

// ---- float formats (activations converted from x on the fly) ----------------------

// The activation the CPU multiplies: x converted to the weights' type.
template <int W>
DEV float mmid_act(float v) {
    if (W == 0) return v;
    if (W == 1) return round16(v);
    return bf2f(f2bf(v));
}

// ggml's vec_dot (tiny = false) or tinyBLAS's order (tiny = true) for one
// weight row and the slots' rows xr[t]; lane k holds accumulator lanes k and
// k + 8 of ggml's sixteen. Valid in the group's first lane.
template <int W, int TT>
DEV void mmid_row_float(const u8* wrow, const float* const* xr, int kdim, bool tiny, float* res) {
    const int k = threadIdx.x & 7;
    if (tiny) {
        float acc[TT][2];
#pragma unroll
        for (int t = 0; t < TT; t++) acc[t][0] = acc[t][1] = 0.0f;
        if (W != 2) {
            for (int c = 0; c < kdim; c += 16) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int i = c + 8 * h + k;
                    const float wv = fval<W>(wrow, i);
#pragma unroll
                    for (int t = 0; t < TT; t++) acc[t][h] = __fmaf_rn(wv, mmid_act<W>(xr[t][i]), acc[t][h]);
                }
            }
        } else {
            for (int c = 0; c < kdim; c += 32) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int i = c + 2 * (k + 8 * h);
                    const float w1 = fval<W>(wrow, i + 1), w0 = fval<W>(wrow, i);
#pragma unroll
                    for (int t = 0; t < TT; t++) {
                        acc[t][h] = __fadd_rn(acc[t][h], __fmul_rn(w1, mmid_act<W>(xr[t][i + 1])));
                        acc[t][h] = __fadd_rn(acc[t][h], __fmul_rn(w0, mmid_act<W>(xr[t][i])));
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < TT; t++) res[t] = hsum8_lanes(__fadd_rn(acc[t][0], acc[t][1]));
        return;
    }
    const int body = kdim - kdim % 64;
    float red0[TT], red1[TT];
    if (W != 2) {
        float acc[TT][4][2];
#pragma unroll
        for (int t = 0; t < TT; t++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[t][j][0] = acc[t][j][1] = 0.0f;
        for (int base = 0; base < body; base += 64) {
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int i = base + 16 * j + 8 * h + k;
                    const float wv = fval<W>(wrow, i);
#pragma unroll
                    for (int t = 0; t < TT; t++)
                        acc[t][j][h] = __fmaf_rn(wv, mmid_act<W>(xr[t][i]), acc[t][j][h]);
                }
        }
#pragma unroll
        for (int t = 0; t < TT; t++) {
            // reduce4x16: fold the four accumulators per lane, then the lanes.
            float f[2];
#pragma unroll
            for (int h = 0; h < 2; h++)
                f[h] = __fadd_rn(__fadd_rn(acc[t][0][h], acc[t][2][h]), __fadd_rn(acc[t][1][h], acc[t][3][h]));
            red0[t] = hsum8_lanes(__fadd_rn(f[0], f[1]));
            red1[t] = 0.0f;
        }
    } else {
        float acc[TT][2][2];
#pragma unroll
        for (int t = 0; t < TT; t++)
#pragma unroll
            for (int j = 0; j < 2; j++) acc[t][j][0] = acc[t][j][1] = 0.0f;
        for (int base = 0; base < body; base += 64) {
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int i = base + 32 * j + 2 * (k + 8 * h);
                    const float w1 = fval<W>(wrow, i + 1), w0 = fval<W>(wrow, i);
#pragma unroll
                    for (int t = 0; t < TT; t++) {
                        acc[t][j][h] = __fadd_rn(acc[t][j][h], __fmul_rn(w1, mmid_act<W>(xr[t][i + 1])));
                        acc[t][j][h] = __fadd_rn(acc[t][j][h], __fmul_rn(w0, mmid_act<W>(xr[t][i])));
                    }
                }
        }
#pragma unroll
        for (int t = 0; t < TT; t++) {
            red0[t] = hsum8_lanes(__fadd_rn(acc[t][0][0], acc[t][0][1]));
            red1[t] = hsum8_lanes(__fadd_rn(acc[t][1][0], acc[t][1][1]));
        }
    }
    if (k != 0) return;  // the tails: the group's first lane alone
#pragma unroll
    for (int t = 0; t < TT; t++) {
        if (W == 0) {
            float v = red0[t];
            for (int i = body; i < kdim; i++) v = __fmaf_rn(fval<W>(wrow, i), xr[t][i], v);
            res[t] = v;
        } else if (W == 1) {
            double s = (double)red0[t];
            for (int i = body; i < kdim; i++)
                s = __dadd_rn(s, (double)__fmul_rn(fval<W>(wrow, i), mmid_act<W>(xr[t][i])));
            res[t] = __double2float_rn(s);
        } else {
            double s = 0.0;
            if (body > 0) {
                s = __dadd_rn(s, (double)red0[t]);
                s = __dadd_rn(s, (double)red1[t]);
            }
            for (int i = body; i < kdim; i++)
                s = __dadd_rn(s, (double)__fmul_rn(fval<W>(wrow, i), mmid_act<W>(xr[t][i])));
            res[t] = __double2float_rn(s);
        }
    }
}

// ---- the kernel body ----------------------------------------------------------------

// (w: experts x m x row_bytes, x: f32 rows of kdim, ids: P i32, out: P x m f32;
// x row of pair p: p when x_per_pair, else p / slots; rows_per_block: a
// multiple of MMID_ROWS; astride: shared bytes per staged activation row.)
template <int FMT, int TT>
DEV void mmid_body(const u8* w, const float* x, const i32* ids, float* out, int m, int kdim, int P,
                   int slots, int x_per_pair, int experts, u64 expert_bytes, u64 row_bytes,
                   int rows_per_block, int astride) {
    extern __shared__ __align__(16) u8 mmid_dyn[];
    __shared__ MmidTile tile;
    __shared__ int warp_cnt[MMID_THREADS / 32];
    __shared__ u32 iq2_grid[FMT == MMID_IQ2_XXS ? 512 : 1];
    const int row_lo = blockIdx.x * rows_per_block;
    const int row_hi = min(m, row_lo + rows_per_block);
    if (FMT == MMID_IQ2_XXS) mmid_iq2xxs_grid(iq2_grid);
    if (P <= MMID_WARP_ROUTE) {
        if (threadIdx.x < 32) mmid_route_warp<TT>(ids, P, experts, blockIdx.y, &tile);
    } else {
        mmid_route_block<TT>(ids, P, experts, blockIdx.y, &tile, (int*)(mmid_dyn + TT * astride),
                             warp_cnt);
    }
    __syncthreads();
    if (blockIdx.y == 0) mmid_nan_invalid(ids, P, experts, out, m, row_lo, row_hi);
    const int e = tile.expert;
    if (e < 0) return;
    const u8* we = w + (size_t)e * expert_bytes;
    {
        // Start the first passes' weight rows towards L2 while the
        // activations are quantized (decode blocks have one or two passes).
        const u8* pf = we + (size_t)row_lo * row_bytes;
        const size_t bytes = (size_t)(min(row_hi, row_lo + 4 * MMID_ROWS) - row_lo) * row_bytes;
        for (size_t o = (size_t)threadIdx.x * 128; o < bytes; o += (size_t)blockDim.x * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(pf + o));
    }
    const int count = tile.count;
    int pairs[TT], xrow[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) {
        pairs[t] = tile.pair[min(t, count - 1)];
        xrow[t] = x_per_pair ? pairs[t] : pairs[t] / slots;
    }
    typedef MmidAct<FMT> A;
    if (A::KIND == 1) mmid_stage_q8<0, TT, FMT == MMID_MXFP4>(x, xrow, kdim, mmid_dyn, astride);
    if (A::KIND == 2) mmid_stage_q8<1, TT, 0>(x, xrow, kdim, mmid_dyn, astride);
    if (A::KIND == 3) mmid_stage_q8k<TT>(x, xrow, kdim, mmid_dyn, astride);
    __syncthreads();
    // Per-slot orders.
    int order[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) order[t] = mmid_q4k_order(m, tile.ne, tile.first_rank + t);
    const bool q6_tiled = tile.ne >= 8;
    const int fstep = FMT == MMID_BF16 ? 32 : 16;
    const bool tiny = tile.ne >= 2 && kdim % fstep == 0 && m % 4 == 0;
    const float* xr[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) xr[t] = x + (size_t)xrow[t] * kdim;
    const int lane8 = threadIdx.x & 7;
    for (int r0 = row_lo; r0 < row_hi; r0 += MMID_ROWS) {
        const int row = r0 + (threadIdx.x >> 3);
        const u8* wrow = we + (size_t)min(row, row_hi - 1) * row_bytes;
        float res[TT];
        if (FMT == MMID_F32) mmid_row_float<0, TT>(wrow, xr, kdim, tiny, res);
        if (FMT == MMID_F16) mmid_row_float<1, TT>(wrow, xr, kdim, tiny, res);
        if (FMT == MMID_BF16) mmid_row_float<2, TT>(wrow, xr, kdim, tiny, res);
        if (FMT == MMID_Q4_0) mmid_row_b32<FmtQ4_0, TT>(wrow, mmid_dyn, astride, kdim / 32, res);
        if (FMT == MMID_Q4_1) mmid_row_b32<FmtQ4_1, TT>(wrow, mmid_dyn, astride, kdim / 32, res);
        if (FMT == MMID_Q5_0) mmid_row_b32<FmtQ5_0, TT>(wrow, mmid_dyn, astride, kdim / 32, res);
        if (FMT == MMID_Q5_1) mmid_row_b32<MmidFmtQ5_1, TT>(wrow, mmid_dyn, astride, kdim / 32, res);
        if (FMT == MMID_Q8_0) mmid_row_b32<FmtQ8_0, TT>(wrow, mmid_dyn, astride, kdim / 32, res);
        if (FMT == MMID_MXFP4) mmid_row_mxfp4<TT>(wrow, mmid_dyn, astride, kdim / 32, res);
        if (FMT == MMID_Q4_K) mmid_row_q4k<TT>(wrow, mmid_dyn, astride, kdim / 256, order, res);
        if (FMT == MMID_Q6_K) mmid_row_q6k<TT>(wrow, mmid_dyn, astride, kdim / 256, q6_tiled, res);
        if (FMT == MMID_Q2_K) mmid_row_q2k<TT>(wrow, mmid_dyn, astride, kdim / 256, res);
        if (FMT == MMID_IQ2_XXS) mmid_row_iq2xxs<TT>(wrow, mmid_dyn, astride, kdim / 256, iq2_grid, res);
        if (lane8 == 0 && row < row_hi) {
#pragma unroll
            for (int t = 0; t < TT; t++)
                if (t < count) out[(size_t)pairs[t] * m + row] = res[t];
        }
    }
}

#define MMID_ENTRY(NAME, FMT, TT)                                                                 \
    extern "C" __global__ void __launch_bounds__(MMID_THREADS, 2)                                 \
        NAME(const u8* w, const float* x, const i32* ids, float* out, int m, int kdim, int P,     \
             int slots, int x_per_pair, int experts, u64 expert_bytes, u64 row_bytes,            \
             int rows_per_block, int astride) {                                                  \
        pdl_sync();                                                                               \
        mmid_body<FMT, TT>(w, x, ids, out, m, kdim, P, slots, x_per_pair, experts, expert_bytes, \
                           row_bytes, rows_per_block, astride);                                   \
    }
#define MMID_ENTRIES(NAME, FMT)          \
    MMID_ENTRY(mmid_##NAME##_t1, FMT, 1) \
    MMID_ENTRY(mmid_##NAME##_t4, FMT, 4)
MMID_ENTRIES(f32, MMID_F32)
MMID_ENTRIES(f16, MMID_F16)
MMID_ENTRIES(bf16, MMID_BF16)
MMID_ENTRIES(q4_0, MMID_Q4_0)
MMID_ENTRIES(q4_1, MMID_Q4_1)
MMID_ENTRIES(q5_0, MMID_Q5_0)
MMID_ENTRIES(q5_1, MMID_Q5_1)
MMID_ENTRIES(q8_0, MMID_Q8_0)
MMID_ENTRIES(q4_k, MMID_Q4_K)
MMID_ENTRIES(q6_k, MMID_Q6_K)
MMID_ENTRIES(q2_k, MMID_Q2_K)
MMID_ENTRIES(iq2_xxs, MMID_IQ2_XXS)
MMID_ENTRIES(mxfp4, MMID_MXFP4)
