#!/usr/bin/env bash
# Side-by-side decode and prefill at several cache depths on the GPU
# machine: weft in both numerics modes and llama.cpp's llama-bench, one
# model after another in one run. Also the time to first token of a cold
# `weft run` on a 4,000-token prompt (ids in $IDS) against llama-bench's
# prefill of as many tokens.
# Usage: bench-depths.sh WEFT LLAMA_BENCH DEPTHS MODEL... (JSON under $OUT).
set -u -o pipefail
weft=$1 lb=$2 depths=$3; shift 3
OUT=${OUT:-/tmp/weft-bench}; mkdir -p "$OUT"
for model in "$@"; do
  name=$(basename "$model" .gguf)
  echo "== $name"
  for mode in exact fast; do
    timeout 400 "$weft" bench --backend cuda --model "$model" --numerics "$mode" --pp 512 --tg 128 \
      --depth "$depths" --reps "${REPS:-3}" --json > "$OUT/$name-weft-$mode.json" 2> "$OUT/$name-weft-$mode.err"
    python3 - "$OUT/$name-weft-$mode.json" "$mode" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d.get("depths", [d]):
    pp, tg = r.get("pp_all") or [0], r.get("tg_all") or [0]
    print(f"weft {sys.argv[2]:5} depth {r.get('depth', 0):>6}  pp512 {r.get('pp_tps') or 0:>10.1f} (mean {sum(pp) / len(pp):.1f})  "
          f"tg128 {r.get('tg_tps') or 0:>8.1f} (mean {sum(tg) / len(tg):.1f})")
PY
  done
  if [ -x "$lb" ]; then
    timeout 400 "$lb" -m "$model" -ngl 99 -fa 1 -p 512 -n 128 -d "$depths" -r "${REPS:-3}" -o json > "$OUT/$name-llama.json" 2> "$OUT/$name-llama.err"
    python3 - "$OUT/$name-llama.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    kind = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    print(f"llama.cpp      depth {r.get('n_depth', 0):>6}  {kind:6} {r['avg_ts']:>10.1f}  samples {[round(x) for x in r['samples_ts']]}")
PY
  fi
  if [ -n "${IDS:-}" ]; then
    for mode in exact fast; do
      start=$(date +%s%N)
      timeout 200 "$weft" run --backend cuda --model "$model" --numerics "$mode" --prompt-ids "$(cat "$IDS")" -n 1 --temp 0 > /dev/null 2> "$OUT/$name-ttft-$mode.err"
      end=$(date +%s%N)
      echo "weft $mode cold run (load + 4000-token prefill + 1 token): $(( (end - start) / 1000000 )) ms"
    done
    [ -x "$lb" ] && timeout 200 "$lb" -m "$model" -ngl 99 -fa 1 -p 4000 -n 0 -r 1 2>/dev/null | grep -E "pp4000"
  fi
done
