// Index of the largest value of each row; ties go to the lowest index, NaNs
// are never chosen unless at index 0 (the CPU's `if v > row[best]` scan).
// Each thread scans a strided slice with batched 16-byte loads (a candidate
// only replaces the thread's best when strictly greater, and slices are
// merged preferring lower indices, so any merge order gives the CPU's
// answer); the first warp merges the warps' winners. `argmax_f32`: one
// block of 1024 threads per row. `argmax_f32_cluster`: a cluster of eight
// blocks per row, each scanning an eighth (one SM streams a long row at a
// fraction of what eight do); the first block merges the eight winners
// from the others' shared memory.

DEV void argmax_take(float v, int i, float& bv, int& bi) {
    if (v != v) return;
    if (bi < 0 || v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

// Merges the (value, index) pairs of the lanes of a warp; every lane ends
// with the winner.
DEV void argmax_warp(float& bv, int& bi) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
        const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
        if (oi >= 0) argmax_take(ov, oi, bv, bi);
    }
}

// This thread's best over elements [c0, c1) of row xr (the block's threads
// striding it); c0 a multiple of 4.
DEV void argmax_range(const float* xr, int c0, int c1, float& bv, int& bi) {
    const int nt = blockDim.x;
    if (((c1 - c0) & 3) == 0 && (((size_t)(xr + c0)) & 15) == 0) {
        const float4* x4 = (const float4*)(xr + c0);
        const int n4 = (c1 - c0) / 4;
        int q = threadIdx.x;
        for (; q + 5 * nt < n4; q += 6 * nt) {
            float4 v[6];
#pragma unroll
            for (int u = 0; u < 6; u++) v[u] = x4[q + u * nt];
#pragma unroll
            for (int u = 0; u < 6; u++) {
                const int i = c0 + 4 * (q + u * nt);
                argmax_take(v[u].x, i, bv, bi);
                argmax_take(v[u].y, i + 1, bv, bi);
                argmax_take(v[u].z, i + 2, bv, bi);
                argmax_take(v[u].w, i + 3, bv, bi);
            }
        }
        for (; q < n4; q += nt) {
            const float4 v = x4[q];
            const int i = c0 + 4 * q;
            argmax_take(v.x, i, bv, bi);
            argmax_take(v.y, i + 1, bv, bi);
            argmax_take(v.z, i + 2, bv, bi);
            argmax_take(v.w, i + 3, bv, bi);
        }
    } else {
#pragma unroll 4
        for (int c = c0 + threadIdx.x; c < c1; c += nt) argmax_take(xr[c], c, bv, bi);
    }
}

// The block's winner, valid in warp 0 (every lane).
DEV void argmax_block(float& bv, int& bi) {
    __shared__ float sv[32];
    __shared__ int si[32];
    argmax_warp(bv, bi);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        const int warps = (int)(blockDim.x >> 5);
        bv = lane < warps ? sv[lane] : NEG_INF;
        bi = lane < warps ? si[lane] : -1;
        argmax_warp(bv, bi);
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    argmax_f32(const float* x, i32* out, int rows, int cols) {
    pdl_sync();
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * cols;
    // Index 0 is read beside the others; a NaN there is handled at the end.
    const float x0 = xr[0];
    float bv = NEG_INF;
    int bi = -1;
    argmax_range(xr, 0, cols, bv, bi);
    argmax_block(bv, bi);
    // NaN at index 0: nothing compares greater (the CPU's scan).
    if (threadIdx.x == 0) out[r] = x0 != x0 || bi < 0 ? 0 : bi;
}

#define ARGMAX_CLUSTER 8

extern "C" __global__ void CLUSTER_DIMS(ARGMAX_CLUSTER) __launch_bounds__(256)
    argmax_f32_cluster(const float* x, i32* out, int rows, int cols) {
    __shared__ float win_v;
    __shared__ int win_i;
    pdl_sync();
    const int r = blockIdx.x / ARGMAX_CLUSTER;  // every block of a cluster: one row
    const u32 rank = cluster_rank();
    const float* xr = x + (size_t)min(r, rows - 1) * cols;
    const int per = (cols / ARGMAX_CLUSTER + 3) & ~3;
    const int c0 = min(cols, (int)rank * per), c1 = rank + 1 == ARGMAX_CLUSTER ? cols : min(cols, c0 + per);
    const float x0 = xr[0];
    float bv = NEG_INF;
    int bi = -1;
    argmax_range(xr, c0, c1, bv, bi);
    argmax_block(bv, bi);
    if (threadIdx.x == 0) {
        win_v = bv;
        win_i = bi;
    }
    cluster_sync();
    if (rank == 0 && threadIdx.x < 32) {
        const int lane = threadIdx.x;
        bv = NEG_INF;
        bi = -1;
        if (lane < ARGMAX_CLUSTER) {
            bv = __uint_as_float(cluster_ld_u32(&win_v, (u32)lane));
            bi = (int)cluster_ld_u32(&win_i, (u32)lane);
        }
        argmax_warp(bv, bi);
        if (lane == 0 && r < rows) out[r] = x0 != x0 || bi < 0 ? 0 : bi;
    }
    cluster_sync();  // the others' shared memory stays until block 0 has read it
}
