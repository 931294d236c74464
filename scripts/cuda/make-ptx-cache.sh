#!/usr/bin/env bash
# Compiles weft's CUDA sources for sm_90 with NVRTC on this machine (no GPU
# needed, only libnvrtc: pass its folder as $1 or in LD_LIBRARY_PATH) into
# .device/ptx/, the file WEFT_CUDA_PTX_CACHE looks for (named by a hash of
# the sources, options and architecture). The device scripts copy it into
# their cache, so a fresh GPU machine skips ~2.5 minutes of NVRTC. Use the
# NVRTC of the device driver's CUDA version or older (for CUDA 13.0
# drivers PyPI's nvidia-cuda-nvrtc==13.0.88): a newer NVRTC writes a PTX
# version the driver refuses to load.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -n "${1:-}" ] && export LD_LIBRARY_PATH="$1:${LD_LIBRARY_PATH:-}"
rm -rf .device/ptx && mkdir -p .device/ptx
WEFT_TEST_NVRTC_ARCHS=sm_90 WEFT_CUDA_PTX_CACHE="$PWD/.device/ptx" cargo test --release --features cuda -p weft-kernels --lib \
  sources_compile_with_nvrtc 2>&1 | tail -2
ls -la .device/ptx
[ -n "$(ls .device/ptx)" ] || { echo "no PTX written (is libnvrtc.so on LD_LIBRARY_PATH?)"; exit 1; }
