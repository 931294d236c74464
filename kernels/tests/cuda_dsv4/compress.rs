//! TODO(dsv4-cuda): CUDA vs CPU tests of this family are being written.
