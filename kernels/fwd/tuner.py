"""The forward's tuner: the candidates for a call, timed on the first call per shape, the winner
kept in memory and (for the shipped modifiers) on disk."""
from __future__ import annotations

import torch

from .._runtime import tuning_cache
from .._runtime.launch import fastest, interpreting, parallel_compiles
from .._runtime.tma import tma_compatible
from ..masks import MaskMod
from .configs import (SPLIT_CONFIG, WARP_SPECIALIZED_CONFIG, FwdConfig, candidate_configs, gluon_candidates,
                      warp_specialize_problem)
from .gluon_launch import gluon_problem
from .kernels import _attn_fwd_kernel
from .launch import launch

_tuned: dict = {}   # tuning_key -> the winning FwdConfig


def tuning_key(q, k, v, mask_mod, score_mod, block_mask):
    """What the tuner's decision depends on: shapes, dtype, device, TMA fit, the mask's code, the score
    modifier and the block-mask tiles (a key of :func:`tuned_configs`)."""
    return (tuple(q.shape), tuple(k.shape), q.dtype, str(q.device), tma_compatible(q, k, v), mask_mod.structure,
            None if score_mod is None else score_mod.name,
            None if block_mask is None else (block_mask.block_m, block_mask.block_n))


def tuning_candidates(q, k, v, mask_mod: MaskMod, score_mod, block_mask, tma_ok: bool) -> list:
    """The configs the tuner times for this call: the head dim's candidates (those with TMA only when
    ``tma_ok``), the warp-specialized and Gluon ones where they apply, and only tiles matching
    ``block_mask``."""
    candidates = candidate_configs(q.shape[-1], q.device)
    if not tma_ok:
        candidates = [c for c in candidates if not c.use_tma]
    else:
        candidates += [ws for ws in (WARP_SPECIALIZED_CONFIG, SPLIT_CONFIG)
                       if warp_specialize_problem(q, k, v, mask_mod, score_mod, block_mask, ws.split) is None]
        if gluon_problem(q, k, v, mask_mod, score_mod) is None:
            candidates += gluon_candidates(q.shape[-1])
    if block_mask is not None:
        tiles = (block_mask.block_m, block_mask.block_n)
        matching = [c for c in candidates if (c.block_m, c.block_n) == tiles]
        if matching:
            return matching
        if not all(_power_of_two(size) for size in tiles):
            tuned = ", ".join(f"{m}x{n}" for m, n in sorted({(c.block_m, c.block_n) for c in candidates}))
            raise ValueError(f"attention: block_mask has {tiles[0]}x{tiles[1]} tiles; the forward runs one tile of "
                             f"the block mask per program, and its Triton-language kernel needs tiles whose sides "
                             f"are powers of two. Build the block mask with such tiles (tuned for this call: "
                             f"{tuned}; block_m=128, block_n=64 is build_block_mask's default)")
        candidates = [FwdConfig(*tiles, 8 if q.shape[-1] >= 128 else 4, 2)]
    return candidates


def _power_of_two(size: int) -> bool:
    return size > 0 and size & (size - 1) == 0


def tune(q, k, v, mask_mod, score_mod, block_mask, scale, masks_for, plan_key=None) -> FwdConfig:
    """The fastest candidate for this shape (cached in memory and on disk). With ``plan_key`` (the
    call's replay key) the candidates are timed on replayed launches, as later calls will run: on
    small problems a full launch costs more host time than the kernel runs."""
    key = tuning_key(q, k, v, mask_mod, score_mod, block_mask)
    if key in _tuned:
        return _tuned[key]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)   # scratch for the timed candidates
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    tma_ok = tma_compatible(q, k, v, out)
    candidates = tuning_candidates(q, k, v, mask_mod, score_mod, block_mask, tma_ok)
    if len(candidates) == 1 or interpreting():
        best = candidates[0]
    else:
        disk_key = tuning_cache.tuning_key("attention_fwd", q, k, mask_mod, score_mod, block_mask,
                                           tma=tma_ok, code=_kernels_code(candidates))
        best = tuning_cache.by_label(candidates, (tuning_cache.lookup(disk_key) or {}).get("config"))
        if best is None:
            def launch_config(cfg, warmup=False):
                return launch(q, k, v, out, lse, masks_for(cfg), mask_mod, score_mod, scale, cfg, warmup,
                              None if plan_key is None else (plan_key, cfg))

            with parallel_compiles():
                for cfg in candidates:
                    launch_config(cfg, warmup=True)
            best = fastest(candidates, launch_config, "attention")
            tuning_cache.remember(disk_key, {"config": best.label()})
    _tuned[key] = best
    return best


def _kernels_code(candidates: list) -> list:
    """The source hashes of the kernels among ``candidates`` (a decision is kept for this code only)."""
    code = [_attn_fwd_kernel.cache_key]
    if any(c.gluon for c in candidates):
        from .gluon_kernel import _attn_fwd_gluon_kernel   # imports Gluon, which only this kernel needs

        code.append(_attn_fwd_gluon_kernel.cache_key)
    return code


def tuned_configs() -> dict:
    """The winning config per tuning key so far (for benchmarks and reports)."""
    return dict(_tuned)


def forget_tuned() -> None:
    """Drop the in-memory decisions (the disk cache stays): the tuner then starts as in a new process."""
    _tuned.clear()
