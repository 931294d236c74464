#!/usr/bin/env python3
"""Aggregate generation speed of a running `weft serve`.

Usage: serve_bench.py URL [--clients 1,4,16] [--tokens 64]

For each client count, that many threads each stream one greedy
completion of --tokens tokens (distinct prompts) at the same time; prints
the aggregate tokens per second (all tokens / wall time), the time to
first token (mean and median) and the mean per-client rate. Standard
library only.
"""

import argparse
import http.client
import json
import threading
import time
import urllib.parse

PROMPTS = [
    "The history of the printing press",
    "A recipe for bread starts with",
    "The planets of the solar system are",
    "In the morning, the market",
    "The rules of chess say",
    "Rivers flow to the sea because",
    "The first computers were",
    "A good night's sleep",
]


def stream_one(url, prompt, tokens, out):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({
        "prompt": prompt, "max_tokens": tokens, "temperature": 0,
        "stream": True, "stop": [],
    })
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    first, count = None, 0
    for line in resp:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(chunk["error"]["message"])
        if chunk["choices"][0]["finish_reason"] is None:
            count += 1
            if first is None:
                first = time.perf_counter() - t0
    out.append((count, first, time.perf_counter() - t0))
    conn.close()


def run(url, clients, tokens):
    out = []
    threads = [
        threading.Thread(
            target=stream_one,
            args=(url, f"{PROMPTS[i % len(PROMPTS)]} (#{i})", tokens, out),
        )
        for i in range(clients)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if len(out) != clients:
        raise RuntimeError(f"{clients - len(out)} clients failed")
    total = sum(c for c, _, _ in out)
    firsts = sorted(f for _, f, _ in out)
    ttft = sum(firsts) / clients
    p50 = firsts[clients // 2] if clients % 2 else (firsts[clients // 2 - 1] + firsts[clients // 2]) / 2
    per_client = sum(c / t for c, _, t in out) / clients
    print(f"{clients:3d} clients x {tokens} tokens: {total / wall:7.1f} tok/s aggregate, "
          f"{per_client:6.1f} tok/s per client, TTFT mean {ttft * 1000:7.1f} ms p50 {p50 * 1000:7.1f} ms, "
          f"wall {wall:.2f} s")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--tokens", type=int, default=64)
    a = p.parse_args()
    run(a.url, 1, 4)  # warm up
    for n in [int(c) for c in a.clients.split(",")]:
        run(a.url, n, a.tokens)


if __name__ == "__main__":
    main()
