"""Autograd for :func:`tritonpatch.kernels.attention`: forward kernel + backward kernels.

:func:`attention_with_grad` has the signature of ``attention`` plus ``dq_mode``; when an input
requires grad it runs through :class:`AttentionFunction`, which saves ``(q, k, v, out, lse)`` and
calls :func:`tritonpatch.kernels.attention_bwd.attention_backward`. A ``score_mod`` without a
gradient rule is rejected when the forward is called, not when backward runs.
"""
from __future__ import annotations

import torch

from .attention_bwd import attention_backward, choose_dq_mode, score_gradient
from .attention_fwd import attention_forward
from .block_mask import BlockMask, from_flex_block_mask


class AttentionFunction(torch.autograd.Function):
    """``(out, lse) = attention(q, k, v)``; gradients flow to q, k, v from both outputs."""

    @staticmethod
    def forward(ctx, q, k, v, mask_mod, score_mod, block_mask, scale, enable_gqa, dq_mode):
        out, lse = attention_forward(q, k, v, mask_mod=mask_mod, score_mod=score_mod, block_mask=block_mask,
                                     scale=scale, enable_gqa=enable_gqa)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.modifiers = (mask_mod, score_mod, block_mask)
        ctx.options = (scale, enable_gqa, dq_mode)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        mask_mod, score_mod, block_mask = ctx.modifiers
        scale, enable_gqa, dq_mode = ctx.options
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = attention_backward(q, k, v, out, lse, dout, dlse=dlse, mask_mod=mask_mod, score_mod=score_mod,
                                        block_mask=block_mask, scale=scale, enable_gqa=enable_gqa, dq_mode=dq_mode)
        return dq, dk, dv, None, None, None, None, None, None


def attention_with_grad(q, k, v, *, mask_mod=None, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                        return_lse=False, dq_mode: str = "auto"):
    """:func:`tritonpatch.kernels.attention` with a backward. ``dq_mode``: ``"atomic"`` (dQ by fp32
    atomics in the dK/dV kernel), ``"separate"`` (a dQ kernel; deterministic) or ``"auto"``;
    ``torch.use_deterministic_algorithms(True)`` makes ``"auto"`` mean ``"separate"``."""
    if block_mask is not None and not isinstance(block_mask, BlockMask):
        block_mask = from_flex_block_mask(block_mask)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if needs_grad:
        score_gradient(score_mod)                      # clear error now, not in backward
        choose_dq_mode(dq_mode, q.shape[2])            # validates dq_mode / determinism now
        out, lse = AttentionFunction.apply(q, k, v, mask_mod, score_mod, block_mask, scale, enable_gqa, dq_mode)
    else:
        out, lse = attention_forward(q, k, v, mask_mod=mask_mod, score_mod=score_mod, block_mask=block_mask,
                                     scale=scale, enable_gqa=enable_gqa)
    return (out, lse) if return_lse else out
