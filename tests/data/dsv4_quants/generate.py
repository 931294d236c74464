"""Random blocks of the weight formats DeepSeek-V4 GGUFs use (Q2_K, Q4_K,
IQ2_XXS, MXFP4), dequantized by the `gguf` Python package: the expected
values of tests/dsv4_quants.rs.

Run with a Python that has `gguf` and numpy (written with gguf 0.19.0):
    python tests/data/dsv4_quants/generate.py
Writes `<type>.blocks` (raw blocks: ROWS rows of COLS values) and
`<type>.f32` (gguf's dequantization, little-endian f32, row-major).
"""

import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

ROWS, COLS = 6, 512
HERE = os.path.dirname(os.path.abspath(__file__))


def f16(rng, n, lo, hi):
    return rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def blocks(rng, qtype, n):
    if qtype == T.Q2_K:  # scales[16] qs[64] d dmin
        b = rng.integers(0, 256, (n, 84), dtype=np.uint8)
        b[:, 80:82] = f16(rng, n, 0.002, 0.05)
        b[:, 82:84] = f16(rng, n, 0.002, 0.05)
    elif qtype == T.Q4_K:  # d dmin scales[12] qs[128]
        b = rng.integers(0, 256, (n, 144), dtype=np.uint8)
        b[:, 0:2] = f16(rng, n, 0.002, 0.05)
        b[:, 2:4] = f16(rng, n, 0.002, 0.05)
    elif qtype == T.IQ2_XXS:  # d qs[32 x u16]
        b = rng.integers(0, 256, (n, 66), dtype=np.uint8)
        b[:, 0:2] = f16(rng, n, 0.002, 0.05)
    elif qtype == T.MXFP4:  # e qs[16]
        b = rng.integers(0, 256, (n, 17), dtype=np.uint8)
        b[:, 0] = rng.integers(118, 134, n, dtype=np.uint8)
    else:
        raise ValueError(qtype)
    return b


def main():
    rng = np.random.default_rng(20261130)
    for name, qtype, per_block in [
        ("q2_k", T.Q2_K, 256),
        ("q4_k", T.Q4_K, 256),
        ("iq2_xxs", T.IQ2_XXS, 256),
        ("mxfp4", T.MXFP4, 32),
    ]:
        b = blocks(rng, qtype, ROWS * COLS // per_block)
        data = b.reshape(ROWS, -1)
        values = dequantize(data, qtype).astype(np.float32)
        assert values.shape == (ROWS, COLS), values.shape
        assert np.isfinite(values).all()
        data.tofile(os.path.join(HERE, f"{name}.blocks"))
        values.astype("<f4").tofile(os.path.join(HERE, f"{name}.f32"))
        print(name, data.shape, float(np.abs(values).max()))


if __name__ == "__main__":
    main()
