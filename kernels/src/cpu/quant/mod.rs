//! Quantized dot products and matmul micro-kernels (being written).
