# Sourced by the run-*.sh scripts on the GPU machine (from the repository
# root, with DIR naming the folder of carried executables): the CUDA
# libraries' folders (toolkit, or NVRTC from a pip wheel), the environment
# the tests expect, the log folder $OUT, and the PTX cache started from
# $DIR/ptx when scripts/cuda/make-ptx-cache.sh made one here.
OUT=${OUT:-/tmp/weft-cuda}
mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(ls -d /usr/local/cuda-*/lib64 2>/dev/null) \
         $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cuda_nvrtc")))' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
# The driver's compiled kernels kept for the next process (the program's
# PTX is compiled once per machine, not once per process).
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-/tmp/weft-nvcache} CUDA_CACHE_MAXSIZE=4294967296
export WEFT_TEST_REFERENCE_DIR=${WEFT_TEST_REFERENCE_DIR:-$PWD/tests/reference} WEFT_TEST_REQUIRE_CUDA=1 RUST_BACKTRACE=1 \
  WEFT_CUDA_PTX_CACHE=/tmp/weft-ptx
mkdir -p /tmp/weft-ptx && cp "$DIR"/ptx/*.ptx /tmp/weft-ptx/ 2>/dev/null || true
# (or gzipped, to travel smaller)
for f in "$DIR"/ptx/*.ptx.gz; do [ -f "$f" ] && gzip -dc "$f" > "/tmp/weft-ptx/$(basename "$f" .gz)"; done
