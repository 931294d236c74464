#!/usr/bin/env bash
# Builds weft's CUDA kernel test and timing executables here (no GPU or CUDA
# needed) and copies them, stripped of debug info, into .device/ for the
# device machine (pass `.device` in the run's carry; .device/ is ignored
# through .git/info/exclude). Then, on the device: scripts/cuda/run-kernel-tests.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
mkdir -p .device
# The library's unit tests, the integration tests and the timing benchmark
# (kernels/benches/cuda_bench.rs, a plain executable: harness = false).
json=$(cargo test -p weft-kernels --features cuda --release --no-run --lib --tests --bench cuda_bench \
  --message-format=json 2>/dev/null)
pick() { # test or bench target name -> executable path
  printf '%s\n' "$json" | grep '"executable":"' | grep "\"name\":\"$1\"" | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -1
}
for t in cuda_vs_cpu cuda_family_ops cuda_bench; do
  exe=$(pick "$t")
  [ -n "$exe" ] || { echo "no executable for $t" >&2; exit 1; }
  objcopy --strip-debug "$exe" ".device/$t"
done
lib=$(printf '%s\n' "$json" | grep '"executable":"' | grep '"kind":\["lib"\]' | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -1)
[ -n "$lib" ] && objcopy --strip-debug "$lib" .device/kernels_lib
cp scripts/cuda/run-kernel-tests.sh .device/
ls -la .device
