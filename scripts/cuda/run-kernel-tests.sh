#!/usr/bin/env bash
# Runs weft's CUDA kernel tests (bit-exactness against the CPU kernels) and
# per-kernel timings on a machine with an NVIDIA GPU, from the executables
# scripts/cuda/build-kernel-tests.sh left in .device/. Logs go to $OUT (the
# device tool brings that folder back) or /tmp/weft-cuda. WEFT_SKIP_TIMINGS=1
# leaves the timings out.
set -u -o pipefail
cd "$(dirname "$0")/../.."
DIR=${WEFT_DEVICE_DIR:-.device}
. scripts/cuda/device-env.sh
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  ldd --version | head -1
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for d in ${LD_LIBRARY_PATH//:/ }; do ls "$d" 2>/dev/null | grep -i nvrtc | sed "s|^|$d/|"; done
} 2>&1 | tee "$OUT/env.txt"
status=0
echo "== NVRTC compile check"
timeout 400 "$DIR/kernels_lib" cuda::tests --test-threads=1 2>&1 | tail -5 | tee "$OUT/lib.log" || status=1
echo "== CUDA vs CPU (one process per test: a fault in one cannot spoil the others)"
: > "$OUT/tests.log"
passed=0; failed=0
# Test names of executable $1 matching the regex $2 and WEFT_TEST_FILTER.
tests_of() {
  "$DIR/$1" --list 2>/dev/null | grep ': test$' | sed 's/: test$//' | grep -E "$2" | grep -E "${WEFT_TEST_FILTER:-.}"
}
# Runs test $2 of executable $1 alone; $3 tags its line (extra environment
# comes from the caller's prefix).
run_test() {
  if timeout 120 "$DIR/$1" --exact "$2" --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; then
    passed=$((passed + 1)); echo "ok   $1 $2$3"
  else
    failed=$((failed + 1)); status=1; echo "FAIL $1 $2$3"
  fi
}
for exe in cuda_vs_cpu cuda_family_ops; do
  [ -x "$DIR/$exe" ] || continue
  for t in $(tests_of "$exe" .); do run_test "$exe" "$t" ""; done
done
# The kernels that read weights before their wait (matvecs, fused norms),
# once more with nothing marked constant (the order the runtime takes for
# written buffers).
if [ -x "$DIR/cuda_vs_cpu" ]; then
  for t in $(tests_of cuda_vs_cpu "matmul|norm|group|silu|fused"); do
    WEFT_TEST_NO_CONSTANT=1 run_test cuda_vs_cpu "$t" " (no constant inputs)"
  done
fi
grep -E "panicked|differ|mismatch|NOTE|glibc|rope past|softcap" "$OUT/tests.log" | cut -c1-300 | head -40
echo "$passed passed, $failed failed"
if [ -z "${WEFT_SKIP_TIMINGS:-}" ]; then
  echo "== timings"
  timeout 180 "$DIR/cuda_bench" > "$OUT/bench.log" 2>&1 || status=1
  grep -vE "^running|^$" "$OUT/bench.log" | tail -40
fi
# Optional: hardware counters of a few kernels (WEFT_NCU="kernel regex" and
# WEFT_TEST_BENCH_FILTER="case names"), stall reasons and hot spots.
if [ -n "${WEFT_NCU:-}" ]; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  echo "== ncu ($NCU) on kernels matching $WEFT_NCU"
  timeout 240 "$NCU" --clock-control none -k "regex:$WEFT_NCU" -s 20 -c "${WEFT_NCU_COUNT:-3}" \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section SourceCounters \
    env WEFT_TEST_BENCH_FILTER="${WEFT_NCU_FILTER:-}" "$DIR/cuda_bench" > "$OUT/ncu.log" 2>&1 || status=1
  grep -E "^  [a-z_0-9]+\(|Duration|Warp Cycles Per Issued|Stall|Issued Warp|Registers Per|Achieved Occupancy|Eligible Warps|One or More|No Eligible" "$OUT/ncu.log" | head -60
  # Per-instruction stall samples (SASS) of the first matching launch, as CSV.
  if [ -n "${WEFT_NCU_SOURCE:-}" ]; then
    timeout 240 "$NCU" --clock-control none -k "regex:$WEFT_NCU" -s 20 -c 1 --warp-sampling-interval 0 --section WarpStateStats --section SourceCounters \
      --page source --print-source sass --csv \
      env WEFT_TEST_BENCH_FILTER="${WEFT_NCU_FILTER:-}" "$DIR/cuda_bench" > "$OUT/ncu-source.csv" 2>&1 || status=1
    wc -l "$OUT/ncu-source.csv"
  fi
fi
exit $status
