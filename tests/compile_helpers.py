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


@triton.jit
def masked_attention_kernel(Q, K, V, Out, stride_qm, stride_kn, stride_vn, stride_om, N_CTX, PREFIX,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One q-block of attention over every kv-block with the seed report's prefix-LM mask
    ``(q <= P & kv <= P) | q >= kv``, pointer arithmetic inside the loop (LSR's territory)."""
    start_m = tl.program_id(0)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    k_ptrs = K + offs_n[None, :] * stride_kn + offs_d[:, None]
    v_ptrs = V + offs_n[:, None] * stride_vn + offs_d[None, :]
    for start_n in range(0, N_CTX, BLOCK_N):
        k = tl.load(k_ptrs)
        qk = tl.dot(q, k)
        kv = start_n + offs_n
        mask = ((offs_m[:, None] <= PREFIX) & (kv[None, :] <= PREFIX)) | (offs_m[:, None] >= kv[None, :])
        qk = tl.where(mask, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), tl.load(v_ptrs))
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


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
