// TODO(dsv4-cuda): kernels of this family are being written.
