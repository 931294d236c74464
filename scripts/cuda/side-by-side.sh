#!/usr/bin/env bash
# One device call's side-by-side figures: llama.cpp's llama-bench is built
# in the background while the random-weight twins of the carried model
# skeletons are written, the fast kernels are tested and timed, and weft's
# profiles and long prefills are measured; then bench-depths.sh runs weft
# (both numerics modes) and llama.cpp on every twin, with the cold time to
# first token of a 4,000-token prompt. Carried in .device/: weft,
# llama-src.tar.xz (see build-llama-cpp.sh), skel/*.skel.gz
# (gguf_skeleton.py strip, gzipped), ptx/ (make-ptx-cache.sh), and
# optionally cuda_fast and cuda_bench.
# Usage: side-by-side.sh DEPTHS [LONG_PP] (everything ends up in
# $OUT/results.tgz; the summary is printed).
set -u -o pipefail
cd "$(dirname "$0")/../.."
DIR=${WEFT_DEVICE_DIR:-.device}
. scripts/cuda/device-env.sh
depths=${1:-0,4096} long=${2:-4096}
RES=/tmp/weft-results
mkdir -p "$RES"
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
(bash scripts/cuda/build-llama-cpp.sh "$DIR/llama-src.tar.xz" /tmp/lcp > "$RES/llama-build.log" 2>&1
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
  timeout 300 "$DIR/cuda_fast" --test-threads=1 --nocapture > "$RES/fast-tests.log" 2>&1
  echo "fast kernel tests: exit $?"
  grep -E "^test |NOTE|panicked|failures" "$RES/fast-tests.log" | grep -v "launch 1" | cut -c1-200
  stamp "tests"
fi
if [ -x "$DIR/cuda_bench" ]; then
  WEFT_TEST_BENCH_FILTER=${BENCH_FILTER:-n=512,n=4096,cached} timeout 200 "$DIR/cuda_bench" > "$RES/kernel-bench.log" 2>&1
  grep -E "\[(exact|fast)\]|attention" "$RES/kernel-bench.log"
  stamp "kernel timings"
fi
# While llama.cpp builds: per-kernel profiles (fast) and long prefills.
for model in "${models[@]}"; do
  name=$(basename "$model" .gguf)
  timeout 120 "$DIR/weft" bench --backend cuda --model "$model" --numerics fast --pp 512 --tg 64 --reps 1 \
    --profile > "$RES/$name-profile.txt" 2>&1
  for mode in exact fast; do
    timeout 200 "$DIR/weft" bench --backend cuda --model "$model" --numerics "$mode" --pp "$long" --tg 0 \
      --reps 3 --json > "$RES/$name-weft-$mode-pp$long.json" 2> "$RES/$name-weft-$mode-pp$long.err"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(f"weft {sys.argv[2]:5} pp{sys.argv[3]} {d[\"pp_tps\"]:>10.1f}  samples {[round(x) for x in d[\"pp_all\"]]}  cold {d.get(\"pp_cold_ms\")} ms")' \
      "$RES/$name-weft-$mode-pp$long.json" "$mode" "$long" 2>/dev/null || echo "weft $mode pp$long: failed"
  done
done
stamp "profiles and long prefills"
wait
stamp "llama.cpp build: exit $(cat /tmp/lcp.rc)"
lb=/tmp/lcp/build/bin/llama-bench
python3 -c 'import random; random.seed(5); print(",".join(str(random.randrange(100, 49000)) for _ in range(4000)))' > /tmp/ids.txt
OUT=$RES IDS=/tmp/ids.txt bash scripts/cuda/bench-depths.sh "$DIR/weft" "$lb" "$depths" "${models[@]}"
for model in "${models[@]}"; do
  timeout 200 "$lb" -m "$model" -ngl 99 -fa 1 -p "$long" -n 0 -r "${REPS:-3}" -o json > "$RES/$(basename "$model" .gguf)-llama-pp$long.json" 2>/dev/null
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[0]; print(f"llama.cpp {sys.argv[2]} pp{r[\"n_prompt\"]} {r[\"avg_ts\"]:>10.1f}  samples {[round(x) for x in r[\"samples_ts\"]]}")' \
    "$RES/$(basename "$model" .gguf)-llama-pp$long.json" "$(basename "$model" .gguf)" 2>/dev/null
done
stamp done
tar -czf "$OUT/results.tgz" -C "$RES" .
