// a + b and a * b where b is a single row broadcast over a's rows (the
// same-shape cases run on mlx-native's elementwise kernels).

struct WeftBinaryParams {
    uint elements; // of a and the output
    uint cols;     // b's row length
    uint op;       // 0: add, 1: mul
};

kernel void weft_binary_row_f32(
    device const float *a [[buffer(0)]],
    device const float *b [[buffer(1)]],
    device float *out [[buffer(2)]],
    constant WeftBinaryParams &p [[buffer(3)]],
    uint i [[thread_position_in_grid]]) {
    if (i >= p.elements) {
        return;
    }
    const float bv = b[i % p.cols];
    out[i] = p.op == 0u ? a[i] + bv : a[i] * bv;
}
