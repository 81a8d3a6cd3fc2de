"""Attention kernels built through the tritonpatch pipeline.

``attention(q, k, v, mask_mod=causal())`` runs a block-sparse Triton forward: the block mask of
``mask_mod`` (built once per shape and cached) tells the kernel which tiles are full (no mask work),
partial (mask evaluated) or empty (skipped). ``reference.attention`` is the pure-torch specification.
"""
from __future__ import annotations

import itertools

import torch

from . import reference
from .attention_fwd import FwdConfig, attention_forward, tuned_configs
from .block_mask import BlockMask, block_mask_from_classes, build_block_mask, from_flex_block_mask
from .masks import (MaskMod, ScoreMod, alibi, alibi_slopes, allow_all, and_masks, causal, document, or_masks,
                    prefix_lm, sliding_window, softcap)

__all__ = [
    "attention", "reference", "MaskMod", "ScoreMod", "causal", "prefix_lm", "sliding_window", "document",
    "and_masks", "or_masks", "allow_all", "alibi", "alibi_slopes", "softcap", "BlockMask", "build_block_mask",
    "block_mask_from_classes", "from_flex_block_mask", "FwdConfig", "tuned_configs",
]


def attention(q, k, v, *, mask_mod: MaskMod | None = None, score_mod: ScoreMod | None = None,
              block_mask=None, scale: float | None = None, enable_gqa: bool = False, return_lse: bool = False):
    """Scaled dot-product attention of ``q [B, H, Sq, D]`` over ``k, v [B, Hkv, Skv, D]``.

    * ``mask_mod``: a mask from this package (``causal()``, ``prefix_lm(P)``, ``sliding_window(W)``,
      ``document(ids)``, ``and_masks``/``or_masks`` of those); None = attend everywhere.
    * ``score_mod``: ``alibi(slopes)`` or ``softcap(c)``, applied to ``q·k * scale``.
    * ``block_mask``: a prebuilt :class:`BlockMask` (from :func:`build_block_mask`) or a FlexAttention
      ``BlockMask``; by default it is built from ``mask_mod`` and cached.
    * ``scale``: defaults to ``1/sqrt(D)``; ``enable_gqa``: Hkv may divide H (GQA/MQA).

    Tensors: float16/bfloat16 on CUDA (float32 too on CPU under ``TRITON_INTERPRET=1``), D in
    {16, 32, 64, 128}, any strides. Returns ``out`` (and the natural-log ``lse [B, H, Sq]`` in fp32
    when ``return_lse``). Inside ``torch.compile`` the call goes through the custom op
    ``torch.ops.tritonpatch.attention_fwd``.
    """
    if block_mask is not None and not isinstance(block_mask, BlockMask):
        block_mask = from_flex_block_mask(block_mask)
    if torch.compiler.is_compiling():
        key = _register_modifiers(mask_mod, score_mod, block_mask)
        out, lse = torch.ops.tritonpatch.attention_fwd(q, k, v, key, scale, enable_gqa)
    else:
        out, lse = attention_forward(q, k, v, mask_mod=mask_mod, score_mod=score_mod, block_mask=block_mask,
                                     scale=scale, enable_gqa=enable_gqa)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# torch.library custom op: modifiers are Python objects, so the op takes a registry key for them.
# ---------------------------------------------------------------------------------------------

_modifiers: dict = {}
_modifier_keys: dict = {}
_key_counter = itertools.count()


@torch.compiler.assume_constant_result
def _register_modifiers(mask_mod, score_mod, block_mask) -> str:
    """A string key for (mask_mod, score_mod, block_mask), stable for the same objects.

    Runs at trace time under torch.compile (its result is a graph constant). The registry keeps the
    objects alive: graphs compiled with them can run at any later time."""
    identity = (id(mask_mod), id(score_mod), id(block_mask))
    key = _modifier_keys.get(identity)
    if key is None:
        key = f"modifiers-{next(_key_counter)}"
        _modifier_keys[identity] = key
        _modifiers[key] = (mask_mod, score_mod, block_mask)
    return key


@torch.library.custom_op("tritonpatch::attention_fwd", mutates_args=())
def _attention_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, modifiers: str, scale: float | None,
                      enable_gqa: bool) -> tuple[torch.Tensor, torch.Tensor]:
    mask_mod, score_mod, block_mask = _modifiers[modifiers]
    return attention_forward(q, k, v, mask_mod=mask_mod, score_mod=score_mod, block_mask=block_mask,
                             scale=scale, enable_gqa=enable_gqa)


@_attention_fwd_op.register_fake
def _attention_fwd_fake(q, k, v, modifiers, scale, enable_gqa):
    return torch.empty_like(q), q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32)
