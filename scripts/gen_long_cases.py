#!/usr/bin/env python3
"""Generate llama.cpp ground truth for prompts long enough to exercise the
attention kernels the short reference prompts never reach: the tiled kernel
(>= 64 prompt tokens in a ubatch) and the split-KV decode (> 256 cached tokens).

Uses llama-cpp-python 0.3.36 (the llama.cpp of tests/reference), CPU, KV f16,
flash attention on, n_ctx 512, 2 threads, whole prompt in one batch, greedy.
    /tmp/lcp/bin/python scripts/gen_long_cases.py MODEL.gguf > tests/data/smollm2_long_cases.json
"""
import json, sys
import numpy as np
import llama_cpp

def main(path):
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.use_extra_bufts = False  # no AMX repacking on the generating machine
    model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = 512; cp.n_batch = 512; cp.n_ubatch = 512; cp.n_threads = 2; cp.n_threads_batch = 2
    cp.flash_attn_type = 1
    ctx = llama_cpp.llama_init_from_model(model, cp)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    text = open("/usr/share/common-licenses/GPL-3").read()
    def tokenize(s):
        buf = (llama_cpp.llama_token * 65536)()
        n = llama_cpp.llama_tokenize(vocab, s.encode(), len(s.encode()), buf, 65536, True, False)
        assert n > 0
        return list(buf[:n])
    toks = tokenize(text)
    cases = []
    for start, length, gen in [(0, 70, 24), (900, 130, 24), (2000, 250, 40), (3000, 400, 40)]:
        ids = toks[start:start + length]
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(ids))) == 0
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
        top5 = [[int(i), float(logits[i])] for i in np.argsort(-logits, kind="stable")[:5]]
        out = []
        for _ in range(gen):
            t = int(np.argmax(logits))
            out.append(t)
            one = (llama_cpp.llama_token * 1)(t)
            assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1)) == 0
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
        cases.append({"prompt_ids": ids, "top5_last": top5, "greedy_ids": out})
    json.dump({"about": __doc__.strip().splitlines()[0], "cases": cases}, sys.stdout)

if __name__ == "__main__":
    main(sys.argv[1])
