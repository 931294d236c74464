// Row kernels: gather (GetRows), dequantization of activation rows, row
// scatter into a (ring) cache for the types mlx-native has no copy for,
// byte copies, and activation quantization (QuantizeRows).

struct WeftRowsParams {
    uint rows;        // output rows
    uint cols;        // elements per row
    uint src_row_bytes;
    uint dtype;       // ggml id of the source rows
    uint table_rows;  // GetRows: rows of the table (ids must be below)
    uint status_slot; // GetRows: this node's status word
};

// out[r, c] = dequant(table[ids[r], c]); an id outside the table writes
// zeros and flags the node's status word.
kernel void weft_get_rows(
    device const uchar *table [[buffer(0)]],
    device const int *ids [[buffer(1)]],
    device float *out [[buffer(2)]],
    constant WeftRowsParams &p [[buffer(3)]],
    device atomic_uint *status [[buffer(4)]],
    uint2 gid [[thread_position_in_grid]]) {
    const uint c = gid.x;
    const uint r = gid.y;
    if (c >= p.cols || r >= p.rows) {
        return;
    }
    const int id = ids[r];
    if (id < 0 || uint(id) >= p.table_rows) {
        out[r * p.cols + c] = 0.0f;
        if (c == 0u) {
            atomic_store_explicit(&status[p.status_slot], WEFT_STATUS_BAD_ID, memory_order_relaxed);
        }
        return;
    }
    device const uchar *row = table + uint(id) * p.src_row_bytes;
    out[r * p.cols + c] = weft_dequant(row, c, p.dtype);
}

// out[r, c] = dequant(src[r, c]): f32 images of quantized activation rows
// (the prologue of a matmul whose activations have no f32 companion).
kernel void weft_dequant_rows(
    device const uchar *src [[buffer(0)]],
    device float *out [[buffer(1)]],
    constant WeftRowsParams &p [[buffer(2)]],
    uint2 gid [[thread_position_in_grid]]) {
    const uint c = gid.x;
    const uint r = gid.y;
    if (c >= p.cols || r >= p.rows) {
        return;
    }
    out[r * p.cols + c] = weft_dequant(src + r * p.src_row_bytes, c, p.dtype);
}

struct WeftSetRowsParams {
    uint rows;      // source rows to write
    uint cols;
    uint start;     // position of the first written row
    uint ring;      // 0: no ring
    uint dst_dtype; // WEFT_F32, WEFT_F16 or WEFT_BF16
};

// dst[slot(start + r), c] = convert(src[r, c]) with slot(p) = p % ring for
// rings. The host passes at most `ring` rows (the last ones), so no two
// threads write one slot.
kernel void weft_set_rows(
    device const float *src [[buffer(0)]],
    device uchar *dst [[buffer(1)]],
    constant WeftSetRowsParams &p [[buffer(2)]],
    uint2 gid [[thread_position_in_grid]]) {
    const uint c = gid.x;
    const uint r = gid.y;
    if (c >= p.cols || r >= p.rows) {
        return;
    }
    const uint pos = p.start + r;
    const uint slot = p.ring != 0u ? pos % p.ring : pos;
    const float v = src[r * p.cols + c];
    const uint e = slot * p.cols + c;
    if (p.dst_dtype == WEFT_F32) {
        ((device float *)dst)[e] = v;
    } else if (p.dst_dtype == WEFT_F16) {
        ((device half *)dst)[e] = half(v);
    } else {
        ((device ushort *)dst)[e] = weft_f32_to_bf16(v);
    }
}

// Plain copies (Write from staging, same-type Copy).
kernel void weft_copy_u32(
    device const uint *src [[buffer(0)]],
    device uint *dst [[buffer(1)]],
    constant uint &n [[buffer(2)]],
    uint i [[thread_position_in_grid]]) {
    if (i < n) {
        dst[i] = src[i];
    }
}

kernel void weft_copy_u8(
    device const uchar *src [[buffer(0)]],
    device uchar *dst [[buffer(1)]],
    constant uint &n [[buffer(2)]],
    uint i [[thread_position_in_grid]]) {
    if (i < n) {
        dst[i] = src[i];
    }
}

struct WeftQuantizeParams {
    uint blocks;      // blocks in the whole tensor (rows are whole blocks)
    uint elements;    // elements in the whole tensor
    uint companion;   // nonzero: also write the f32 image of the result
};

// Q8_0 / Q8_1 (ggml's x86 `quantize_row_q8_0`/`_q8_1`): one simdgroup per
// block of 32, lane i holds element i. d = amax / 127, q = rint(x * 127 /
// amax) clamped to [-128, 127]; Q8_1 also stores s = f16(d * sum(q)) with
// the unrounded d. The companion holds q * f16(d), the reference's
// dequantization.
static inline void weft_quantize_q8_32(
    device const float *x, device uchar *out, device float *comp,
    constant WeftQuantizeParams &p, uint block, uint lane, bool with_sum) {
    const uint block_bytes = with_sum ? 36u : 34u;
    const uint qs_at = with_sum ? 4u : 2u;
    const float v = x[block * 32u + lane];
    const float amax = simd_max(fabs(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = int(clamp(rint(v * id), -128.0f, 127.0f));
    device uchar *b = out + block * block_bytes;
    b[qs_at + lane] = as_type<uchar>(char(q));
    const half dh = half(d);
    const int sum = simd_sum(q);
    if (lane == 0u) {
        weft_store_u16(b, as_type<ushort>(dh));
        if (with_sum) {
            weft_store_u16(b + 2, as_type<ushort>(half(d * float(sum))));
        }
    }
    if (p.companion != 0u) {
        comp[block * 32u + lane] = float(q) * float(dh);
    }
}

kernel void weft_quantize_q8_0(
    device const float *x [[buffer(0)]],
    device uchar *out [[buffer(1)]],
    device float *comp [[buffer(2)]],
    constant WeftQuantizeParams &p [[buffer(3)]],
    uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint sgs [[simdgroups_per_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
    const uint block = tg * sgs + sg;
    if (block >= p.blocks) {
        return;
    }
    weft_quantize_q8_32(x, out, comp, p, block, lane, false);
}

kernel void weft_quantize_q8_1(
    device const float *x [[buffer(0)]],
    device uchar *out [[buffer(1)]],
    device float *comp [[buffer(2)]],
    constant WeftQuantizeParams &p [[buffer(3)]],
    uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint sgs [[simdgroups_per_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
    const uint block = tg * sgs + sg;
    if (block >= p.blocks) {
        return;
    }
    weft_quantize_q8_32(x, out, comp, p, block, lane, true);
}

// Q8_K (ggml's `quantize_row_q8_K_ref`): one threadgroup of 256 threads per
// block of 256. `max` is the element of largest magnitude (the first on
// ties), iscale = -127 / max, q = min(rint(iscale * x), 127), d = 1 /
// iscale (f32), bsums are the sums of each 16 quants.
kernel void weft_quantize_q8_k(
    device const float *x [[buffer(0)]],
    device uchar *out [[buffer(1)]],
    device float *comp [[buffer(2)]],
    constant WeftQuantizeParams &p [[buffer(3)]],
    uint block [[threadgroup_position_in_grid]],
    uint t [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float sg_amax[8];
    threadgroup uint sg_index[8];
    threadgroup float block_max[1];
    if (block >= p.blocks) {
        return;
    }
    const float v = x[block * 256u + t];
    const float a = fabs(v);
    const float amax = simd_max(a);
    const uint first = simd_min(a == amax ? t : 0xffffffffu);
    if (lane == 0u) {
        sg_amax[sg] = amax;
        sg_index[sg] = first;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t == 0u) {
        float best = 0.0f;
        uint at = 0xffffffffu;
        for (uint s = 0u; s < 8u; ++s) {
            if (sg_amax[s] > best) {
                best = sg_amax[s];
                at = sg_index[s];
            }
        }
        block_max[0] = at == 0xffffffffu ? 0.0f : x[block * 256u + at];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const float mx = block_max[0];
    device uchar *b = out + block * 292u;
    if (mx == 0.0f) {
        b[4u + t] = 0u;
        if (t < 16u) {
            weft_store_u16(b + 260u + 2u * t, 0u);
        }
        if (t == 0u) {
            weft_store_u32(b, 0u);
        }
        if (p.companion != 0u) {
            comp[block * 256u + t] = 0.0f;
        }
        return;
    }
    const float iscale = -127.0f / mx;
    const int q = min(int(rint(iscale * v)), 127);
    b[4u + t] = as_type<uchar>(char(q));
    // Sums of 16: lanes 0-15 and 16-31 of each simdgroup are one group each.
    int s16 = q;
    s16 += simd_shuffle_xor(s16, 8u);
    s16 += simd_shuffle_xor(s16, 4u);
    s16 += simd_shuffle_xor(s16, 2u);
    s16 += simd_shuffle_xor(s16, 1u);
    if (lane % 16u == 0u) {
        weft_store_u16(b + 260u + 2u * (t / 16u), as_type<ushort>(short(s16)));
    }
    const float d = 1.0f / iscale;
    if (t == 0u) {
        weft_store_u32(b, as_type<uint>(d));
    }
    if (p.companion != 0u) {
        comp[block * 256u + t] = float(q) * d;
    }
}

// f32 -> f16 / bf16 activations (matmuls with f16 or bf16 weights), with
// the f32 image of the rounded values as companion.
kernel void weft_quantize_f16(
    device const float *x [[buffer(0)]],
    device half *out [[buffer(1)]],
    device float *comp [[buffer(2)]],
    constant WeftQuantizeParams &p [[buffer(3)]],
    uint i [[thread_position_in_grid]]) {
    if (i >= p.elements) {
        return;
    }
    const half h = half(x[i]);
    out[i] = h;
    if (p.companion != 0u) {
        comp[i] = float(h);
    }
}

kernel void weft_quantize_bf16(
    device const float *x [[buffer(0)]],
    device ushort *out [[buffer(1)]],
    device float *comp [[buffer(2)]],
    constant WeftQuantizeParams &p [[buffer(3)]],
    uint i [[thread_position_in_grid]]) {
    if (i >= p.elements) {
        return;
    }
    const ushort h = weft_f32_to_bf16(x[i]);
    out[i] = h;
    if (p.companion != 0u) {
        comp[i] = weft_bf16_to_f32(h);
    }
}
