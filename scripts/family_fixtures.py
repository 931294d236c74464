#!/usr/bin/env python3
"""Generates the tiny model-family fixtures of tests/reference/families.

Each family is made the way a real GGUF of it is made: a small
random-weight model of the architecture in Hugging Face `transformers`,
saved with a small trained tokenizer of the family's kind, converted to
GGUF by llama.cpp's own `convert_hf_to_gguf.py`, then run by llama.cpp
(through `llama-cpp-python`'s bindings) and by transformers in fp32.

For each family FAMILY it writes:

- `FAMILY.gguf`: the converted model (f32 weights).
- `FAMILY.json`: llama.cpp's outputs for every prompt (prompt ids, a
  16-token greedy continuation, the top-5 logits at every step: the last
  prompt position, then after each greedy token) and transformers' fp32
  logits of the first step (the whole vocabulary), plus the settings
  llama.cpp ran with.

Tokenizers are trained on a small built-in corpus so the files stay small:
a byte-level BPE (`tokenizers`) for the BPE families, whose pre-tokenizer
name (`llama-bpe`, `qwen2`) the converter is told since its table of known
vocabularies cannot know a freshly trained one, and a SentencePiece BPE
model with byte fallback for the SentencePiece families.

Usage (llama.cpp sources: the ones vendored in the llama-cpp-python sdist;
the bindings need `LLAMA_CPP_LIB_PATH` pointing at a built libllama when
they were not installed with it):

    python3 scripts/family_fixtures.py --llama-cpp LLAMA_CPP_SOURCES \\
        [--out tests/reference/families] [--only llama3,qwen3]

Requires: torch, transformers, tokenizers, sentencepiece, numpy,
llama-cpp-python.
"""

import argparse
import heapq
import json
import os
import sys
import tempfile
from pathlib import Path

FAMILIES = ["llama3", "mistral", "mistral_swa", "qwen3", "phi3", "phi3_longrope", "qwen3moe"]

# Phi-3 with `longrope` scaling: distinct short and long per-pair factors
# over an original context of 64. llama.cpp takes the long factors when
# its context exceeds the original one, so it runs this fixture with a
# context of 128; transformers takes them once the sequence does, so its
# reference is computed with the short factors replaced by the long ones.
LONGROPE_SHORT = [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.5]
LONGROPE_LONG = [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0]
N_CTX = {"phi3_longrope": 128}

# Mistral with its sliding window in the metadata. llama.cpp's converter
# does not write `llama.attention.sliding_window` and llama.cpp runs
# `llama` with full attention, so for this one fixture the converter is
# told to write the key and the reference is transformers' (which applies
# the window) at every step, not llama.cpp's.
SWA_WINDOW = 8
STEPS = 16
SEED = 1234

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b",
]

CORPUS_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "A model is written once against the builder API and runs on every backend.",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "Rotary embeddings turn each pair of dimensions by an angle that grows with the position.",
    "Mixture-of-experts layers route every token to a few experts and mix their outputs.",
    "Sliding-window attention keeps only the most recent keys and values of each layer.",
    "Numbers: 1 22 333 4444 3.14159 2.71828 100% of 12 apples, 7 pears.",
    "She said: \"It's late, isn't it?\" and we'll see what they've done.",
    "The cache holds keys and values; the step writes its rows and attends over the rest.",
]


def corpus():
    words = " ".join(CORPUS_LINES).split()
    lines = list(CORPUS_LINES)
    # Shuffled recombinations give the trainer more pairs to merge.
    import random

    rng = random.Random(SEED)
    for _ in range(400):
        rng.shuffle(words)
        lines.append(" ".join(words[:12]))
    return lines


# ---------------------------------------------------------------- tokenizers

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def write_bpe_tokenizer(dir_model, split, specials, bos, eos, vocab_size):
    """A byte-level BPE (`tokenizer.json`) with `specials` appended after
    the trained pieces; returns the vocabulary size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens(specials)
    tok.save(str(dir_model / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "add_bos_token": bos is not None,
        "model_max_length": 4096,
    }
    (dir_model / "tokenizer_config.json").write_text(json.dumps(config))
    return tok.get_vocab_size()


def write_spm_tokenizer(dir_model, vocab_size):
    """A SentencePiece BPE model with byte fallback, normalised as Llama's
    (`tokenizer.model`: unk 0, bos 1, eos 2); returns the vocabulary size."""
    import sentencepiece as spm

    prefix = dir_model / "tokenizer"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    (dir_model / "tokenizer.vocab").unlink()
    config = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
    }
    (dir_model / "tokenizer_config.json").write_text(json.dumps(config))
    return vocab_size


# ------------------------------------------------------------------ models

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    initializer_range=0.08,
)


def family_model(family, dir_model):
    """Writes the tokenizer into `dir_model` and returns `(model, pre)`:
    the transformers model and the BPE pre-tokenizer name (None for SPM)."""
    import transformers as tf

    if family == "llama3":
        vocab = write_bpe_tokenizer(
            dir_model, LLAMA3_SPLIT, ["<|begin_of_text|>", "<|end_of_text|>"],
            "<|begin_of_text|>", "<|end_of_text|>", 512,
        )
        cfg = tf.LlamaConfig(
            **COMMON,
            vocab_size=vocab,
            bos_token_id=vocab - 2,
            eos_token_id=vocab - 1,
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
        return tf.LlamaForCausalLM(cfg), "llama-bpe"
    if family in ("mistral", "mistral_swa"):
        vocab = write_spm_tokenizer(dir_model, 400)
        cfg = tf.MistralConfig(
            **COMMON,
            vocab_size=vocab,
            bos_token_id=1,
            eos_token_id=2,
            tie_word_embeddings=False,
            sliding_window=SWA_WINDOW if family == "mistral_swa" else 4096,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
        return tf.MistralForCausalLM(cfg), None
    if family in ("qwen3", "qwen3moe"):
        vocab = write_bpe_tokenizer(
            dir_model, QWEN2_SPLIT, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            None, "<|endoftext|>", 512,
        )
        args = dict(COMMON)
        args["rms_norm_eps"] = 1e-6
        common = dict(
            vocab_size=vocab,
            bos_token_id=vocab - 3,
            eos_token_id=vocab - 3,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        )
        if family == "qwen3":
            cfg = tf.Qwen3Config(**args, **common, tie_word_embeddings=True)
            return tf.Qwen3ForCausalLM(cfg), "qwen2"
        cfg = tf.Qwen3MoeConfig(
            **args,
            **common,
            tie_word_embeddings=False,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
        )
        return tf.Qwen3MoeForCausalLM(cfg), "qwen2"
    if family in ("phi3", "phi3_longrope"):
        # Phi-3's chat tokens follow the SentencePiece pieces, as in the real
        # vocabulary (llama.cpp looks `<|endoftext|>` up by name).
        pieces = write_spm_tokenizer(dir_model, 396)
        added = ["<|endoftext|>", "<|end|>", "<|user|>", "<|assistant|>"]
        (dir_model / "added_tokens.json").write_text(
            json.dumps({t: pieces + i for i, t in enumerate(added)})
        )
        vocab = pieces + len(added)
        args = dict(COMMON)
        args["max_position_embeddings"] = 4096 if family == "phi3" else 256
        cfg = tf.Phi3Config(
            **args,
            vocab_size=vocab,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            tie_word_embeddings=False,
            sliding_window=2047,
            **phi3_rope(family, short=LONGROPE_SHORT),
        )
        return tf.Phi3ForCausalLM(cfg), None
    raise SystemExit(f"unknown family {family}")


def phi3_rope(family, short):
    if family == "phi3":
        return dict(
            original_max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
    return dict(
        original_max_position_embeddings=64,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "long_factor": LONGROPE_LONG,
            "short_factor": short,
            "original_max_position_embeddings": 64,
        },
    )


def reference_model(family, model):
    """The model transformers' references come from: `model`, or for
    `phi3_longrope` the same weights with the long factors everywhere."""
    if family != "phi3_longrope":
        return model
    import transformers as tf

    cfg = model.config.to_dict()
    cfg.update(phi3_rope(family, short=LONGROPE_LONG))
    twin = tf.Phi3ForCausalLM(tf.Phi3Config(**cfg)).to(model.dtype).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def randomize_norms(model):
    """Norm weights start at one; make them random so a missing or
    misplaced norm shows."""
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))


# --------------------------------------------------------------- conversion


def convert(llama_cpp, dir_model, out_path, pre, sliding_window=None):
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    sys.path.insert(0, str(llama_cpp))
    import convert_hf_to_gguf  # noqa: F401  (registers the model classes)
    from conversion import base, llama

    def known_pre(self, tokenizer):
        return pre

    base.TextModel.get_vocab_base_pre = known_pre
    if not hasattr(llama.LlamaModel, "_plain_gguf_parameters"):
        llama.LlamaModel._plain_gguf_parameters = llama.LlamaModel.set_gguf_parameters

    def llama_parameters(self):
        self._plain_gguf_parameters()
        if sliding_window is not None:
            self.gguf_writer.add_sliding_window(sliding_window)

    llama.LlamaModel.set_gguf_parameters = llama_parameters
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(dir_model), "--outfile", str(out_path), "--outtype", "f32"]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


# --------------------------------------------------------------- references


_QUIET = None


def llama_cpp_outputs(gguf_path, flash_attn, n_ctx):
    import llama_cpp as L

    global _QUIET
    if _QUIET is None:
        _QUIET = L.llama_log_callback(lambda level, text, user_data: None)

    L.llama_log_set(_QUIET, None)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(gguf_path).encode(), L.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp cannot load {gguf_path}")
    vocab = L.llama_model_get_vocab(model)
    nv = L.llama_vocab_n_tokens(vocab)
    cases = []
    for text in PROMPTS:
        raw = text.encode()
        buf = (L.llama_token * 256)()
        n = L.llama_tokenize(vocab, raw, len(raw), buf, 256, True, False)
        assert n > 0, n
        ids = list(buf[:n])
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_ubatch = n_ctx
        cp.n_threads = 2
        cp.n_threads_batch = 2
        cp.flash_attn_type = 1 if flash_attn else 0
        ctx = L.llama_init_from_model(model, cp)

        def run(tokens, start):
            b = L.llama_batch_init(len(tokens), 0, 1)
            b.n_tokens = len(tokens)
            for i, t in enumerate(tokens):
                b.token[i] = t
                b.pos[i] = start + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = i == len(tokens) - 1
            assert L.llama_decode(ctx, b) == 0
            v = L.llama_get_logits_ith(ctx, len(tokens) - 1)[:nv]
            L.llama_batch_free(b)
            return v

        v = run(ids, 0)
        pos = len(ids)
        greedy, top5 = [], []
        for k in range(STEPS):
            order = heapq.nlargest(5, range(nv), key=lambda i: (v[i], -i))
            top5.append([[i, v[i]] for i in order])
            greedy.append(order[0])
            if k + 1 < STEPS:
                v = run([order[0]], pos)
                pos += 1
        L.llama_free(ctx)
        cases.append({"text": text, "prompt_ids": ids, "greedy_ids": greedy, "top5_steps": top5})
    L.llama_model_free(model)
    return cases


def llama_cpp_prompt_ids(gguf_path):
    """llama.cpp's token ids of every prompt (BOS as the file says)."""
    import llama_cpp as L

    global _QUIET
    if _QUIET is None:
        _QUIET = L.llama_log_callback(lambda level, text, user_data: None)
    L.llama_log_set(_QUIET, None)
    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(gguf_path).encode(), params)
    vocab = L.llama_model_get_vocab(model)
    out = []
    for text in PROMPTS:
        raw = text.encode()
        buf = (L.llama_token * 256)()
        n = L.llama_tokenize(vocab, raw, len(raw), buf, 256, True, False)
        assert n > 0, n
        out.append(list(buf[:n]))
    L.llama_model_free(model)
    return out


def transformers_outputs(model, prompts):
    """transformers' greedy continuation and top-5 logits at every step
    (the whole sequence recomputed each step, fp32)."""
    import torch

    cases = []
    for text, ids in zip(PROMPTS, prompts):
        seq = list(ids)
        greedy, top5 = [], []
        for _ in range(STEPS):
            with torch.no_grad():
                v = model(torch.tensor([seq], dtype=torch.long)).logits[0, -1].tolist()
            order = heapq.nlargest(5, range(len(v)), key=lambda i: (v[i], -i))
            top5.append([[i, v[i]] for i in order])
            greedy.append(order[0])
            seq.append(order[0])
        cases.append({"text": text, "prompt_ids": ids, "greedy_ids": greedy, "top5_steps": top5})
    return cases


def transformers_first_step(model, ids):
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long))
    return [float(x) for x in out.logits[0, -1].to(torch.float32)]


# Attention as weft runs each architecture on the CPU (`LlamaArch::flash_attention`).
FLASH_ATTN = {
    "llama3": True,
    "mistral": True,
    "mistral_swa": True,
    "qwen3": False,
    "phi3": False,
    "phi3_longrope": False,
    "qwen3moe": False,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, type=Path, help="llama.cpp sources (convert_hf_to_gguf.py, gguf-py)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/reference/families")
    ap.add_argument("--only", default=",".join(FAMILIES))
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    args.out.mkdir(parents=True, exist_ok=True)
    for family in args.only.split(","):
        torch.manual_seed(SEED)
        with tempfile.TemporaryDirectory() as tmp:
            dir_model = Path(tmp) / family
            dir_model.mkdir()
            model, pre = family_model(family, dir_model)
            randomize_norms(model)
            model = model.to(torch.float32).eval()
            model.save_pretrained(dir_model)
            gguf_path = args.out / f"{family}.gguf"
            swa = family == "mistral_swa"
            convert(args.llama_cpp, dir_model, gguf_path, pre, SWA_WINDOW if swa else None)
            if swa:
                cases = transformers_outputs(model, llama_cpp_prompt_ids(gguf_path))
            else:
                cases = llama_cpp_outputs(gguf_path, FLASH_ATTN[family], N_CTX.get(family, 64))
            reference = reference_model(family, model)
            for c in cases:
                c["transformers_first_logits"] = transformers_first_step(reference, c["prompt_ids"])
        doc = {
            "family": family,
            "architecture": model.config.architectures[0] if model.config.architectures else type(model).__name__,
            "reference": "transformers" if swa else "llama.cpp",
            "llama_cpp": {"n_ctx": N_CTX.get(family, 64), "n_threads": 2, "flash_attn": FLASH_ATTN[family], "kv_cache": "f16"},
            "steps": STEPS,
            "cases": cases,
        }
        (args.out / f"{family}.json").write_text(json.dumps(doc, indent=None) + "\n")
        print(f"{family}: {gguf_path.stat().st_size} bytes, greedy {[c['greedy_ids'] for c in cases]}", file=sys.stderr)


if __name__ == "__main__":
    main()
