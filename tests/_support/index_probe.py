"""A score modifier that records the indices the kernels hand it: the largest query and key index its
``device_fn`` saw (and, registered as its gradient rule, the largest its gradient saw), so a test can
check that modifiers never see a position past the sequence ends. A modifier that reads a per-query or
per-key table (a bias per key, a length per row) indexes it with these values; one past the end reads
memory the table does not own.

The probe leaves the scores unchanged, so the attention still matches the reference without a modifier."""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

import tritonpatch.kernels as K
from tritonpatch.kernels import scores as scores_module


@triton.jit
def _record_indices_dev(score, b, h, q_idx, kv_idx, largest):
    zero = q_idx * 0 + kv_idx * 0                       # the tile's shape: [rows, keys] or [keys, rows]
    tl.atomic_max(largest + zero, q_idx + zero)
    tl.atomic_max(largest + 1 + zero, kv_idx + zero)
    return score


@triton.jit
def _record_gradient_indices(ds, score_out, b, h, q_idx, kv_idx, args):
    largest = args[0]
    zero = q_idx * 0 + kv_idx * 0
    tl.atomic_max(largest + 2 + zero, q_idx + zero)
    tl.atomic_max(largest + 3 + zero, kv_idx + zero)
    return ds


class IndexProbe:
    """``score_mod`` for the kernels; ``seen()`` is ``{"score": (q, kv), "gradient": (q, kv)}``, the
    largest indices seen (-1 where nothing ran)."""

    def __init__(self, device="cpu"):
        self.largest = torch.full((4,), -1, dtype=torch.int32, device=device)
        self.score_mod = K.custom_score(_record_indices_dev, lambda s, b, h, q, kv, largest: s, (self.largest,),
                                        name="index_probe")

    def seen(self) -> dict:
        q, kv, grad_q, grad_kv = self.largest.tolist()
        return {"score": (q, kv), "gradient": (grad_q, grad_kv)}

    @contextlib.contextmanager
    def gradient_rule(self):
        """Register the probe's gradient rule (the identity, recording its indices) while in the block."""
        scores_module.SCORE_GRADIENTS[self.score_mod.device_fn] = _record_gradient_indices
        try:
            yield
        finally:
            del scores_module.SCORE_GRADIENTS[self.score_mod.device_fn]
