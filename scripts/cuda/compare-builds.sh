#!/usr/bin/env bash
# Two weft builds on the GPU machine, side by side: the same greedy tokens
# and the same perplexity digits (bits) in both numerics modes, then
# `weft bench` alternating the builds (A, B, A, B) so the machine's drift
# falls on both. For a change that must not move a bit or a microsecond.
# Usage: compare-builds.sh WEFT_A WEFT_B DEPTHS MODEL... (JSON and logs
# under $OUT; the summary is printed; BENCH=0 leaves the timings out,
# BITS=0 the tokens and perplexities).
set -u -o pipefail
a=$1 b=$2 depths=$3; shift 3
OUT=${OUT:-/tmp/weft-compare}; mkdir -p "$OUT"
text=$(dirname "$0")/../../README.md
ids=$(python3 -c 'import random; random.seed(7); print(",".join(str(random.randrange(100, 20000)) for _ in range(300)))')
status=0
for model in "$@"; do
  name=$(basename "$model" .gguf)
  echo "== $name"
  for mode in exact fast; do
    [ "${BITS:-1}" = 0 ] && break
    for side in a b; do
      w=$a; [ "$side" = b ] && w=$b
      timeout 200 "$w" run --backend cuda --model "$model" --numerics "$mode" --prompt-ids "$ids" -n 48 \
        --temp 0 --ignore-eos --format ids > "$OUT/$name-$mode-$side.ids" 2> "$OUT/$name-$mode-$side.err"
      timeout 200 "$w" perplexity --backend cuda --model "$model" --numerics "$mode" -f "$text" --ctx 256 --json \
        > "$OUT/$name-$mode-$side.ppl" 2>> "$OUT/$name-$mode-$side.err"
    done
    for f in ids ppl; do
      if [ -s "$OUT/$name-$mode-a.$f" ] && cmp -s "$OUT/$name-$mode-a.$f" "$OUT/$name-$mode-b.$f"; then
        echo "$mode $f: identical ($(head -c 120 "$OUT/$name-$mode-a.$f"))"
      else
        echo "$mode $f: DIFFER or missing"; status=1
        head -c 300 "$OUT/$name-$mode-a.$f" "$OUT/$name-$mode-b.$f" "$OUT/$name-$mode-b.err"
      fi
    done
  done
  [ "${BENCH:-1}" = 0 ] && continue
  for mode in exact fast; do
    for round in 1 2; do
      for side in a b; do
        w=$a; [ "$side" = b ] && w=$b
        j="$OUT/$name-$mode-$side-$round.json"
        timeout 300 "$w" bench --backend cuda --model "$model" --numerics "$mode" --pp 512 --tg 128 \
          --depth "$depths" --reps "${REPS:-2}" --json > "$j" 2> "$j.err"
        python3 - "$j" "$mode" "$side" "$round" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"{sys.argv[2]} build {sys.argv[3]} round {sys.argv[4]}: no result ({e})")
    sys.exit(0)
for r in d.get("depths", [d]):
    print(f"{sys.argv[2]:5} build {sys.argv[3]} round {sys.argv[4]} depth {r.get('depth', 0):>6}  "
          f"pp512 {r.get('pp_tps') or 0:>10.1f}  tg128 {r.get('tg_tps') or 0:>8.1f}")
PY
      done
    done
  done
done
exit $status
