#!/usr/bin/env bash
# One device call's side-by-side figures: llama.cpp's llama-bench is built
# in the background while the random-weight twins of the carried model
# skeletons are written and the fast kernels are tested and timed, then
# bench-depths.sh runs weft (both numerics modes) and llama.cpp on every
# twin. Carried in .device/: weft, llama-src.tar.xz (see
# build-llama-cpp.sh), skel/*.skel.gz (gguf_skeleton.py strip, gzipped),
# ptx/ (make-ptx-cache.sh), and optionally cuda_fast and cuda_bench.
# Usage: side-by-side.sh DEPTHS (logs and JSON under $OUT).
set -u -o pipefail
cd "$(dirname "$0")/../.."
DIR=${WEFT_DEVICE_DIR:-.device}
. scripts/cuda/device-env.sh
depths=${1:-0,4096}
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
(bash scripts/cuda/build-llama-cpp.sh "$DIR/llama-src.tar.xz" /tmp/lcp > "$OUT/llama-build.log" 2>&1
 echo $? > /tmp/lcp.rc) &
models=()
for s in "$DIR"/skel/*.skel.gz; do
  name=$(basename "$s" .skel.gz)
  gzip -dc "$s" > "/tmp/$name.skel" &&
    python3 scripts/bench/gguf_skeleton.py fill "/tmp/$name.skel" "/tmp/$name.gguf" > /dev/null &&
    models+=("/tmp/$name.gguf")
done
stamp "twins: ${models[*]}"
if [ -x "$DIR/cuda_fast" ]; then
  timeout 300 "$DIR/cuda_fast" --test-threads=1 --nocapture > "$OUT/fast-tests.log" 2>&1
  echo "fast kernel tests: exit $?"
  grep -E "^test |NOTE|panicked|failures" "$OUT/fast-tests.log" | grep -v "launch 1" | cut -c1-200
  stamp "tests"
fi
if [ -x "$DIR/cuda_bench" ]; then
  WEFT_TEST_BENCH_FILTER=${BENCH_FILTER:-n=512,n=4096,cached} timeout 200 "$DIR/cuda_bench" > "$OUT/kernel-bench.log" 2>&1
  grep -E "\[(exact|fast)\]|attention" "$OUT/kernel-bench.log"
  stamp "kernel timings"
fi
wait
stamp "llama.cpp build: exit $(cat /tmp/lcp.rc)"
[ -n "${SKIP_MODELS:-}" ] && exit 0
bash scripts/cuda/bench-depths.sh "$DIR/weft" /tmp/lcp/build/bin/llama-bench "$depths" "${models[@]}"
stamp done
