"""The arguments every backward kernel takes alike (the Triton-language ones and the Gluon one): the
tile lists with their strides, sizes, scales and the modifiers' run-time arguments, and the modifiers'
compile-time ones."""
from __future__ import annotations

import torch

from .._inputs import LOG2E
from ..masks import MaskMod
from ..scores import ScoreMod, score_gradient


def _expanded(num: torch.Tensor, ids: torch.Tensor, batch: int, heads: int):
    expand = (batch, heads, num.shape[-1])
    return num.expand(expand), ids.expand(expand + (ids.shape[-1],))


def tile_list_args(partial_num, partial_ids, full_num, full_ids, q, k, mask_mod, score_mod, scale) -> tuple:
    """The arguments both backward kernels take after their tensors' strides: the tile lists (expanded
    to ``[B, H, ...]``) and their strides, sizes, scales and the modifiers' runtime arguments."""
    batch, heads, q_len = q.shape[:3]
    kv_heads, kv_len = k.shape[1], k.shape[2]
    partial_num, partial_ids = _expanded(partial_num, partial_ids, batch, heads)
    full_num, full_ids = _expanded(full_num, full_ids, batch, heads)
    return (partial_num, partial_ids, full_num, full_ids,
            partial_num.stride(0), partial_num.stride(1), partial_ids.stride(0), partial_ids.stride(1),
            partial_ids.stride(2),
            heads, heads // kv_heads, q_len, kv_len, scale, scale * LOG2E,
            mask_mod.args, score_mod.args if score_mod is not None else ())


def modifier_constexprs(mask_mod: MaskMod, score_mod: ScoreMod | None) -> dict:
    """The modifiers' device functions (with the score_mod's gradient rule) as kernel constexprs."""
    return dict(MASK_FN=mask_mod.device_fn, SCORE_FN=score_mod.device_fn if score_mod is not None else None,
                SCORE_GRAD_FN=score_gradient(score_mod), HAS_SCORE=score_mod is not None)
