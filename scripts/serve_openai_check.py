#!/usr/bin/env python3
"""Checks a running `weft serve` with the official `openai` client.

Usage: serve_openai_check.py BASE_URL MODEL_ID   (BASE_URL ends in /v1)

Chat (whole and streamed, which must agree), completions, stop strings,
logprobs, usage, and errors (unknown model -> NotFoundError, n = 2 ->
BadRequestError). Exits non-zero on the first failed check.
"""

import concurrent.futures
import sys

import openai


def main() -> None:
    base, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)

    models = client.models.list()
    assert [m.id for m in models.data] == [model], models

    messages = [{"role": "user", "content": "Name a colour."}]
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=10, temperature=0, seed=1
    )
    choice = whole.choices[0]
    assert choice.message.role == "assistant", choice
    assert choice.message.content, choice
    assert choice.finish_reason in ("stop", "length"), choice
    assert whole.usage.completion_tokens > 0 and whole.usage.prompt_tokens > 0, whole.usage
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    assert "".join(parts) == choice.message.content, (parts, choice.message.content)
    assert finish == choice.finish_reason, finish
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens, usage

    # Completions and stop strings.
    done = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=16, temperature=0
    )
    text = done.choices[0].text
    assert done.usage.completion_tokens == 16, done.usage
    cut = text.split("United")[0]
    assert cut != text, text
    stopped = client.completions.create(
        model=model,
        prompt="The capital of France is",
        max_tokens=16,
        temperature=0,
        stop=["United"],
    )
    assert stopped.choices[0].text == cut, (stopped.choices[0].text, cut)
    assert stopped.choices[0].finish_reason == "stop"

    # Logprobs: greedy picks the most likely token.
    lp = client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    content = lp.choices[0].logprobs.content
    assert len(content) == lp.usage.completion_tokens
    for t in content:
        assert len(t.top_logprobs) == 2
        assert t.logprob == t.top_logprobs[0].logprob <= 0.0, t

    # Sampling with a seed repeats.
    sampled = [
        client.completions.create(
            model=model, prompt="Once upon a time", max_tokens=8, temperature=0.9, top_p=0.9, seed=42
        ).choices[0].text
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1], sampled

    # Errors come back as the client's exception types.
    try:
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=2)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404 and "no-such-model" in str(e), e
    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=2, n=2)
        raise AssertionError("n = 2 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400, e

    # Load: 16 concurrent greedy streams, each exactly its solo tokens.
    prompts = [f"Item {i}: a short fact about the number {i} is" for i in range(16)]

    def streamed(prompt):
        parts, finish = [], None
        for chunk in client.completions.create(
            model=model, prompt=prompt, max_tokens=8, temperature=0, stream=True
        ):
            for c in chunk.choices:
                if c.finish_reason:
                    finish = c.finish_reason
                else:
                    parts.append(c.text)
        return len(parts), "".join(parts), finish

    solo = [streamed(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        together = list(pool.map(streamed, prompts))
    assert together == solo, (together, solo)
    assert all(n == 8 and f == "length" for n, _, f in solo), solo

    print("openai client checks passed")


if __name__ == "__main__":
    main()
