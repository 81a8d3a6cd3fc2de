"""Pure-torch attention: the specification of :func:`tritonpatch.kernels.attention` and its CPU path.

Computes in float32 (float64 inputs stay float64) and materialises the S×S scores, so use it for
checking and small shapes only.
"""
from __future__ import annotations

import math

import torch


def attention(q, k, v, *, mask_mod=None, score_mod=None, scale=None, enable_gqa=False, return_lse=False):
    """Softmax attention of ``q [B, H, Sq, D]`` over ``k, v [B, Hkv, Skv, D]``.

    ``score = q·k * scale`` (default ``1/sqrt(D)``), then ``score_mod``, then ``mask_mod`` (pairs it
    rejects get ``-inf``). A query row with no allowed key yields zeros and ``lse = -inf``. With
    ``enable_gqa`` each group of ``H / Hkv`` query heads shares one key/value head. Returns the output
    in q's dtype, plus the natural-log ``logsumexp [B, H, Sq]`` (float32) when ``return_lse``."""
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if kv_heads != heads:
        if not enable_gqa or heads % kv_heads:
            raise ValueError(f"q has {heads} heads and k/v {kv_heads}: pass enable_gqa=True with H divisible by Hkv")
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    scores = torch.einsum("bhqd,bhkd->bhqk", q.to(compute), k.to(compute)) * scale

    b_idx = torch.arange(batch, device=q.device).view(batch, 1, 1, 1)
    h_idx = torch.arange(heads, device=q.device).view(1, heads, 1, 1)
    q_idx = torch.arange(q_len, device=q.device).view(1, 1, q_len, 1)
    kv_idx = torch.arange(kv_len, device=q.device).view(1, 1, 1, kv_len)
    if score_mod is not None:
        scores = score_mod(scores, b_idx, h_idx, q_idx, kv_idx).to(compute)
    if mask_mod is not None:
        keep = mask_mod(b_idx, h_idx, q_idx, kv_idx)
        scores = scores.masked_fill(~keep.to(torch.bool), float("-inf"))

    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    out = torch.einsum("bhqk,bhkd->bhqd", weights, v.to(compute)).to(q.dtype)
    return (out, lse.to(torch.float32)) if return_lse else out
