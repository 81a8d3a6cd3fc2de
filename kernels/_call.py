"""One resolution of an attention call, shared by forward and backward: the replay key that lets a
repeated call skip the checks, the modifier checks, the default scale, and the block masks a call
builds per tile size.

A call whose key matches an earlier one replays that call's launches with its own tensors
(:class:`._runtime.launch.LaunchPlans`); every other call goes through :func:`checked_modifiers`
and the direction's own checks first."""
from __future__ import annotations

import math

import torch

from ._identity import launch_key
from ._inputs import validate_inputs
from ._runtime.launch import replay_key
from .block_mask import BlockMask, build_block_mask
from . import masks, scores
from .masks import MaskMod, allow_all
from .scores import ScoreMod


def call_key(tensors: tuple, mask_mod, score_mod, block_mask, *options):
    """The replay key of a call over ``tensors`` (None entries allowed) with these modifiers and
    options (:func:`._runtime.launch.replay_key`); None for arguments the checks would reject, so
    that they reach the checks."""
    if not (all(isinstance(t, torch.Tensor) for t in tensors if t is not None)
            and isinstance(tensors[0], torch.Tensor) and isinstance(mask_mod, (MaskMod, type(None)))
            and isinstance(score_mod, (ScoreMod, type(None))) and isinstance(block_mask, (BlockMask, type(None)))):
        return None
    return replay_key(tensors, launch_key(mask_mod), launch_key(score_mod),
                      None if block_mask is None else block_mask.launch_key(), *options)


def uncalled_factory(value, module) -> str:
    """The end of a modifier error when ``value`` is one of ``module``'s factories passed without calling it
    (``mask_mod=causal``): what to pass instead; empty otherwise."""
    name = getattr(value, "__name__", None)
    if name and getattr(module, name, None) is value:
        return f"; {name} is the factory: pass {name}(...)"
    return ""


def checked_modifiers(q, k, v, mask_mod, score_mod, block_mask, enable_gqa: bool, what: str) -> MaskMod:
    """Check the inputs and the modifiers of a call (``what`` names it in errors) and return the mask
    it runs (``allow_all()`` for None). A ``block_mask`` needs its ``mask_mod``: the kernels evaluate the
    mask in the tiles it lists as partial, and without one they would run those tiles unmasked."""
    if block_mask is not None and mask_mod is None:
        raise ValueError(f"{what}: block_mask given without mask_mod; pass the mask_mod it was built from (the "
                         "kernels apply it in the block mask's partial tiles), or allow_all() to run them unmasked")
    if mask_mod is not None and not isinstance(mask_mod, MaskMod):
        raise TypeError(f"{what}: mask_mod must come from tritonpatch.kernels masks (causal(), prefix_lm(), ..., "
                        f"custom_mask()){uncalled_factory(mask_mod, masks)}")
    if score_mod is not None and not isinstance(score_mod, ScoreMod):
        raise TypeError(f"{what}: score_mod must come from tritonpatch.kernels (alibi(), softcap(), custom_score())"
                        f"{uncalled_factory(score_mod, scores)}")
    validate_inputs(q, k, v, enable_gqa)
    batch, heads, q_len, _ = q.shape
    mask_mod = allow_all() if mask_mod is None else mask_mod
    for modifier in (mask_mod, score_mod):
        if modifier is not None:
            modifier.check_problem(batch, heads, q_len, k.shape[2], q.device)
    return mask_mod


def softmax_scale(scale, head_dim: int) -> float:
    """The score scale of a call: ``1/sqrt(D)`` unless given; a positive finite number (the kernels keep
    masked scores at -inf before scaling, which a zero or negative scale would turn into NaN or +inf)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, (str, bytes, bool)):      # float() would read "0.5" and True without a word
        raise TypeError(f"attention: scale must be a number such as 0.125, got {type(scale).__name__} {scale!r}")
    value = float(scale)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"attention: scale must be a positive finite number, got {scale!r}; to scale scores by a zero or "
                         "negative factor, multiply q by it and pass scale=1.0")
    return value


class BlockMasks:
    """The block masks one call runs with, per kernel tile size: the caller's ``block_mask`` if it
    gave one, else ``mask_mod``'s for that tile size (built once; :func:`.block_mask.build_block_mask`
    also caches across calls)."""

    def __init__(self, block_mask: BlockMask | None, mask_mod: MaskMod, q: torch.Tensor, k: torch.Tensor):
        self.block_mask, self.mask_mod = block_mask, mask_mod
        self.batch, self.heads, self.q_len = q.shape[:3]
        self.kv_len, self.device = k.shape[2], q.device
        self._built: dict = {}

    def __call__(self, config) -> BlockMask:
        """The block mask for a kernel config's ``(block_m, block_n)`` tiles."""
        if self.block_mask is not None:
            return self.block_mask
        tiles = (config.block_m, config.block_n)
        if tiles not in self._built:
            self._built[tiles] = build_block_mask(self.mask_mod, self.batch, self.heads, self.q_len, self.kv_len,
                                                  block_m=tiles[0], block_n=tiles[1], device=self.device)
        return self._built[tiles]
