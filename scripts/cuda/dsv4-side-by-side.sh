#!/usr/bin/env bash
# DeepSeek-V4 side by side on one GPU machine, in one call: llama.cpp's
# llama-bench is built in the background (build-llama-cpp.sh) and a
# Flash-shaped file with random weights is written (`weft synth-model`, 43
# layers at the real dimensions, EXPERTS routed experts per layer) while
# the tiny fixture runs in both numerics modes (the first run also pays the
# driver's one-time compilation of the program); then `weft bench` in both
# numerics modes at DEPTHS, a per-kernel profile of a fast 512-token
# prefill, and llama-bench on the same file at the same depths. Every step
# is cut to what is left of BUDGET_S seconds (default 560).
# Carried in .device/: weft, llama-src.tar.xz, ptx/ (make-ptx-cache.sh).
# Usage: dsv4-side-by-side.sh [EXPERTS] [DEPTHS] (logs and JSON in $OUT).
set -u -o pipefail
cd "$(dirname "$0")/../.."
DIR=${WEFT_DEVICE_DIR:-.device}
. scripts/cuda/device-env.sh
experts=${1:-16} depths=${2:-0,4096} budget=${BUDGET_S:-560}
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
# timeout for a step: at most $1 seconds, never past the budget.
cap() { local left=$((budget - ($(date +%s) - t0))); [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"; }
(bash scripts/cuda/build-llama-cpp.sh "$DIR/llama-src.tar.xz" /tmp/lcp > "$OUT/llama-build.log" 2>&1
 echo $? > /tmp/lcp.rc) &
FILE=/dev/shm/weft-flash-$experts.gguf
rm -f /dev/shm/weft-flash-*.gguf
(timeout "$(cap 400)" "$DIR/weft" synth-model --experts "$experts" --context 8192 --out "$FILE" > "$OUT/synth.log" 2>&1
 echo $? > /tmp/synth.rc) &
tiny=tests/reference/dsv4_tiny/flash-tiny
ids=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt"]["token_ids"])))' "$tiny/reference.json")
for mode in exact fast; do
  s=$(date +%s%N)
  timeout "$(cap 300)" "$DIR/weft" run --backend cuda --numerics "$mode" --model "$tiny/model.gguf" \
    --prompt-ids "$ids" -n 16 --temp 0 > "$OUT/tiny-$mode.txt" 2> "$OUT/tiny-$mode.err"
  echo "tiny fixture, $mode: exit $?, $(( ($(date +%s%N) - s) / 1000000 )) ms"
done
cmp -s "$OUT/tiny-exact.txt" "$OUT/tiny-fast.txt" && echo "tiny fixture: fast continuation equals exact" ||
  echo "tiny fixture: continuations differ: exact '$(head -c 80 "$OUT/tiny-exact.txt")' fast '$(head -c 80 "$OUT/tiny-fast.txt")'"
stamp "tiny fixture"
while [ ! -f /tmp/synth.rc ]; do sleep 2; done
[ "$(cat /tmp/synth.rc)" = 0 ] || { echo "synth-model failed"; tail -5 "$OUT/synth.log"; exit 1; }
stamp "synth-model: $(du -h "$FILE" | cut -f1)"
for mode in fast exact; do
  timeout "$(cap 200)" "$DIR/weft" bench --backend cuda --model "$FILE" --numerics "$mode" --pp 512 --tg 32 \
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
  tail -2 "$OUT/weft-$mode.err"
  stamp "weft $mode"
done
wait
stamp "llama.cpp build: exit $(cat /tmp/lcp.rc)"
lb=/tmp/lcp/build/bin/llama-bench
if [ -x "$lb" ]; then
  timeout "$(cap 200)" "$lb" -m "$FILE" -ngl 99 -fa 1 -p 512 -n 32 -d "$depths" -r "${REPS:-3}" -o json \
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
  tail -2 "$OUT/llama.err"
fi
stamp "llama-bench"
timeout "$(cap 120)" "$DIR/weft" bench --backend cuda --model "$FILE" --numerics fast --pp 512 --tg 0 --reps 1 \
  --profile > "$OUT/profile-fast.txt" 2>&1
grep -v "^\s*$" "$OUT/profile-fast.txt" | head -40 | cut -c1-150
stamp "done"
