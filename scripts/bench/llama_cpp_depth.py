#!/usr/bin/env python3
"""llama.cpp (through llama-cpp-python) at context depths, for side-by-side
figures with `weft bench --depth`.

Set-up, once per machine (compiles llama.cpp; ~15 minutes on 2 cores):
    python3 -m venv /tmp/lcp-venv && /tmp/lcp-venv/bin/pip install llama-cpp-python==0.3.36
(on VMs whose CPUs fault on AMX, build with -DGGML_NATIVE=OFF and AMX off).
Run:
    /tmp/lcp-venv/bin/python scripts/bench/llama_cpp_depth.py MODEL.gguf \
        --threads 2 --pp 512 --tg 64 --depth 0,1024,4096 --reps 3
Prints one JSON object per depth: {"depth", "pp_tps", "tg_tps", ...}, medians
over the repetitions. As llama-bench's -d: the cache first holds `depth`
random tokens; prompt processing is one batch of `pp` tokens after them and
generation `tg` single-token decodes after them (the depth is prefilled
again before each repetition and not timed).
"""
import argparse, json, random, statistics, time
import llama_cpp

try:
    Llama = llama_cpp.Llama
except AttributeError:  # a source tree whose package init exports only the C API
    from llama_cpp.llama import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--depth", default="0")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--no-flash-attn", action="store_true")
    a = ap.parse_args()
    depths = [int(d) for d in a.depth.split(",") if d.strip()]
    ctx = max(depths) + max(a.pp, a.tg) + 16
    llm = Llama(model_path=a.model, n_ctx=ctx, n_batch=a.batch, n_ubatch=a.batch,
                          n_threads=a.threads, n_threads_batch=a.threads, logits_all=False,
                          flash_attn=not a.no_flash_attn, verbose=False)
    rng = random.Random(0)
    vocab = llm.n_vocab()

    def fill(depth):
        llm.reset()
        if hasattr(llm._ctx, "kv_cache_clear"):
            llm._ctx.kv_cache_clear()
        if depth:
            llm.eval([rng.randrange(vocab) for _ in range(depth)])

    def pp_once(depth):
        fill(depth)
        toks = [rng.randrange(vocab) for _ in range(a.pp)]
        t = time.perf_counter()
        llm.eval(toks)
        return a.pp / (time.perf_counter() - t)

    def tg_once(depth):
        fill(depth)
        t = time.perf_counter()
        for _ in range(a.tg):
            llm.eval([rng.randrange(vocab)])
        return a.tg / (time.perf_counter() - t)

    for depth in depths:
        pp_once(depth) if depth == depths[0] else None  # warm-up
        pps = [pp_once(depth) for _ in range(a.reps)] if a.pp else []
        tgs = [tg_once(depth) for _ in range(a.reps)] if a.tg else []
        print(json.dumps({
            "impl": "llama.cpp via llama-cpp-python " + llama_cpp.__version__,
            "threads": a.threads, "depth": depth,
            "pp_tokens": a.pp, "pp_tps": statistics.median(pps) if pps else None, "pp_all": pps,
            "tg_tokens": a.tg, "tg_tps": statistics.median(tgs) if tgs else None, "tg_all": tgs,
        }), flush=True)


if __name__ == "__main__":
    main()
