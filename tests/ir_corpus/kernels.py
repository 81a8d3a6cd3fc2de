"""The kernels of the golden IR corpus: what each one is, and exactly how it is compiled.

Each :class:`CorpusKernel` fixes a kernel, its signature, its compile-time constants and its
launch-like argument attributes, so the corpus can be regenerated bit for bit. The packaged
kernels (the seed report's kernel, the attention forward and backward, the masked-matmul
example) are taken through their public compile paths; the loop kernels below are the corpus's
own, frozen here so that editing a test elsewhere never moves the corpus: the mask styles of
tests/cpu/test_passes.py, a caller-given loop range, an impure inline asm in the loop, an xor mask,
and the Triton tutorial's two-stage causal attention.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

import tritonpatch.kernels as K
from tritonpatch.targets import aligned_pointer_attrs
from tritonpatch.kernels import seed
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd import launch as bwd_launch
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import kernels as fwd_kernels
from tritonpatch.kernels.fwd import launch as fwd_launch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "examples"))
import masked_matmul  # noqa: E402  (the example's kernel is one of the corpus kernels)


@dataclass(frozen=True)
class CorpusKernel:
    """One corpus entry: ``fn`` compiled for sm_90 with ``signature`` (constexprs included as
    ``"constexpr"``), ``constexprs``, ``attrs`` (Triton's per-argument attributes, e.g. pointer
    divisibility as a launch with aligned tensors specializes it) and ``num_warps``/``num_stages``."""
    name: str
    what: str
    fn: Any
    signature: dict
    constexprs: dict
    attrs: dict = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2


def entry(name: str, what: str, fn, signature: dict, constexprs: dict, **options) -> CorpusKernel:
    """A CorpusKernel with the constexprs folded into the signature and aligned pointers."""
    full = {**signature, **{key: "constexpr" for key in constexprs}}
    return CorpusKernel(name, what, fn, full, dict(constexprs), aligned_pointer_attrs(fn, full), **options)


# --- the corpus's own loop kernels ---------------------------------------------------------------------
CAUSAL, PREFIX_OR_CAUSAL, XOR, FROM_MEMORY = range(4)


@triton.jit
def online_softmax_loop(Q, K, V, Out, M, P, LO, HI, N_CTX, MASK: tl.constexpr, NEGATED: tl.constexpr,
                        STORE: tl.constexpr, IMPURE_ASM: tl.constexpr, CALLER_RANGE: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Online-softmax attention over pointer arithmetic with one of several mask styles.

    MASK: ``rows >= cols`` (CAUSAL), ``cols < P | rows > cols + 3`` (PREFIX_OR_CAUSAL),
    ``(rows >= cols) ^ (cols < P)`` (XOR), or a mask loaded from ``M`` (FROM_MEMORY, not
    analysable). NEGATED writes ``where(~keep, -inf, qk)``; STORE adds a store to the loop body;
    IMPURE_ASM passes the scores through a side-effecting inline asm before the mask;
    CALLER_RANGE loops over ``range(LO, HI, BLOCK_N)`` instead of ``range(0, N_CTX, BLOCK_N)``."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    if CALLER_RANGE:
        lo = LO
        hi = HI
    else:
        lo = 0
        hi = N_CTX
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    k_ptrs = K + (lo + offs_n)[None, :] * D + offs_d[:, None]
    v_ptrs = V + (lo + offs_n)[:, None] * D + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        qk = tl.dot(q, tl.load(k_ptrs))
        if IMPURE_ASM:
            qk = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [qk], dtype=tl.float32, is_pure=False, pack=1)
        rows = offs_m[:, None]
        cols = start_n + offs_n[None, :]
        if MASK == 0:
            keep = rows >= cols
        elif MASK == 1:
            keep = (cols < P) | (rows > cols + 3)
        elif MASK == 2:
            keep = (rows >= cols) ^ (cols < P)
        else:
            keep = tl.load(M + rows * N_CTX + cols) > 0
        if NEGATED:
            qk = tl.where(~keep, float("-inf"), qk)
        else:
            qk = tl.where(keep, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), tl.load(v_ptrs))
        m_i = m_ij
        if STORE:
            tl.store(Out + offs_m, m_i)
        k_ptrs += BLOCK_N * D
        v_ptrs += BLOCK_N * D
    tl.store(Out + offs_m[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


LOOP_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "M": "*i8", "P": "i32", "LO": "i32",
                  "HI": "i32", "N_CTX": "i32"}


def loop_entry(name: str, what: str, mask: int, negated=False, store=False, impure_asm=False,
               caller_range=False) -> CorpusKernel:
    return entry(name, what, online_softmax_loop, LOOP_SIGNATURE,
                 {"MASK": mask, "NEGATED": negated, "STORE": store, "IMPURE_ASM": impure_asm,
                  "CALLER_RANGE": caller_range, "BLOCK_M": 64, "BLOCK_N": 32, "D": 32})


@triton.jit
def _tutorial_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, start_m, qk_scale, offs_m, offs_n, N_CTX,
                    STAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The tutorial's ``_attn_fwd_inner``: STAGE 1 walks the kv tiles left of the diagonal block
    without a mask, STAGE 2 the on-band block ``[start_m*BLOCK_M, (start_m+1)*BLOCK_M)`` with the
    causal mask added as ``where(mask, 0, -1e6)``."""
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
        lo = tl.multiple_of(lo, BLOCK_M)
    else:
        lo, hi = 0, N_CTX
    k_ptrs += lo * HEAD_DIM
    v_ptrs += lo * HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        qk = tl.dot(q, tl.load(k_ptrs))
        if STAGE == 2:
            mask = offs_m[:, None] >= (start_n + offs_n[None, :])
            qk = qk * qk_scale + tl.where(mask, 0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk -= m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(tl.float16), tl.load(v_ptrs), acc)
        l_i = l_i * alpha + l_ij
        m_i = m_ij
        k_ptrs += BLOCK_N * HEAD_DIM
        v_ptrs += BLOCK_N * HEAD_DIM
    return acc, l_i, m_i


@triton.jit
def tutorial_causal_attention(Q, K, V, Out, sm_scale, N_CTX, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              HEAD_DIM: tl.constexpr, STAGE: tl.constexpr):
    """The Triton tutorial's fused-attention forward (one head, pointers instead of descriptors):
    STAGE 3 is causal, an off-band loop and then an on-band loop."""
    start_m = tl.program_id(0)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    q = tl.load(Q + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    k_ptrs = K + offs_n[None, :] * HEAD_DIM + offs_d[:, None]
    v_ptrs = V + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    if STAGE & 1:
        acc, l_i, m_i = _tutorial_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, start_m, qk_scale, offs_m, offs_n, N_CTX,
                                        4 - STAGE, BLOCK_M, BLOCK_N, HEAD_DIM)
    if STAGE & 2:
        acc, l_i, m_i = _tutorial_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, start_m, qk_scale, offs_m, offs_n, N_CTX,
                                        2, BLOCK_M, BLOCK_N, HEAD_DIM)
    acc = acc / l_i[:, None]
    tl.store(Out + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc.to(Out.type.element_ty))


# --- the packaged kernels ------------------------------------------------------------------------------
def forward_entry(name: str, what: str, mask) -> CorpusKernel:
    config = fwd_configs.FwdConfig(64, 64, 4, 2)
    return entry(name, what, fwd_kernels._attn_fwd_kernel,
                 fwd_launch.kernel_signature(torch.bfloat16, 64, config, mask, None),
                 fwd_launch.kernel_constexprs(64, config, mask, None), **config.compile_options())


def backward_entry(name: str, what: str, kernel: str, mask) -> CorpusKernel:
    config = bwd_configs.KernelConfig(64, 64, 4, 2)
    fn, signature, constexprs, attrs = bwd_launch.compile_spec(kernel, torch.bfloat16, 64, config, mask)
    return CorpusKernel(name, what, fn, signature, constexprs, attrs, config.num_warps, config.num_stages)


MATMUL_CONSTEXPRS = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "SPLIT_K": 2}

CORPUS = [
    entry("seed_report", "the seed report's kernel: (q<=P & kv<=P) | q>=kv on every 128x64 tile",
          seed.seed_attention_fwd, seed.SIGNATURE, seed.seed_constexprs(), num_stages=3),
    entry("seed_unmasked", "the seed kernel without its mask: nothing for the passes to do", seed.seed_attention_fwd,
          seed.SIGNATURE, seed.seed_constexprs(masked=False), num_stages=3),
    forward_entry("attention_fwd_causal", "packaged forward, causal (full-tile loop, then partial-tile loop)",
                  K.causal()),
    forward_entry("attention_fwd_sliding_or_prefix", "packaged forward, sliding window (64) or prefix-LM (128)",
                  K.or_masks(K.sliding_window(64), K.prefix_lm(128))),
    backward_entry("attention_bwd_dkdv_causal", "packaged backward dK/dV kernel, causal (atomic dQ)", "dkdv",
                   K.causal()),
    backward_entry("attention_bwd_dq_causal", "packaged backward dQ kernel, causal", "dq", K.causal()),
    loop_entry("loop_causal", "online-softmax loop, rows >= cols", CAUSAL),
    loop_entry("loop_prefix_or_causal_negated", "cols < P | rows > cols + 3, written where(~keep, -inf, qk)",
               PREFIX_OR_CAUSAL, negated=True),
    loop_entry("loop_xor", "xor mask (rows >= cols) ^ (cols < P)", XOR),
    loop_entry("loop_mask_from_memory", "a mask loaded from memory (not analysable)", FROM_MEMORY),
    loop_entry("loop_store_in_body", "causal with a store in the loop body", CAUSAL, store=True),
    loop_entry("loop_caller_range", "causal over a caller-given range(LO, HI, BLOCK_N)", CAUSAL, caller_range=True),
    loop_entry("loop_impure_asm", "causal with a side-effecting inline asm on the scores in the loop", CAUSAL,
               impure_asm=True),
    entry("tutorial_causal_two_stage", "Triton tutorial attention, causal: off-band loop, then on-band loop",
          tutorial_causal_attention, {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "sm_scale": "fp32",
                                      "N_CTX": "i32"},
          {"BLOCK_M": 64, "BLOCK_N": 32, "HEAD_DIM": 64, "STAGE": 3}),
    entry("masked_matmul", "examples/masked_matmul.py: masked loads in the loop, masked atomic_add after it",
          masked_matmul.jit_kernel, masked_matmul.SIGNATURE, MATMUL_CONSTEXPRS),
]
