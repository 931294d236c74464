#!/usr/bin/env bash
# Runs SmolLM2 on the CUDA backend on a machine with an NVIDIA GPU: the
# greedy test against llama.cpp and the CPU, one generation, and `weft
# bench` (JSON and a profile). Executables come from .device/ (built here:
# `cargo build --release --features cuda`, `cargo test --release --features
# cuda --test cuda_smollm2 --no-run`, stripped into .device/), the
# reference JSON from tests/reference/, the model from $WEFT_CACHE (joined
# there beforehand when it had to travel in parts). Logs go to $OUT.
set -u -o pipefail
cd "$(dirname "$0")/../.."
DIR=${WEFT_DEVICE_DIR:-.device}
. scripts/cuda/device-env.sh
status=0
echo "== greedy on CUDA vs llama.cpp and the CPU"
timeout 240 .device/cuda_smollm2 --nocapture --test-threads=1 > "$OUT/test.log" 2>&1 || status=1
grep -E "prompt|panicked|test result|Error|error" "$OUT/test.log" | cut -c1-400 | head -30
echo "== run"
timeout 60 .device/weft run --backend cuda --prompt "The capital of France is" -n 32 --temp 0 2>&1 | tee "$OUT/run.log" | tail -6 || status=1
echo "== bench (json)"
timeout 150 .device/weft bench --backend cuda --json --reps 5 > "$OUT/bench.json" 2>&1 || status=1
tail -c 3000 "$OUT/bench.json"
echo
echo "== bench without CUDA graphs"
WEFT_CUDA_GRAPHS=0 timeout 150 .device/weft bench --backend cuda --reps 3 2>&1 | tail -3 || status=1
echo "== profile"
timeout 120 .device/weft bench --backend cuda --reps 1 --pp 512 --tg 64 --profile > "$OUT/profile.txt" 2>&1 || status=1
head -45 "$OUT/profile.txt"
echo "== trace (device stream tracks)"
timeout 120 .device/weft bench --backend cuda --reps 1 --pp 64 --tg 8 --trace "$OUT/trace.json" 2>&1 | tail -2 || status=1
exit $status
