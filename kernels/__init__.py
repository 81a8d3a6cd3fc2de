"""Attention kernels built through the tritonpatch pipeline.

``attention(q, k, v, mask_mod=causal())`` runs a block-sparse Triton forward: the block mask of
``mask_mod`` (built once per shape and cached) tells the kernel which tiles are full (no mask work),
partial (mask evaluated) or empty (skipped). ``reference.attention`` is the pure-torch specification.
"""
from __future__ import annotations

from . import reference
from .api import attention
from .autograd import AttentionFunction, attention_with_grad
from .block_mask import (BlockMask, block_mask_from_classes, block_mask_from_tensors, block_mask_to_tensors,
                         build_block_mask, from_flex_block_mask)
from .bwd import attention_backward
from .fwd import FwdConfig, attention_forward, tuned_configs
from ._modifiers import lookup_modifier
from .masks import (MaskMod, allow_all, and_masks, causal, custom_mask, document, key_padding, or_masks, prefix_lm,
                    sliding_window)
from .scores import ScoreMod, alibi, alibi_slopes, custom_score, score_gradient, softcap

__all__ = [
    "attention", "reference", "MaskMod", "ScoreMod", "causal", "prefix_lm", "sliding_window", "document",
    "key_padding",
    "and_masks", "or_masks", "allow_all", "custom_mask", "custom_score", "alibi", "alibi_slopes", "softcap",
    "BlockMask", "build_block_mask", "block_mask_from_classes", "from_flex_block_mask", "FwdConfig", "tuned_configs",
    "attention_forward", "attention_backward", "attention_with_grad", "AttentionFunction", "block_mask_from_tensors",
    "block_mask_to_tensors", "lookup_modifier", "score_gradient",
]
