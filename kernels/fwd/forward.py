"""``attention_forward``: check a call once, tune it, and launch it; a repeated call replays."""
from __future__ import annotations

import torch

from .._call import BlockMasks, call_key, checked_modifiers, softmax_scale
from .._inputs import check_block_mask, check_block_mask_source
from .._runtime.launch import LRUCache, check_device
from ..block_mask import BlockMask
from ..masks import MaskMod
from ..scores import ScoreMod
from .configs import FwdConfig, warp_specialize_problem
from .gluon_launch import gluon_problem
from .launch import launch
from .tuner import tune


resolved_calls = LRUCache(64)   # replay key -> (config, block mask, mask_mod, scale) of a checked call


def attention_forward(q, k, v, *, mask_mod: MaskMod | None = None, score_mod: ScoreMod | None = None,
                      block_mask: BlockMask | None = None, scale: float | None = None, enable_gqa: bool = False,
                      config: FwdConfig | None = None):
    """Run the forward kernel; returns ``(out, lse)``. ``config=None`` tunes (once per shape).

    A call with the key of an earlier one (same shapes, strides, alignment, modifiers, options;
    :func:`forward_call_key`) skips the checks, the tuner lookup and the argument building: it replays
    the earlier call's launch with its own tensors."""
    check_block_mask_source(block_mask, mask_mod, "attention")
    key = forward_call_key(q, k, v, mask_mod, score_mod, block_mask, scale, enable_gqa, config)
    resolved = resolved_calls.get(key) if key is not None else None
    if resolved is None:
        resolved = _resolve(q, k, v, mask_mod, score_mod, block_mask, scale, enable_gqa, config, key)
        if key is not None:
            resolved_calls.put(key, resolved)
    config, masks, mask_mod, scale = resolved
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    launch(q, k, v, out, lse, masks, mask_mod, score_mod, scale, config, plan_key=key)
    return out, lse


def forward_call_key(q, k, v, mask_mod, score_mod, block_mask, scale, enable_gqa, config):
    """The replay key of a forward call (:func:`.._call.call_key`); None for arguments the checks would
    reject."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return None
    return call_key((q, k, v), mask_mod, score_mod, block_mask, scale, enable_gqa, config)


def _resolve(q, k, v, mask_mod, score_mod, block_mask, scale, enable_gqa, config, key=None):
    """Check a forward call and settle what it runs: ``(config, block mask, mask_mod, scale)``.
    ``key``: the call's replay key (the tuner times replayed launches)."""
    if config is not None and not isinstance(config, FwdConfig):
        raise TypeError(f"attention: config must be a FwdConfig or None (tuned), got {type(config).__name__}")
    mask_mod = checked_modifiers(q, k, v, mask_mod, score_mod, block_mask, enable_gqa, "attention")
    batch, heads, q_len, head_dim = q.shape
    if block_mask is not None:
        check_block_mask(block_mask, batch, heads, q_len, k.shape[2], "attention")
    scale = softmax_scale(scale, head_dim)
    check_device(q, "attention")
    masks_for = BlockMasks(block_mask, mask_mod, q, k)
    if config is None:
        config = tune(q, k, v, mask_mod, score_mod, block_mask, scale, masks_for, key)
    elif config.warp_specialize and (problem := warp_specialize_problem(q, k, v, mask_mod, score_mod, block_mask,
                                                                        config.split)):
        raise ValueError(f"config {config.label()}: the warp-specialized kernel {problem}")
    elif config.gluon and (problem := gluon_problem(q, k, v, mask_mod, score_mod)):
        raise ValueError(f"config {config.label()}: the Gluon kernel {problem}")
    elif block_mask is not None and (config.block_m, config.block_n) != (block_mask.block_m, block_mask.block_n):
        raise ValueError(f"config {config.label()} does not match block_mask tiles "
                         f"({block_mask.block_m}, {block_mask.block_n})")
    return config, masks_for(config), mask_mod, scale
