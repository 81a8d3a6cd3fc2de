"""The backward's tuner: per shape and dq mode the fastest dK/dV (and dQ) configs, ``"auto"`` the
faster mode end to end; decisions kept in memory and (for the shipped modifiers) on disk."""
from __future__ import annotations

import torch

from .._runtime import tuning_cache
from .._runtime.launch import fastest, interpreting, parallel_compiles
from .._runtime.tma import tma_compatible
from ..block_mask import BlockMask
from ..masks import MaskMod, allow_all
from ..scores import ScoreMod
from .configs import BwdConfig, candidate_configs, fitting, gluon_candidates
from .dq_adds import ATOMIC_ADD
from .kernels import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel, _preprocess_kernel
from .launch import Buffers, launch_preprocess, run

_tuned: dict = {}   # tuning_key -> the winning BwdConfig


def tuned_configs() -> dict:
    """The winning backward configs per tuning key so far (for benchmarks and reports)."""
    return dict(_tuned)


def tuning_key(q, k, mask_mod, score_mod, block_mask, dq_mode, tma_ok: bool) -> tuple:
    """What the tuner's decision depends on (a key of :func:`tuned_configs`)."""
    return (tuple(q.shape), tuple(k.shape), q.dtype, str(q.device), tma_ok, mask_mod.structure,
            None if score_mod is None else score_mod.name,
            None if block_mask is None else (block_mask.block_m, block_mask.block_n), dq_mode)


def tuned_config(q, k, *, v=None, dout=None, mask_mod: MaskMod | None = None, score_mod: ScoreMod | None = None,
                 block_mask: BlockMask | None = None, dq_mode: str = "atomic") -> BwdConfig | None:
    """The config the tuner picked for these inputs and (resolved) ``dq_mode``; None before the first call.
    ``v``, ``dout``: needed only when they may not be TMA-compatible while ``q``, ``k`` are."""
    mask_mod = allow_all() if mask_mod is None else mask_mod
    tma_ok = tma_compatible(*(t for t in (q, k, v, dout) if t is not None))
    return _tuned.get(tuning_key(q, k, mask_mod, score_mod, block_mask, dq_mode, tma_ok))


def tune(buf: Buffers, block_mask, dq_mode: str, precompile: bool = True) -> BwdConfig:
    """The fastest config for this shape and ``dq_mode``; for ``"auto"`` the faster of the tuned
    atomic and separate configs, timed end to end (the interpreter, which times nothing, takes
    separate). Cached per tuning key, in memory and (for the shipped modifiers) on disk.
    ``precompile=False``: the caller has compiled the candidates already ("auto", for both modes)."""
    key = tuning_key(buf.q, buf.k, buf.mask_mod, buf.score_mod, block_mask, dq_mode, buf.tma_ok)
    if key in _tuned:
        return _tuned[key]
    disk_key = None if interpreting() else tuning_cache.tuning_key(
        "attention_bwd", buf.q, buf.k, buf.mask_mod, buf.score_mod, block_mask, dq_mode=dq_mode, tma=buf.tma_ok,
        code=_kernels_code(buf))
    config = _stored_config(tuning_cache.lookup(disk_key), buf, block_mask)
    if config is None:
        if precompile:
            _compile_candidates(buf, block_mask, ("separate", "atomic") if dq_mode == "auto" else (dq_mode,))
        if dq_mode == "auto":
            configs = [tune(buf, block_mask, mode, precompile=False) for mode in ("separate", "atomic")]
            config = fastest(configs, lambda c: run(buf, c), "attention backward")
        else:
            config = _tune_mode(buf, block_mask, dq_mode)
        tuning_cache.remember(disk_key, {"dq_mode": config.dq_mode, "dkdv": config.dkdv.label(),
                                         "dq": config.dq.label() if config.dq is not None else None})
    _tuned[key] = config
    return config


def _kernels_code(buf: Buffers) -> list:
    """The source hashes of the kernels the tuner may pick for ``buf`` (a decision is kept for this code only)."""
    code = [kernel.cache_key for kernel in (_attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel, _preprocess_kernel,
                                            ATOMIC_ADD.fn)]
    if buf.gluon_problem is None:
        from .gluon_kernel import _attn_bwd_dkdv_gluon_kernel   # imports Gluon, which only this kernel needs

        code.append(_attn_bwd_dkdv_gluon_kernel.cache_key)
    return code


def _stored_config(decision: dict | None, buf: Buffers, block_mask) -> BwdConfig | None:
    """A decision from the disk cache as a BwdConfig, if its configs are still candidates."""
    if not decision:
        return None
    dkdv = tuning_cache.by_label(candidates(buf, block_mask, "dkdv"), decision.get("dkdv"))
    if dkdv is None:
        return None
    if decision.get("dq_mode") == "atomic":
        return BwdConfig("atomic", dkdv)
    dq = tuning_cache.by_label(candidates(buf, block_mask, "dq"), decision.get("dq"))
    return BwdConfig("separate", dkdv, dq) if decision.get("dq_mode") == "separate" and dq is not None else None


def candidates(buf: Buffers, block_mask, kernel: str) -> list:
    """The configs the tuner times for ``kernel`` on these inputs: the head dim's (those with TMA only
    where the tensors allow it), plus for dK/dV the Gluon kernel's where it applies
    (:func:`.gluon_launch.gluon_problem`; with their disable-lsr variants), those whose tiles fit ``block_mask``."""
    configs = [c for c in candidate_configs(kernel, buf.q.shape[-1], buf.q.device) if buf.tma_ok or not c.use_tma]
    if kernel == "dkdv" and buf.gluon_problem is None:
        configs += gluon_candidates()
    return fitting(configs, block_mask)


def _compile_candidates(buf: Buffers, block_mask, dq_modes: tuple) -> None:
    """Compile every kernel the tuner is about to time for ``dq_modes``, in parallel."""
    if interpreting():
        return
    dq_acc = torch.empty(buf.q.shape, dtype=torch.float32, device=buf.q.device) if "atomic" in dq_modes else None
    with parallel_compiles():
        for mode in dq_modes:
            for config in candidates(buf, block_mask, "dkdv"):
                buf.dkdv(config, dq_acc if mode == "atomic" else None, ATOMIC_ADD if mode == "atomic" else None,
                         warmup=True)
        if "separate" in dq_modes:
            dq = torch.empty_like(buf.q, memory_format=torch.contiguous_format)
            for config in candidates(buf, block_mask, "dq"):
                buf.dq(config, dq, warmup=True)


def _tune_mode(buf: Buffers, block_mask, dq_mode: str) -> BwdConfig:
    dkdv_candidates = candidates(buf, block_mask, "dkdv")
    what = "attention backward"
    if dq_mode == "atomic":
        dq_acc = torch.zeros(buf.q.shape, dtype=torch.float32, device=buf.q.device)
        launch_preprocess(buf.out, buf.dout, buf.delta, buf.dlse, None)
        return BwdConfig("atomic", fastest(dkdv_candidates, lambda c: buf.dkdv(c, dq_acc, ATOMIC_ADD), what))
    dq = torch.empty_like(buf.q, memory_format=torch.contiguous_format)   # as run allocates it
    best_dq = fastest(candidates(buf, block_mask, "dq"), lambda c: buf.dq(c, dq), what)
    return BwdConfig("separate", fastest(dkdv_candidates, lambda c: buf.dkdv(c, None, None), what), best_dq)


def forget_tuned() -> None:
    """Drop the in-memory decisions (the disk cache stays): the tuner then starts as in a new process."""
    _tuned.clear()
