#!/usr/bin/env bash
# Runs DeepSeek-V4 on the CUDA backend on a machine with an NVIDIA GPU: the
# tiny fixtures against the reference implementation and the CPU
# (tests/cuda_dsv4.rs), then a Flash-shaped model with random weights
# (`weft synth-model`, 43 layers at the real dimensions; WEFT_DSV4_EXPERTS
# routed experts per layer, 16 by default: a decode token reads the same
# bytes as with 256) decoded with `weft bench --backend cuda` (greedy one
# step ahead, then step by step).
# Executables come from .device/ (cuda_dsv4_model: `cargo test --release
# --features cuda --test cuda_dsv4 --no-run`, and weft), the fixtures from
# tests/reference/dsv4_tiny. Logs go to $OUT.
set -u -o pipefail
cd "$(dirname "$0")/../.."
DIR=${WEFT_DEVICE_DIR:-.device}
. scripts/cuda/device-env.sh
status=0
if [ -z "${WEFT_SKIP_FIXTURES:-}" ]; then
  echo "== DeepSeek-V4 fixtures on CUDA vs the reference and the CPU"
  timeout 300 .device/cuda_dsv4_model --nocapture --test-threads=1 > "$OUT/dsv4-test.log" 2>&1 || status=1
  grep -E "on CUDA|panicked|test result|rror" "$OUT/dsv4-test.log" | cut -c1-400 | head -30
fi
if [ -z "${WEFT_SKIP_FLASH:-}" ]; then
  echo "== Flash-shaped model (random weights)"
  FILE=${WEFT_DSV4_FILE:-/dev/shm/weft-flash.gguf}
  [ -f "$FILE" ] || timeout 300 .device/weft synth-model --experts "${WEFT_DSV4_EXPERTS:-16}" --context 8192 --out "$FILE" 2>&1 | tee "$OUT/synth.log" || status=1
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
  timeout 400 .device/weft bench --backend cuda --model "$FILE" --pp "${WEFT_DSV4_PP:-16}" --tg "${WEFT_DSV4_TG:-32}" --reps "${WEFT_DSV4_REPS:-3}" 2>&1 | tee "$OUT/flash-bench.log" | tail -12 || status=1
  echo "-- step by step (each token waited for, as docs/performance.md's figures were taken)"
  timeout 300 .device/weft bench --backend cuda --model "$FILE" --pp 0 --tg "${WEFT_DSV4_TG:-32}" --reps "${WEFT_DSV4_REPS:-3}" --step-by-step 2>&1 | tail -4 || status=1
  timeout 200 .device/weft bench --backend cuda --model "$FILE" --pp 0 --tg "${WEFT_DSV4_TG:-32}" --reps 1 --json > "$OUT/flash-bench.json" 2>&1 || status=1
  tail -c 1500 "$OUT/flash-bench.json"; echo
fi
exit $status
