"""Autograd for :func:`tritonpatch.kernels.attention`: forward kernel + backward kernels.

:func:`attention_with_grad` has the signature of ``attention`` plus ``dq_mode``; when an input
requires grad it runs through :class:`AttentionFunction`, which saves ``(q, k, v, out, lse)`` and
calls :func:`tritonpatch.kernels.bwd.attention_backward`. A ``score_mod`` without a
gradient rule is rejected when the forward is called, not when backward runs.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._modifiers import lookup_modifier, tensor_arguments, with_tensor_arguments
from .block_mask import BlockMask, block_mask_from_tensors, from_flex_block_mask
from .bwd import attention_backward, check_dq_mode, choose_dq_mode
from .fwd import attention_forward
from .scores import score_gradient


class AttentionFunction(torch.autograd.Function):
    """``(out, lse) = attention(q, k, v)``; gradients flow to q, k, v from both outputs."""

    @staticmethod
    def forward(ctx, q, k, v, mask_mod, score_mod, block_mask, scale, enable_gqa, dq_mode):
        out, lse = attention_forward(q, k, v, mask_mod=mask_mod, score_mod=score_mod, block_mask=block_mask,
                                     scale=scale, enable_gqa=enable_gqa)
        # The modifiers' and the block mask's tensors are saved too, so that torch raises in backward when
        # one was written in place after the forward (the gradients would be of another mask or bias).
        ctx.save_for_backward(q, k, v, out, lse, *_argument_tensors(mask_mod, score_mod, block_mask))
        ctx.modifiers = (mask_mod, score_mod, block_mask)
        ctx.options = (scale, enable_gqa, dq_mode)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable   # a double backward raises instead of dropping its terms
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors[:5]
        mask_mod, score_mod, block_mask = ctx.modifiers
        scale, enable_gqa, dq_mode = ctx.options
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = attention_backward(q, k, v, out, lse, dout, dlse=dlse, mask_mod=mask_mod, score_mod=score_mod,
                                        block_mask=block_mask, scale=scale, enable_gqa=enable_gqa, dq_mode=dq_mode)
        return dq, dk, dv, None, None, None, None, None, None


def _argument_tensors(mask_mod, score_mod, block_mask) -> list:
    """The tensors the kernels read besides q, k, v: the modifiers' tensor arguments (as the custom ops take
    them) and the block-mask indices (inference tensors left out: autograd cannot save them)."""
    indices = () if block_mask is None else (block_mask.kv_num_blocks, block_mask.kv_indices,
                                             block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    return tensor_arguments(mask_mod, score_mod) + [t for t in indices if t is not None and not t.is_inference()]


def refuse_argument_gradients(mask_mod, score_mod) -> None:
    """Raise when grad mode is on and a modifier's tensor argument requires grad (``alibi`` slopes made
    a learnable parameter): the backward computes gradients for q, k and v only, so such a tensor would
    be left with ``.grad`` None and the training would not notice."""
    if not torch.is_grad_enabled():
        return
    for modifier in (mask_mod, score_mod):
        for arg in getattr(modifier, "args", ()):
            if isinstance(arg, torch.Tensor) and arg.requires_grad:
                raise NotImplementedError(
                    f"attention: a tensor argument of {modifier.name!r} requires grad, but the backward computes "
                    "gradients for q, k and v only (none for modifier arguments such as alibi slopes); make the "
                    "modifier from a detached tensor (e.g. alibi(slopes.detach())), or use a reference "
                    "implementation where that gradient is needed")


def attention_with_grad(q, k, v, *, mask_mod=None, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                        return_lse=False, dq_mode: str = "auto"):
    """:func:`tritonpatch.kernels.attention` with a backward. ``dq_mode``: ``"atomic"`` (dQ by fp32
    atomics in the dK/dV kernel), ``"separate"`` (a dQ kernel; deterministic) or ``"auto"`` (the
    faster of the two, timed on the first call per shape); ``torch.use_deterministic_algorithms(True)``
    makes ``"auto"`` mean ``"separate"``."""
    if block_mask is not None and not isinstance(block_mask, BlockMask):
        block_mask = from_flex_block_mask(block_mask)
    refuse_argument_gradients(mask_mod, score_mod)
    check_dq_mode(dq_mode)                             # also when nothing needs grad: a typo fails at once
    needs_grad = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v))
    if needs_grad:
        score_gradient(score_mod)                      # clear error now, not in backward
        choose_dq_mode(dq_mode)                        # validates dq_mode / determinism now
        out, lse = AttentionFunction.apply(q, k, v, mask_mod, score_mod, block_mask, scale, enable_gqa, dq_mode)
    else:
        out, lse = attention_forward(q, k, v, mask_mod=mask_mod, score_mod=score_mod, block_mask=block_mask,
                                     scale=scale, enable_gqa=enable_gqa)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# torch.library: the backward op and the autograd rule of ``tritonpatch::attention_fwd``, so that
# graphs compiled with torch.compile (which call the forward op) can be differentiated.
# ---------------------------------------------------------------------------------------------

@torch.library.custom_op("tritonpatch::attention_bwd", mutates_args=())
def _attention_bwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                      dout: torch.Tensor, dlse: Optional[torch.Tensor], kv_num_blocks: Optional[torch.Tensor],
                      kv_indices: Optional[torch.Tensor], full_kv_num_blocks: Optional[torch.Tensor],
                      full_kv_indices: Optional[torch.Tensor], block_geometry: list[int], mask_key: str,
                      score_key: str, modifier_tensors: list[torch.Tensor], scale: Optional[float], enable_gqa: bool,
                      dq_mode: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    block_mask = block_mask_from_tensors(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
                                          block_geometry)
    mask_mod, score_mod = with_tensor_arguments((lookup_modifier(mask_key), lookup_modifier(score_key)),
                                                modifier_tensors)
    return attention_backward(q, k, v, out, lse, dout, dlse=dlse, mask_mod=mask_mod, score_mod=score_mod,
                              block_mask=block_mask, scale=scale, enable_gqa=enable_gqa, dq_mode=dq_mode)


@_attention_bwd_op.register_fake
def _attention_bwd_fake(q, k, v, out, lse, dout, dlse, kv_num_blocks, kv_indices, full_kv_num_blocks,
                        full_kv_indices, block_geometry, mask_key, score_key, modifier_tensors, scale, enable_gqa,
                        dq_mode):
    contiguous = torch.contiguous_format   # the layout the backward allocates its gradients in
    return (torch.empty_like(q, memory_format=contiguous), torch.empty_like(k, memory_format=contiguous),
            torch.empty_like(v, memory_format=contiguous))


_FWD_OP_ARGS = ("q", "k", "v", "kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                "block_geometry", "mask_key", "score_key", "modifier_tensors", "scale", "enable_gqa", "dq_mode")


def _setup_context(ctx, inputs, output):
    named = dict(zip(_FWD_OP_ARGS, inputs))
    out, lse = output
    # the modifiers' tensors are saved like the block mask's: a write to one before backward raises
    ctx.save_for_backward(named["q"], named["k"], named["v"], out, lse, named["kv_num_blocks"],
                          named["kv_indices"], named["full_kv_num_blocks"], named["full_kv_indices"],
                          *named["modifier_tensors"])
    ctx.plain = (named["block_geometry"], named["mask_key"], named["score_key"], named["scale"], named["enable_gqa"],
                 named.get("dq_mode", "auto"))


def _fwd_op_backward(ctx, dout, dlse):
    q, k, v, out, lse, *rest = ctx.saved_tensors
    mask_tensors, modifier_tensors = rest[:4], rest[4:]
    block_geometry, mask_key, score_key, scale, enable_gqa, dq_mode = ctx.plain
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = torch.ops.tritonpatch.attention_bwd(q, k, v, out, lse, dout, dlse, *mask_tensors, block_geometry,
                                                     mask_key, score_key, list(modifier_tensors), scale, enable_gqa,
                                                     dq_mode)
    no_grads = {name: None for name in _FWD_OP_ARGS[3:len(ctx.needs_input_grad)]}
    no_grads["modifier_tensors"] = [None] * len(modifier_tensors)   # the structure of the op's inputs
    return (dq, dk, dv, *no_grads.values())


def register_custom_op_autograd() -> None:
    """Give ``torch.ops.tritonpatch.attention_fwd`` its backward (idempotent; call after the forward
    op is defined, i.e. at the end of ``tritonpatch/kernels/api.py``). Inside compiled graphs the
    forward op carries the call's ``dq_mode`` to the backward op."""
    op = torch.ops.tritonpatch.attention_fwd.default
    if getattr(register_custom_op_autograd, "_done", False):
        return
    torch.library.register_autograd(op, _fwd_op_backward, setup_context=_setup_context)
    register_custom_op_autograd._done = True
