"""``attention_backward``: check a call once, tune it, and run it; a repeated call replays."""
from __future__ import annotations

import torch

from .._call import BlockMasks, call_key, checked_modifiers, softmax_scale
from .._inputs import check_block_mask, contiguous_rows
from .._runtime.launch import LRUCache
from .._runtime.tma import tma_compatible
from ..block_mask import BlockMask
from ..masks import MaskMod
from ..scores import ScoreMod, score_gradient
from .configs import BwdConfig, choose_dq_mode, fits
from .gluon_launch import gluon_problem
from .launch import Buffers, run
from .tuner import tune


def attention_backward(q, k, v, out, lse, dout, *, dlse=None, mask_mod: MaskMod | None = None,
                       score_mod: ScoreMod | None = None, block_mask: BlockMask | None = None,
                       scale: float | None = None, enable_gqa: bool = False, dq_mode: str = "auto",
                       config: BwdConfig | None = None):
    """Gradients ``(dq, dk, dv)`` of :func:`tritonpatch.kernels.attention` given its ``out`` and
    natural-log ``lse`` and the output gradient ``dout`` (``dlse``: optional gradient of ``lse``).

    ``dq_mode``: ``"atomic"``, ``"separate"`` (deterministic) or ``"auto"`` (the faster, timed per
    shape; see :func:`.configs.choose_dq_mode`).
    ``config``: fixed :class:`.configs.BwdConfig` (None tunes once per shape; its ``dq_add`` picks how
    the atomic mode adds dQ, :mod:`.dq_adds`).

    As in the forward, a call with the key of an earlier one skips the checks and the tuner lookup
    and replays the earlier call's launches with its own tensors."""
    key = backward_call_key(q, k, v, out, lse, dout, dlse, mask_mod, score_mod, block_mask, scale, enable_gqa,
                            dq_mode, config)
    resolved = resolved_calls.get(key) if key is not None else None
    if resolved is None:
        resolved = _resolve(q, k, v, out, lse, dout, dlse, mask_mod, score_mod, block_mask, scale, enable_gqa,
                            dq_mode, config, key)
        if key is not None:
            resolved_calls.put(key, resolved)
    config, masks_for, mask_mod, scale = resolved
    buffers = _buffers(q, k, v, out, dout, lse, dlse, mask_mod, score_mod, scale, masks_for, key)
    dq = run(buffers, config)
    return dq, buffers.dk, buffers.dv


resolved_calls = LRUCache(64)   # replay key -> (config, masks_for, mask_mod, scale) of a checked call


def backward_call_key(q, k, v, out, lse, dout, dlse, mask_mod, score_mod, block_mask, scale, enable_gqa, dq_mode,
                      config):
    """The replay key of a backward call (:func:`.._call.call_key`); None where the checks would reject
    the arguments or where the call copies an input (a replay would pass the copy it recorded)."""
    tensors = (q, k, v, out, lse, dout, dlse)
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v, out, lse, dout)):
        return None
    if any(t.stride(-1) != 1 for t in (q, k, v, out, dout)) or not lse.is_contiguous() \
            or (isinstance(dlse, torch.Tensor) and not dlse.is_contiguous()):
        return None
    return call_key(tensors, mask_mod, score_mod, block_mask, scale, enable_gqa, dq_mode, config,
                    torch.are_deterministic_algorithms_enabled())


def _buffers(q, k, v, out, dout, lse, dlse, mask_mod, score_mod, scale, masks_for, key) -> Buffers:
    """The call's :class:`.launch.Buffers` over its inputs (last dims made contiguous)."""
    q, k, v, out, dout = (contiguous_rows(t) for t in (q, k, v, out, dout))
    return Buffers(q, k, v, out, dout, lse.contiguous(), dlse.contiguous() if dlse is not None else None,
                   mask_mod, score_mod, scale, masks_for, plan_key=key)


def _resolve(q, k, v, out, lse, dout, dlse, mask_mod, score_mod, block_mask, scale, enable_gqa, dq_mode, config,
             key=None):
    """Check a backward call and settle what it runs: ``(config, masks_for, mask_mod, scale)``;
    ``masks_for(kernel_config)`` keeps the block masks it builds. ``key``: the call's replay key (the
    tuner times replayed launches, as the forward's)."""
    what = "attention backward"
    if config is not None and not isinstance(config, BwdConfig):
        raise TypeError(f"{what}: config must be a BwdConfig or None (tuned), got {type(config).__name__}")
    mask_mod = checked_modifiers(q, k, v, mask_mod, score_mod, block_mask, enable_gqa, what)
    score_gradient(score_mod)   # rejects a score_mod without a gradient rule before any work
    batch, heads, q_len, head_dim = q.shape
    for name, t, shape in (("out", out, q.shape), ("dout", dout, q.shape)):
        if tuple(t.shape) != tuple(q.shape) or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{what}: {name} must match q ({tuple(shape)}, {q.dtype}, {q.device}); "
                             f"got {tuple(t.shape)}, {t.dtype}, {t.device}")
    for name, t in (("lse", lse), ("dlse", dlse)):
        if t is not None and (tuple(t.shape) != (batch, heads, q_len) or t.dtype != torch.float32):
            raise ValueError(f"{what}: {name} must be float32 of shape {(batch, heads, q_len)}, got "
                             f"{t.dtype} {tuple(t.shape)}")
    if block_mask is not None:
        check_block_mask(block_mask, batch, heads, q_len, k.shape[2], what)
        for kernel_config in (config.dkdv, config.dq) if config is not None else ():
            if kernel_config is not None and not fits(kernel_config, block_mask):
                raise ValueError(f"{what}: config {kernel_config.label()} does not fit the block_mask's "
                                 f"{block_mask.block_m} x {block_mask.block_n} tiles: each tile size must divide "
                                 "the mask's; pick such a config or config=None to tune")
    if config is not None and config.dq_mode == "atomic" and torch.are_deterministic_algorithms_enabled():
        choose_dq_mode("atomic")   # raises the determinism error
    uses_tma = config is not None and any(c is not None and c.use_tma for c in (config.dkdv, config.dq))
    if uses_tma and not tma_compatible(*(contiguous_rows(t) for t in (q, k, v, dout))):
        raise ValueError(f"{what}: config {config.label()} loads tiles through TMA, which needs "
                         "16-byte aligned base addresses and strides; use a config without use_tma")
    if config is not None and config.dkdv.gluon:
        problem = gluon_problem(*(contiguous_rows(t) for t in (q, k, v, dout)), mask_mod, score_mod)
        if problem:
            raise ValueError(f"{what}: config {config.label()}: the Gluon dK/dV kernel {problem}")
    scale = softmax_scale(scale, head_dim)
    masks_for = BlockMasks(block_mask, mask_mod, q, k)
    if config is None:
        buffers = _buffers(q, k, v, out, dout, lse, dlse, mask_mod, score_mod, scale, masks_for, key)
        config = tune(buffers, block_mask, choose_dq_mode(dq_mode))   # times replayed launches
    return config, masks_for, mask_mod, scale
