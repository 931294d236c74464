//! weft-models
