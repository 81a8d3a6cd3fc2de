"""The attention entry point and the custom op ``tritonpatch::attention_fwd`` that ``torch.compile``
graphs call (its backward op and autograd rule: :mod:`.autograd`)."""
from __future__ import annotations

from typing import Optional

import torch

from .autograd import attention_with_grad, refuse_argument_gradients, register_custom_op_autograd
from .bwd import check_dq_mode
from .block_mask import BlockMask, block_mask_from_tensors, block_mask_to_tensors, from_flex_block_mask
from .fwd import attention_forward
from ._modifiers import lookup_modifier, tensor_arguments, uncached, with_tensor_arguments
from .masks import MaskMod
from .scores import ScoreMod, score_gradient


def attention(q, k, v, *, mask_mod: MaskMod | None = None, score_mod: ScoreMod | None = None,
              block_mask=None, scale: float | None = None, enable_gqa: bool = False, return_lse: bool = False,
              dq_mode: str = "auto"):
    """Scaled dot-product attention of ``q [B, H, Sq, D]`` over ``k, v [B, Hkv, Skv, D]``.

    * ``mask_mod``: a mask from this package (``causal()``, ``prefix_lm(P)``, ``sliding_window(W)``,
      ``document(ids)``, ``and_masks``/``or_masks`` of those); None = attend everywhere.
    * ``score_mod``: ``alibi(slopes)`` or ``softcap(c)``, applied to ``q·k * scale``.
    * ``block_mask``: a prebuilt :class:`BlockMask` (from :func:`build_block_mask`) or a FlexAttention
      ``BlockMask``; by default it is built from ``mask_mod`` and cached.
    * ``scale``: defaults to ``1/sqrt(D)``; ``enable_gqa``: Hkv may divide H (GQA/MQA).

    Tensors: float16/bfloat16 on CUDA (float32 too on CPU under ``TRITON_INTERPRET=1``), D in
    {16, 32, 64, 128}, any strides. Returns ``out`` (and the natural-log ``lse [B, H, Sq]`` in fp32
    when ``return_lse``). Differentiable: ``dq_mode`` picks how the backward accumulates dQ —
    ``"atomic"`` (fp32 atomics in the dK/dV kernel), ``"separate"`` (a dQ kernel, bitwise
    deterministic) or ``"auto"`` (the faster, timed once per shape; ``"separate"`` under
    ``torch.use_deterministic_algorithms(True)``). Inside ``torch.compile`` the call goes through the
    custom ops ``tritonpatch::attention_fwd`` / ``tritonpatch::attention_bwd``.
    """
    if block_mask is not None and not isinstance(block_mask, BlockMask):
        block_mask = from_flex_block_mask(block_mask)
    if torch.compiler.is_compiling():
        refuse_argument_gradients(mask_mod, score_mod)   # the same call-time errors as eager mode
        check_dq_mode(dq_mode)
        if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v)):
            score_gradient(score_mod)
        out, lse = torch.ops.tritonpatch.attention_fwd(
            q, k, v, *block_mask_to_tensors(block_mask), "" if mask_mod is None else mask_mod.op_key,
            "" if score_mod is None else score_mod.op_key, tensor_arguments(mask_mod, score_mod), scale, enable_gqa,
            dq_mode)
    else:
        out, lse = attention_with_grad(q, k, v, mask_mod=mask_mod, score_mod=score_mod, block_mask=block_mask,
                                       scale=scale, enable_gqa=enable_gqa, return_lse=True, dq_mode=dq_mode)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# torch.library custom op. Graph inputs are tensors and plain values: the block mask travels as its
# index tensors, the modifiers (Python objects with device functions) by their registry key plus their
# tensor arguments, which the op binds in place of the ones the modifiers hold (with_tensor_arguments).
# ---------------------------------------------------------------------------------------------

@torch.library.custom_op("tritonpatch::attention_fwd", mutates_args=())
def _attention_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_num_blocks: Optional[torch.Tensor],
                      kv_indices: Optional[torch.Tensor], full_kv_num_blocks: Optional[torch.Tensor],
                      full_kv_indices: Optional[torch.Tensor], block_geometry: list[int], mask_key: str,
                      score_key: str, modifier_tensors: list[torch.Tensor], scale: Optional[float],
                      enable_gqa: bool, dq_mode: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    block_mask = block_mask_from_tensors(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
                                         block_geometry)
    mask_mod, score_mod = with_tensor_arguments((lookup_modifier(mask_key), lookup_modifier(score_key)),
                                                modifier_tensors)
    if block_mask is None:
        mask_mod = uncached(mask_mod)   # its tiles are classified from its tensors' contents on every call
    return attention_forward(q, k, v, mask_mod=mask_mod, score_mod=score_mod, block_mask=block_mask, scale=scale,
                             enable_gqa=enable_gqa)


@_attention_fwd_op.register_fake
def _attention_fwd_fake(q, k, v, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, block_geometry,
                        mask_key, score_key, modifier_tensors, scale, enable_gqa, dq_mode="auto"):
    # the layout attention_forward allocates its output in, whatever q's strides
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32))


register_custom_op_autograd()   # the forward op's autograd rule, now that the op exists
