#!/usr/bin/env bash
# weft serve and llama.cpp's llama-server on the same model, one after the
# other, each measured by scripts/serve_bench.py (aggregate tokens/s and
# time to first token of 1, 4 and 16 concurrent greedy streams).
# Usage: serve-side-by-side.sh WEFT LLAMA_SERVER MODEL [THREADS] [TOKENS]
# (WEFT_ARGS: more flags for weft serve, e.g. `--numerics fast`).
set -u -o pipefail
weft=$1 ls=$2 model=$3 threads=${4:-2} tokens=${5:-64}
here=$(cd "$(dirname "$0")/.." && pwd)
wait_up() { # url pid
  for _ in $(seq 1 600); do
    curl -sf "$1/health" > /dev/null 2>&1 && return 0
    kill -0 "$2" 2> /dev/null || return 1
    sleep 0.2
  done
  return 1
}
run() { # name url command...
  local name=$1 url=$2; shift 2
  "$@" > "/tmp/serve-$name.log" 2>&1 &
  local pid=$!
  if wait_up "$url" "$pid"; then
    echo "== $name"
    python3 "$here/serve_bench.py" "$url" --clients 1,4,16 --tokens "$tokens"
  else
    echo "== $name did not come up:"; tail -5 "/tmp/serve-$name.log"
  fi
  kill "$pid" 2> /dev/null; wait "$pid" 2> /dev/null
}
run weft http://127.0.0.1:18080 "$weft" serve --model "$model" --backend cpu --threads "$threads" \
  --parallel 16 --ctx 512 --port 18080 ${WEFT_ARGS:-}
run llama-server http://127.0.0.1:18081 "$ls" -m "$model" -t "$threads" -np 16 -cb -c 8192 \
  --port 18081 --host 127.0.0.1
