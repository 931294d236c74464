#!/usr/bin/env python3
"""Compiles the CUDA program of a git revision to PTX with NVRTC, without a
GPU and without building weft: the sources in the order and with the
`#line` markers `kernels/src/cuda/module.rs` joins them, and its options.

Two revisions whose PTX (from this script, one compiler) is byte-identical
run identical kernels, so a refactor of the CUDA sources (a file split, a
comment) can be checked on a machine with no device. (weft's own compile,
through cudarc, may number a few virtual registers differently; compare
revisions with this script, not with a runtime's PTX cache.)

    pip download --no-deps --only-binary=:all: nvidia-cuda-nvrtc -d /tmp/nvrtc
    (cd /tmp/nvrtc && python3 -m zipfile -e nvidia_cuda_nvrtc-*.whl x)
    scripts/cuda/ptx_at_revision.py --nvrtc /tmp/nvrtc/x/nvidia/cu13/lib/libnvrtc.so.13 \
        main sm_90 before.ptx
    scripts/cuda/ptx_at_revision.py --nvrtc ... HEAD sm_90 after.ptx
    cmp before.ptx after.ptx
"""
import argparse
import ctypes
import re
import subprocess
import sys
from pathlib import Path


def program_source(repo, rev):
    def show(path):
        return subprocess.check_output(["git", "-C", repo, "show", f"{rev}:{path}"]).decode()

    module = show("kernels/src/cuda/module.rs")
    names = re.findall(r'\(\s*"([^"]+\.cu)",\s*include_str!', module)
    if not names:
        sys.exit(f"no sources found in {rev}:kernels/src/cuda/module.rs")
    return names, "".join(f'#line 1 "{n}"\n{show("kernels/src/cuda/" + n)}\n' for n in names)


def compile_ptx(lib, source, arch):
    nvrtc = ctypes.CDLL(lib)
    prog = ctypes.c_void_p()
    # No program name, as cudarc compiles it (the name shows in mangled symbols).
    status = nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), None, 0, None, None)
    if status:
        sys.exit(f"nvrtcCreateProgram failed ({status})")
    # module.rs's compile_options, in the order cudarc passes them (the
    # order shows in the PTX's register numbering).
    opts = ["--ftz=false", "--prec-sqrt=true", "--prec-div=true", "--fmad=false",
            f"--gpu-architecture={arch}", "--std=c++17", "--diag-suppress=177"]
    status = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts]))
    size = ctypes.c_size_t()
    if status:
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        sys.exit(f"NVRTC failed ({status}):\n{log.value.decode(errors='replace')[-4000:]}")
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    return ptx.value


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvrtc", required=True, help="path of libnvrtc.so")
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[2]))
    ap.add_argument("revision")
    ap.add_argument("arch", help="e.g. sm_90")
    ap.add_argument("out", help="where the PTX goes")
    a = ap.parse_args()
    names, source = program_source(a.repo, a.revision)
    ptx = compile_ptx(a.nvrtc, source, a.arch)
    Path(a.out).write_bytes(ptx)
    print(f"{a.revision} {a.arch}: {len(names)} sources, {len(ptx)} bytes of PTX -> {a.out}")


if __name__ == "__main__":
    main()
