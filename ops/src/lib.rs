//! weft-ops
