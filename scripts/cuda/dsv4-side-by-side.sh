#!/usr/bin/env bash
# DeepSeek-V4 side by side on one GPU machine, in one call: llama.cpp's
# llama-bench is built in the background (build-llama-cpp.sh) while a
# Flash-shaped file with random weights is written (`weft synth-model`, 43
# layers at the real dimensions, EXPERTS routed experts per layer) and weft
# is measured on it: a per-kernel profile of a 512-token prefill (numerics
# fast), then `weft bench` in both numerics modes at DEPTHS; then
# llama-bench on the same file at the same depths.
# Carried in .device/: weft, llama-src.tar.xz, ptx/ (make-ptx-cache.sh),
# optionally cuda_fast (the fast kernel tests, run first).
# Usage: dsv4-side-by-side.sh [EXPERTS] [DEPTHS] (logs and JSON in $OUT).
set -u -o pipefail
cd "$(dirname "$0")/../.."
DIR=${WEFT_DEVICE_DIR:-.device}
. scripts/cuda/device-env.sh
experts=${1:-16} depths=${2:-0,4096}
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
(bash scripts/cuda/build-llama-cpp.sh "$DIR/llama-src.tar.xz" /tmp/lcp > "$OUT/llama-build.log" 2>&1
 echo $? > /tmp/lcp.rc) &
if [ -x "$DIR/cuda_fast" ]; then
  timeout 300 "$DIR/cuda_fast" --test-threads=1 --nocapture > "$OUT/fast-tests.log" 2>&1
  echo "fast kernel tests: exit $?"
  grep -E "^test |panicked|failures" "$OUT/fast-tests.log" | cut -c1-300
  grep -E "NOTE fast matmul_id" "$OUT/fast-tests.log" | grep "launch 1" | cut -c1-160
  stamp "tests"
fi
FILE=/dev/shm/weft-flash-$experts.gguf
rm -f /dev/shm/weft-flash-*.gguf
timeout 400 "$DIR/weft" synth-model --experts "$experts" --context 8192 --out "$FILE" > "$OUT/synth.log" 2>&1 ||
  { echo "synth-model failed"; tail -5 "$OUT/synth.log"; exit 1; }
stamp "synth-model: $(du -h "$FILE" | cut -f1)"
timeout 200 "$DIR/weft" bench --backend cuda --model "$FILE" --numerics fast --pp 512 --tg 16 --reps 1 \
  --profile > "$OUT/profile-fast.txt" 2>&1
head -45 "$OUT/profile-fast.txt"
stamp "profile"
for mode in fast exact; do
  timeout 400 "$DIR/weft" bench --backend cuda --model "$FILE" --numerics "$mode" --pp 512 --tg 32 \
    --depth "$depths" --reps "${REPS:-3}" --json > "$OUT/weft-$mode.json" 2> "$OUT/weft-$mode.err"
  python3 - "$OUT/weft-$mode.json" "$mode" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"weft {sys.argv[2]}: no result ({e})"); sys.exit()
for r in d.get("depths", [d]):
    print(f"weft {sys.argv[2]:5} depth {r.get('depth', 0):>6}  pp512 {r.get('pp_tps') or 0:>9.1f} "
          f"samples {[round(x) for x in r.get('pp_all') or []]}  tg32 {r.get('tg_tps') or 0:>7.1f}")
PY
  tail -3 "$OUT/weft-$mode.err"
  stamp "weft $mode"
done
wait
stamp "llama.cpp build: exit $(cat /tmp/lcp.rc)"
lb=/tmp/lcp/build/bin/llama-bench
if [ -x "$lb" ]; then
  timeout 400 "$lb" -m "$FILE" -ngl 99 -fa 1 -p 512 -n 32 -d "$depths" -r "${REPS:-3}" -o json \
    > "$OUT/llama.json" 2> "$OUT/llama.err"
  python3 - "$OUT/llama.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"llama.cpp: no result ({e})"); sys.exit()
for r in rows:
    kind = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    print(f"llama.cpp  depth {r.get('n_depth', 0):>6}  {kind:6} {r['avg_ts']:>9.1f}  samples {[round(x) for x in r['samples_ts']]}")
PY
  tail -3 "$OUT/llama.err"
fi
stamp "done"
