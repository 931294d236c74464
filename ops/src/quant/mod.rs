//! Block-quantized formats (being written).
