//! CPU kernels.
pub mod quant;
