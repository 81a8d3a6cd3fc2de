"""Small kernels and a compile helper shared by the CPU tests (compile-only, for sm_90)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import triton
import triton.language as tl

from tritonpatch.targets import compile_for_target

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "examples"))
from masked_attention import masked_attention_kernel  # noqa: E402  (the example doubles as a test kernel)


@triton.jit
def fixed_trip_loop_kernel(X, Y, BLOCK: tl.constexpr):
    """A loop with a constant trip count: LLVM unrolls it fully unless ``unroll-threshold`` forbids."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, 12):
        acc = acc * 1.5 + tl.load(X + i * BLOCK + offs)
    tl.store(Y + offs, acc)


KERNELS = {
    "masked_attention": (masked_attention_kernel,
                         {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "stride_qm": "i32",
                          "stride_kn": "i32", "stride_vn": "i32", "stride_om": "i32", "N_CTX": "i32", "PREFIX": "i32"},
                         {"BLOCK_M": 128, "BLOCK_N": 64, "HEAD_DIM": 64}, {"num_warps": 8, "num_stages": 1}),
    "fixed_trip_loop": (fixed_trip_loop_kernel, {"X": "*fp32", "Y": "*fp32"}, {"BLOCK": 128}, {"num_warps": 4}),
}


def compile_ptx(name: str) -> str:
    """PTX of one of KERNELS compiled for sm_90 in this process."""
    fn, signature, constexprs, options = KERNELS[name]
    return compile_for_target(fn, signature, constexprs, target="sm_90", **options).asm["ptx"]


def fresh_process_ptx_digest(name: str, env: dict | None = None) -> str:
    """sha256 of the PTX of one of KERNELS compiled in a brand-new Python process."""
    code = textwrap.dedent(f"""
        import hashlib, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from compile_helpers import compile_ptx
        print(hashlib.sha256(compile_ptx({name!r}).encode()).hexdigest())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
