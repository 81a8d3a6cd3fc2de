"""Tuning decisions kept on disk, so that a new process reuses them instead of timing candidates again
(the kernels themselves then come from Triton's compile cache).

One small JSON file per decision under ``TRITONPATCH_TUNING_CACHE`` (default
``~/.cache/tritonpatch/tuning``; ``0``/``off`` keeps decisions in memory only), named by a hash of
the key: the tuner's own key (shapes, dtype, modifiers by factory name, the kernels' source hash) plus
the GPU, the Triton, torch and tritonpatch versions. Decisions made while other work shares the GPU
are stored all the same, so benchmarks and warm-up runs turn the cache off. A decision
names configs by label; the tuner uses it only if that label is still among its candidates, so a
changed candidate table never brings back a config it no longer offers. Files are written
atomically (temp file + rename); an unreadable file counts as a miss.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile

import torch
import triton

logger = logging.getLogger("tritonpatch")


def tuning_key(tuner: str, q, k, mask_mod, score_mod, block_mask, **extra) -> dict | None:
    """The process-independent part of a tuner's key, or None when a modifier's code has no stable
    name (``custom_mask``, ``custom_score``: such decisions stay in memory)."""
    mask = mask_mod.portable_key()
    score = None if score_mod is None else score_mod.portable_key()
    if mask is None or (score_mod is not None and score is None):
        return None
    tiles = None if block_mask is None else [block_mask.block_m, block_mask.block_n]
    return dict(tuner=tuner, q=list(q.shape), k=list(k.shape), dtype=str(q.dtype), device=str(q.device), mask=mask,
                score=score, block_mask=tiles, **extra)


def by_label(configs: list, label):
    """The config of ``configs`` whose label is ``label`` (None: not offered any more)."""
    return next((c for c in configs if c.label() == label), None)


def _path(folder: str, key: dict) -> str:
    from tritonpatch import __version__

    device = key.get("device", "")
    full = dict(key, triton=triton.__version__, torch=torch.__version__, tritonpatch=__version__,
                gpu=torch.cuda.get_device_name(device) if device.startswith("cuda") else device)
    digest = hashlib.sha256(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()[:32]
    return os.path.join(folder, f"{key.get('tuner', 'tuning')}-{digest}.json")


def lookup(key: dict | None) -> dict | None:
    """The decision stored for ``key`` (None: no key, no file, cache off, or unreadable)."""
    from tritonpatch import env

    folder = env.tuning_cache_dir()
    if key is None or folder is None:
        return None
    try:
        with open(_path(folder, key)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def remember(key: dict | None, decision: dict) -> None:
    """Store ``decision`` for ``key``. A cache that cannot be written only costs time later, so that
    is logged (debug), not raised."""
    from tritonpatch import env

    folder = env.tuning_cache_dir()
    if key is None or folder is None:
        return
    try:
        os.makedirs(folder, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    except OSError as exc:
        logger.debug("tuning cache %s not writable: %s", folder, exc)
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(decision, f)
        os.replace(temp, _path(folder, key))
    except OSError as exc:
        logger.debug("tuning cache %s not writable: %s", folder, exc)
        with contextlib.suppress(OSError):
            os.remove(temp)
