#!/usr/bin/env bash
# The Metal backend on a Mac, in three steps:
#   1. every op's Metal kernel against the reference semantics
#      (kernels/tests/metal_vs_cpu.rs);
#   2. SmolLM2-135M-Instruct Q4_1 greedy continuations on Metal against
#      llama.cpp's reference token ids (tests/reference/smollm2.json);
#   3. `weft bench --backend metal` next to llama.cpp's `llama-bench` on
#      this Mac's GPU (skipped with a message when llama-bench is missing).
#
# Needs macOS, a Rust toolchain and Python 3 (which also fetches the model
# on first use). Steps 2 and 3 need the CLI's `--backend metal`.
#
# Environment:
#   WEFT_TEST_REFERENCE_DIR  llama.cpp's reference outputs (default: the
#                       repository's `tests/reference`)
#   LLAMA_BENCH         llama-bench binary (default: `llama-bench` on PATH;
#                       `brew install llama.cpp` provides a Metal build)
#   WEFT_METAL_SKIP     comma-separated steps to skip: ops, greedy, bench
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "test-metal: $*" >&2; exit 1; }
skip() { [[ ",${WEFT_METAL_SKIP:-}," == *",$1,"* ]]; }

[[ "$(uname -s)" == "Darwin" ]] || fail "the Metal backend runs on macOS only (this is $(uname -s))"
command -v cargo >/dev/null || fail "cargo is missing: install Rust from https://rustup.rs"
command -v python3 >/dev/null || fail "python3 is missing (it reads the reference files and fetches the model)"

# mlx-native precompiles its shaders with Xcode's Metal toolchain when it is
# there; without it, it compiles them at run time (slower first use).
if ! xcrun -sdk macosx -f metal >/dev/null 2>&1; then
  echo "== Xcode's Metal toolchain is not installed: mlx-native compiles its shaders at run time"
  export MLX_NATIVE_SKIP_METALLIB=1
fi

echo "== $(sw_vers -productName) $(sw_vers -productVersion) on $(uname -m); $(rustc --version)"
system_profiler SPDisplaysDataType 2>/dev/null | awk -F': ' '/Chipset Model|Metal/ {print "==   " $1 ": " $2}' || true

export WEFT_TEST_REQUIRE_METAL=1
FEATURES="--features metal"

if ! skip ops; then
  echo "== 1/3 ops: Metal kernels against the reference semantics"
  cargo test --release -p weft-kernels $FEATURES --test metal_vs_cpu -- --nocapture --test-threads 1
fi

echo "== building weft with the Metal backend"
cargo build --release $FEATURES
WEFT=target/release/weft
if ! "$WEFT" run --help | grep -q -- "--backend"; then
  fail "this weft has no --backend flag yet: steps 2 and 3 need \`--backend metal\`"
fi

reference_dir() {
  if [[ -n "${WEFT_TEST_REFERENCE_DIR:-}" ]]; then echo "$WEFT_TEST_REFERENCE_DIR"; return; fi
  echo "$PWD/tests/reference"
}

if ! skip greedy; then
  echo "== 2/3 SmolLM2 greedy continuations on Metal against llama.cpp"
  REF="$(reference_dir)/smollm2.json"
  [[ -f "$REF" ]] || fail "no reference file at $REF (set WEFT_TEST_REFERENCE_DIR)"
  python3 - "$WEFT" "$REF" <<'PY'
import json, subprocess, sys
weft, ref = sys.argv[1], sys.argv[2]
cases = json.load(open(ref))["cases"]
bad = 0
for i, case in enumerate(cases):
    want = case["greedy_ids"]
    cmd = [weft, "run", "--backend", "metal", "--model", "smollm2-135m",
           "--prompt", case["text"], "-n", str(len(want)), "--temp", "0",
           "--ignore-eos", "--format", "json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    ok_prompt = got["prompt_ids"] == case["prompt_ids"]
    ok_greedy = got["generated_ids"] == want
    same = next((k for k, (a, b) in enumerate(zip(got["generated_ids"], want)) if a != b), len(want))
    print(f"prompt {i}: prompt ids {'ok' if ok_prompt else 'DIFFER'}; "
          f"greedy {'ok' if ok_greedy else f'DIFFERS from token {same}'} ({len(want)} tokens)")
    if not ok_greedy:
        print(f"  got  {got['generated_ids']}\n  want {want}")
    bad += (not ok_prompt) + (not ok_greedy)
if bad:
    sys.exit(f"{bad} mismatches with llama.cpp's greedy reference")
PY
fi

if ! skip bench; then
  echo "== 3/3 bench: weft on Metal next to llama.cpp on Metal (pp512, tg128)"
  WEFT_JSON="$("$WEFT" bench --backend metal --model smollm2-135m --pp 512 --tg 128 --reps 5 --json | tail -n 1)"
  CACHE="${WEFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weft}"
  GGUF="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
  LLAMA_BENCH="${LLAMA_BENCH:-$(command -v llama-bench || true)}"
  LLAMA_JSON=""
  if [[ -n "$LLAMA_BENCH" && -f "$GGUF" ]]; then
    LLAMA_JSON="$("$LLAMA_BENCH" -m "$GGUF" -ngl 99 -p 512 -n 128 -r 5 -o json)"
  else
    echo "   llama-bench not found (or no model at $GGUF): printing weft's figures only;"
    echo "   \`brew install llama.cpp\` or set LLAMA_BENCH to compare"
  fi
  python3 - "$WEFT_JSON" "$LLAMA_JSON" <<'PY'
import json, sys
weft = json.loads(sys.argv[1])
llama = {}
if sys.argv[2].strip():
    for row in json.loads(sys.argv[2]):
        key = f"pp{row['n_prompt']}" if row.get("n_prompt") else f"tg{row['n_gen']}"
        llama[key] = row.get("avg_ts")
rows = [("pp512", weft.get("pp_tps")), ("tg128", weft.get("tg_tps"))]
print(f"{'test':<8}{'weft metal t/s':>16}{'llama.cpp metal t/s':>22}{'weft/llama':>12}")
for name, w in rows:
    l = llama.get(name)
    ratio = f"{w / l:.2f}" if (w and l) else "-"
    print(f"{name:<8}{w or 0:>16.1f}{(l or 0):>22.1f}{ratio:>12}")
print(f"weft on {weft.get('device', 'metal')}: per generated token "
      f"{weft.get('barriers_per_token')} barriers, "
      f"{weft.get('command_buffers_per_token')} command buffers; "
      f"prefill: {weft.get('pp_barriers_per_step')} barriers per step")
PY
fi

echo "== test-metal: done"
