// Index of the largest value of each row; ties go to the lowest index, NaNs
// are never chosen unless at index 0 (the CPU's `if v > row[best]` scan).
// One block of 256 threads per row.

extern "C" __global__ void __launch_bounds__(256)
    argmax_f32(const float* x, i32* out, int rows, int cols) {
    __shared__ float sv[8];
    __shared__ int si[8];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * cols;
    if (xr[0] != xr[0]) {  // NaN at index 0: nothing compares greater
        if (threadIdx.x == 0) out[r] = 0;
        return;
    }
    float bv = NEG_INF;
    int bi = -1;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = xr[c];
        if (v != v) continue;
        if (bi < 0 || v > bv) {
            bv = v;
            bi = c;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
        const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
            bv = ov;
            bi = oi;
        }
    }
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) {
            if (si[w] >= 0 && (bi < 0 || sv[w] > bv || (sv[w] == bv && si[w] < bi))) {
                bv = sv[w];
                bi = si[w];
            }
        }
        out[r] = bi < 0 ? 0 : bi;
    }
}
