#!/usr/bin/env python3
"""A model file's skeleton and its random-weight twin, for speed figures on
a machine the real file cannot reach.

  gguf_skeleton.py strip MODEL.gguf OUT.skel    (needs gguf-py on PYTHONPATH)
  gguf_skeleton.py fill OUT.skel MODEL.gguf     (needs numpy only)

`strip` keeps the file's header (metadata, tokenizer, tensor table) and the
placement and type of every tensor; `fill` writes a file of the same
architecture, shapes and formats whose tensor data are random, with every
block's scales set to small finite values. Speed does not depend on the
weights' values (no routing in these architectures), so a twin measures
what the real file would; its outputs are meaningless.
"""
import json
import struct
import sys

# Bytes per block and the byte offsets of its f16 scales, by ggml type id.
BLOCKS = {
    0: (4, []),          # F32 (one value)
    1: (2, []),          # F16
    2: (18, [0]),        # Q4_0
    3: (20, [0, 2]),     # Q4_1
    6: (22, [0]),        # Q5_0
    7: (24, [0, 2]),     # Q5_1
    8: (34, [0]),        # Q8_0
    10: (84, [80, 82]),  # Q2_K
    11: (110, [108]),    # Q3_K
    12: (144, [0, 2]),   # Q4_K
    13: (176, [0, 2]),   # Q5_K
    14: (210, [208]),    # Q6_K
    30: (2, []),         # BF16
}


def strip(model, out):
    from gguf import GGUFReader

    r = GGUFReader(model)
    tensors = [
        {"offset": int(t.data_offset), "bytes": int(t.n_bytes), "type": int(t.tensor_type)}
        for t in r.tensors
    ]
    start = min(t["offset"] for t in tensors)
    end = max(t["offset"] + t["bytes"] for t in tensors)
    with open(model, "rb") as f:
        head = f.read(start)
    meta = json.dumps({"tensors": tensors, "size": end}).encode()
    with open(out, "wb") as f:
        f.write(struct.pack("<QQ", len(head), len(meta)))
        f.write(head)
        f.write(meta)


def fill(skel, out):
    import numpy as np

    with open(skel, "rb") as f:
        hlen, mlen = struct.unpack("<QQ", f.read(16))
        head = f.read(hlen)
        meta = json.loads(f.read(mlen))
    rng = np.random.default_rng(7)
    with open(out, "wb") as f:
        f.write(head)
        f.truncate(meta["size"])
        for t in meta["tensors"]:
            size, scales = BLOCKS[t["type"]]
            n = t["bytes"] // size
            if t["type"] == 0:
                data = rng.uniform(-0.05, 0.05, n).astype("<f4").tobytes()
            elif t["type"] == 1:
                data = rng.uniform(-0.05, 0.05, n).astype("<f2").tobytes()
            elif t["type"] == 30:
                v = rng.uniform(-0.05, 0.05, n).astype("<f4").view("<u4") >> 16
                data = v.astype("<u2").tobytes()
            else:
                blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
                for at in scales:
                    d = rng.uniform(0.0005, 0.002, n).astype("<f2").view(np.uint8).reshape(n, 2)
                    blocks[:, at : at + 2] = d
                data = blocks.tobytes()
            f.seek(t["offset"])
            f.write(data)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("strip", "fill"):
        sys.exit(__doc__)
    (strip if sys.argv[1] == "strip" else fill)(sys.argv[2], sys.argv[3])
