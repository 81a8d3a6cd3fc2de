"""Tuning decisions kept beyond the process, so that a new process, on this node or another, reuses them
instead of timing candidates again (the kernels themselves then come from Triton's compile cache).

A decision is stored under its full key: the tuner's own key (shapes, dtype, device type, modifiers
by factory name, the kernels' source hash) plus the GPU's name and the Triton, torch and tritonpatch
versions. Two places hold it:

- the local folder ``TRITONPATCH_TUNING_CACHE`` (default ``~/.cache/tritonpatch/tuning``): one small
  JSON file per decision, named by the key's digest, written atomically (temp file + rename);
- Triton's configured cache manager (``TRITON_CACHE_MANAGER``, e.g. its ``RemoteCacheManager`` on
  Redis; see ``tuning_store``): the same record, so that every process sharing Triton's remote cache
  reads the first one's decisions. Not used when no manager (or Triton's default file manager) is
  configured.

A lookup reads the local folder first, then the manager; a decision found there is copied into the
local folder. A new decision is written to both. ``TRITONPATCH_TUNING_CACHE=0``/``off`` keeps
decisions in memory only: nothing is read or written in either place (benchmarks and runs that
share the GPU with other work turn the cache off, as such decisions should not spread).

Each record carries the full key it was made for, and a record is used only if that key is the one
looked up: a digest collision, a corrupted record or a record of another format is a miss (one
warning per process and place), never another shape's decision. A decision names configs by label;
the tuner uses it only if that label is still among its candidates, so a changed candidate table
never brings back a config it no longer offers.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading

import torch
import triton

from . import tuning_store

logger = logging.getLogger("tritonpatch")

RECORD_FORMAT = 2   # joins the full key: records of another layout are never read as this one

_warned: set = set()
_warned_lock = threading.Lock()


def tuning_key(tuner: str, q, k, mask_mod, score_mod, block_mask, **extra) -> dict | None:
    """The process-independent part of a tuner's key, or None when a modifier's code has no stable
    name (``custom_mask``, ``custom_score``: such decisions stay in memory). The device is its type
    and the GPU's name, not its index: a decision made on ``cuda:0`` holds on ``cuda:3`` of the same
    model."""
    mask = mask_mod.portable_key()
    score = None if score_mod is None else score_mod.portable_key()
    if mask is None or (score_mod is not None and score is None):
        return None
    tiles = None if block_mask is None else [block_mask.block_m, block_mask.block_n]
    gpu = torch.cuda.get_device_name(q.device) if q.device.type == "cuda" else q.device.type
    return dict(tuner=tuner, q=list(q.shape), k=list(k.shape), dtype=str(q.dtype), device=q.device.type, gpu=gpu,
                mask=mask, score=score, block_mask=tiles, **extra)


def by_label(configs: list, label):
    """The config of ``configs`` whose label is ``label`` (None: not offered any more)."""
    return next((c for c in configs if c.label() == label), None)


def lookup(key: dict | None) -> dict | None:
    """The decision stored for ``key``: from the local folder, else from Triton's cache manager
    (then copied into the folder). None: no key, cache off, nothing stored, or no valid record."""
    place = _place(key)
    if place is None:
        return None
    folder, path, full, digest = place
    try:
        with open(path, "rb") as f:
            decision = _decision(f.read(), full, "the local tuning cache")
    except OSError:
        decision = None
    if decision is not None:
        return decision
    data = tuning_store.read(digest, _store_filename(key))
    decision = None if data is None else _decision(data, full, "Triton's cache manager")
    if decision is not None:
        _write_local(folder, path, data)
    return decision


def remember(key: dict | None, decision: dict) -> None:
    """Store ``decision`` for ``key`` in the local folder and through Triton's cache manager. A
    store that cannot be written only costs time later, so that is logged (debug) or warned
    (``tuning_store``), not raised."""
    place = _place(key)
    if place is None:
        return
    folder, path, full, digest = place
    data = json.dumps({"key": full, "decision": decision}, sort_keys=True).encode()
    _write_local(folder, path, data)
    tuning_store.write(digest, _store_filename(key), data)


def _place(key: dict | None) -> tuple | None:
    """Where ``key``'s record lives: ``(folder, local path, full key, digest)``; None without a key
    or with the cache off."""
    from tritonpatch import env

    folder = env.tuning_cache_dir()
    if key is None or folder is None:
        return None
    full = _full_key(key)
    digest = _digest(full)
    return folder, _local_path(folder, key, digest), full, digest


def _full_key(key: dict) -> dict:
    """``key`` with the versions and the record format, as it reads back from JSON (the form a
    record carries and is compared in)."""
    from tritonpatch import __version__

    full = dict(key, triton=triton.__version__, torch=torch.__version__, tritonpatch=__version__,
                record=RECORD_FORMAT)
    return json.loads(json.dumps(full, sort_keys=True, default=str))


def _digest(full: dict) -> str:
    return hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()


def _local_path(folder: str, key: dict, digest: str) -> str:
    return os.path.join(folder, f"{key.get('tuner', 'tuning')}-{digest[:32]}.json")


def _store_filename(key: dict) -> str:
    return f"{key.get('tuner', 'tuning')}.json"


def _decision(data: bytes, full: dict, where: str) -> dict | None:
    """The decision of a record if the record is for ``full``; else None, with one warning per
    process and place."""
    try:
        record = json.loads(data)
    except ValueError:
        record = None
    if isinstance(record, dict) and record.get("key") == full and isinstance(record.get("decision"), dict):
        return record["decision"]
    with _warned_lock:
        if where in _warned:
            return None
        _warned.add(where)
    what = "made for another key" if isinstance(record, dict) and "key" in record else "that cannot be read"
    from tritonpatch import _user_warnings

    _user_warnings.warn(f"tritonpatch: ignoring a tuning record in {where} {what} (tuner {full.get('tuner')!r}, "
                        f"shape {full.get('q')}); the attention tuner times its candidates again")
    return None


def _write_local(folder: str, path: str, data: bytes) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    except OSError as exc:
        logger.debug("tuning cache %s not writable: %s", folder, exc)
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except OSError as exc:
        logger.debug("tuning cache %s not writable: %s", folder, exc)
        with contextlib.suppress(OSError):
            os.remove(temp)
