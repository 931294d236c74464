// Index of the largest value of each row; ties go to the lowest index, NaNs
// are never chosen unless at index 0 (the CPU's `if v > row[best]` scan).
// One block of 1024 threads per row; each thread scans a strided slice
// with batched 16-byte loads (a candidate only replaces the thread's best
// when strictly greater, and slices are merged preferring lower indices);
// the first warp merges the warps' winners.

DEV void argmax_take(float v, int i, float& bv, int& bi) {
    if (v != v) return;
    if (bi < 0 || v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    argmax_f32(const float* x, i32* out, int rows, int cols) {
    pdl_sync();
    __shared__ float sv[32];
    __shared__ int si[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * cols;
    // Index 0 is read beside the others; a NaN there is handled at the end.
    const float x0 = xr[0];
    float bv = NEG_INF;
    int bi = -1;
    const int nt = blockDim.x;
    if ((cols & 3) == 0 && (((size_t)xr) & 15) == 0) {
        const float4* x4 = (const float4*)xr;
        const int n4 = cols / 4;
        int q = threadIdx.x;
        for (; q + 5 * nt < n4; q += 6 * nt) {
            float4 v[6];
#pragma unroll
            for (int u = 0; u < 6; u++) v[u] = x4[q + u * nt];
#pragma unroll
            for (int u = 0; u < 6; u++) {
                const int i = 4 * (q + u * nt);
                argmax_take(v[u].x, i, bv, bi);
                argmax_take(v[u].y, i + 1, bv, bi);
                argmax_take(v[u].z, i + 2, bv, bi);
                argmax_take(v[u].w, i + 3, bv, bi);
            }
        }
        for (; q < n4; q += nt) {
            const float4 v = x4[q];
            argmax_take(v.x, 4 * q, bv, bi);
            argmax_take(v.y, 4 * q + 1, bv, bi);
            argmax_take(v.z, 4 * q + 2, bv, bi);
            argmax_take(v.w, 4 * q + 3, bv, bi);
        }
    } else {
#pragma unroll 4
        for (int c = threadIdx.x; c < cols; c += nt) argmax_take(xr[c], c, bv, bi);
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
        const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
        if (oi >= 0) argmax_take(ov, oi, bv, bi);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        // The warps' winners merged by the first warp (the same order:
        // greater value, then lower index).
        const int warps = (int)(blockDim.x >> 5);
        bv = lane < warps ? sv[lane] : NEG_INF;
        bi = lane < warps ? si[lane] : -1;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
            const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
            if (oi >= 0) argmax_take(ov, oi, bv, bi);
        }
        // NaN at index 0: nothing compares greater (the CPU's scan).
        if (lane == 0) out[r] = x0 != x0 || bi < 0 ? 0 : bi;
    }
}
