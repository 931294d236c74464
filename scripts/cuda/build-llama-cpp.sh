#!/usr/bin/env bash
# Builds llama.cpp's llama-bench with CUDA for sm_90 on the GPU machine,
# from a source tarball made here (the llama.cpp sources vendored in the
# PyPI sdist llama-cpp-python==0.3.36, without the other GPU backends):
#   tar -cJf .device/llama-src.tar.xz -C <llama.cpp> CMakeLists.txt cmake common ggml include src tools vendor licenses LICENSE
# Usage: build-llama-cpp.sh TARBALL DIR (the binaries land in DIR/build/bin).
set -euo pipefail
tarball=$1 dir=$2
mkdir -p "$dir/src"
tar -C "$dir/src" -xJf "$tarball"
cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF > "$dir/cmake.log" 2>&1
cmake --build "$dir/build" --target llama-bench -j "${JOBS:-$(nproc)}" > "$dir/build.log" 2>&1
ls -la "$dir/build/bin/llama-bench"
