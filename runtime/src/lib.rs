//! weft-runtime
