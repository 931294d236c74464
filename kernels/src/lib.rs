//! weft-kernels
