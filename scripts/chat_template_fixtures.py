#!/usr/bin/env python3
"""Ground truth for weft's chat templates (models/src/chat).

Renders real chat templates with Python's jinja2 set up exactly as
transformers' `apply_chat_template` sets it up (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, the loopcontrols extension, `raise_exception`,
`strftime_now`, a `tojson` that is `json.dumps(ensure_ascii=False)`), over
a few conversations each, and writes one fixture per template:
models/tests/data/chat_templates/<name>.json with the template source, the
bos/eos texts it was given, and per case the messages (and tools), the
add_generation_prompt flag and the expected text, or the exception message
when the template refuses the conversation. models/tests/chat_template.rs
renders the same with minijinja and compares exactly; it needs no Python.

Templates:
  smollm2    tokenizer.chat_template of SmolLM2-135M-Instruct's GGUF (--smollm2)
  qwen2_5    Qwen2.5-Instruct (ChatML with tools), llama.cpp's
             models/templates/Qwen-Qwen2.5-7B-Instruct.jinja
  gemma2     Gemma's <start_of_turn> template (google-gemma-2-2b-it.jinja)
  llama3_1   Llama 3.1 Instruct (tools as indented JSON)
The .jinja files are llama.cpp's copies of the Hugging Face templates, as
shipped in the source archive of llama-cpp-python 0.3.36 on PyPI
(llama_cpp_python-0.3.36.tar.gz, folder vendor/llama.cpp/models/templates);
pass that folder, unpacked, as --templates.

Usage:
  pip install jinja2==3.1.6
  python scripts/chat_template_fixtures.py \
      --smollm2 ~/.cache/weft/SmolLM2-135M-Instruct.Q4_1.gguf \
      --templates llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates
"""

from __future__ import annotations

import argparse
import json
import os
import struct
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "models", "tests", "data", "chat_templates")


def gguf_metadata(path: str) -> dict:
    """The key/value metadata of a GGUF file (arrays included)."""
    scalars = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
               7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        def read(fmt):
            size = struct.calcsize(fmt)
            return struct.unpack(fmt, f.read(size))[0]

        def string():
            return f.read(read("<Q")).decode("utf-8")

        def value(t):
            if t == 8:
                return string()
            if t == 9:
                et, n = read("<I"), read("<Q")
                return [value(et) for _ in range(n)]
            return read(scalars[t])

        if f.read(4) != b"GGUF":
            raise SystemExit(f"{path} is not a GGUF file")
        read("<I")  # version
        read("<Q")  # tensor count
        kv = {}
        for _ in range(read("<Q")):
            key = string()
            kv[key] = value(read("<I"))
        return kv


def environment() -> ImmutableSandboxedEnvironment:
    """jinja2 as transformers' _compile_jinja_template configures it."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def sorted_keys(x):
    """Maps with their keys in order: the Rust side reads JSON objects sorted."""
    if isinstance(x, dict):
        return {k: sorted_keys(x[k]) for k in sorted(x)}
    if isinstance(x, list):
        return [sorted_keys(v) for v in x]
    return x


SYSTEM = "You are a concise assistant. Answer in one sentence."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


def conversations(tools: bool):
    """(messages, tools, add_generation_prompt) cases."""
    u1 = {"role": "user", "content": "What is 2+2?"}
    a1 = {"role": "assistant", "content": "2+2 is 4."}
    u2 = {"role": "user", "content": "And 3+3?"}
    a2 = {"role": "assistant", "content": "3+3 is 6."}
    sys = {"role": "system", "content": SYSTEM}
    odd = [
        {"role": "user", "content": "  Héllo\n wörld 😀 \"quoted\" {{ not a tag }}  "},
        {"role": "assistant", "content": "\n  An answer with spaces and\ttabs.  \n"},
        {"role": "user", "content": "line one\nline two\n\nline four"},
    ]
    cases = [
        ([sys, u1], None, True),
        ([sys, u1, a1, u2], None, True),
        ([sys, u1, a1, u2, a2], None, False),
        ([u1], None, True),
        ([u1], None, False),
        ([u1, a1, u2, a2], None, False),
        ([u1, a1, u2], None, True),
        (odd, None, True),
        ([sys] + odd, None, True),
        ([u1, u2], None, True),
    ]
    if tools:
        call = {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {
                    "name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]}
        result = {"role": "tool", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"}
        ask = {"role": "user", "content": "What is the weather in Zürich?"}
        cases += [
            ([ask], [WEATHER_TOOL], True),
            ([sys, ask], [WEATHER_TOOL], True),
            ([sys, ask, call, result], [WEATHER_TOOL], True),
        ]
    return cases


def fixture(name, source, bos, eos, tools):
    env = environment()
    template = env.from_string(source)
    cases = []
    for messages, tool_list, add_generation_prompt in conversations(tools):
        messages = sorted_keys(messages)
        tool_list = sorted_keys(tool_list)
        ctx = dict(messages=messages, add_generation_prompt=add_generation_prompt,
                   bos_token=bos, eos_token=eos)
        case = {"messages": messages, "add_generation_prompt": add_generation_prompt}
        if tool_list is not None:
            ctx["tools"] = tool_list
            case["tools"] = tool_list
        try:
            case["expected"] = template.render(**ctx)
        except jinja2.exceptions.TemplateError as e:
            case["error"] = str(e)
        cases.append(case)
    return {"name": name, "source": source, "bos_token": bos, "eos_token": eos,
            "generator": "scripts/chat_template_fixtures.py, jinja2 " + jinja2.__version__,
            "cases": cases}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2", required=True, help="SmolLM2-135M-Instruct GGUF")
    ap.add_argument("--templates", required=True,
                    help="llama.cpp's models/templates folder")
    args = ap.parse_args()

    kv = gguf_metadata(os.path.expanduser(args.smollm2))
    tokens = kv["tokenizer.ggml.tokens"]
    specs = [
        ("smollm2", kv["tokenizer.chat_template"],
         tokens[kv["tokenizer.ggml.bos_token_id"]],
         tokens[kv["tokenizer.ggml.eos_token_id"]], False),
    ]
    for name, file, bos, eos, tools in [
        ("qwen2_5", "Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|im_end|>", True),
        ("gemma2", "google-gemma-2-2b-it.jinja", "<bos>", "<eos>", False),
        ("llama3_1", "meta-llama-Llama-3.1-8B-Instruct.jinja",
         "<|begin_of_text|>", "<|eot_id|>", True),
    ]:
        with open(os.path.join(args.templates, file), encoding="utf-8") as f:
            specs.append((name, f.read(), bos, eos, tools))

    os.makedirs(OUT_DIR, exist_ok=True)
    for name, source, bos, eos, tools in specs:
        path = os.path.join(OUT_DIR, f"{name}.json")
        data = fixture(name, source, bos, eos, tools)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
            f.write("\n")
        ok = sum("expected" in c for c in data["cases"])
        print(f"{path}: {ok} renders, {len(data['cases']) - ok} refusals")


if __name__ == "__main__":
    main()
