"""Which Pipeline is in effect for the compile happening now.

Precedence, most specific first: a per-kernel Pipeline (``use_pipeline``, used by
``tritonpatch.jit``) replaces everything; otherwise the innermost ``options()`` block, merged key
by key over the enclosing blocks, over the process-wide layer of ``tritonpatch.llvm.set_option``
and over the ``TRITONPATCH_*`` environment variables; otherwise Triton's defaults (the empty
Pipeline, which changes nothing).

The blocks (:mod:`.scope`) live in :mod:`contextvars`, so threads and asyncio tasks do not see each
other's settings, and resolving the effective Pipeline is O(1) (Triton 3.7+ asks for it on every
kernel launch).
"""
from __future__ import annotations

import contextvars
import os
import threading
from typing import Any

from . import _llvm_registry as llvm_registry
from ._fork_safety import renew_in_child
from .pipeline import EMPTY, Pipeline, pipeline_from_environ

__all__ = ["current_pipeline", "environment_pipeline", "base_pipeline", "set_process_llvm_option"]

_environment_lock = threading.Lock()
_environment: Pipeline | None = None


def environment_pipeline() -> Pipeline:
    """The Pipeline of this process's ``TRITONPATCH_*`` variables, read once."""
    global _environment
    if _environment is None:
        with _environment_lock:
            if _environment is None:
                _environment = pipeline_from_environ(os.environ)
    return _environment


# --- the process-wide layer (tritonpatch.llvm.set_option) ---------------------------------------

_process_lock = threading.Lock()
renew_in_child(globals(), _environment_lock=threading.Lock, _process_lock=threading.Lock)
_process_layer: Pipeline = EMPTY
_base_memo: tuple = (object(), None, EMPTY)  # (environment, process layer, their merge); stale at first


def base_pipeline() -> Pipeline:
    """The environment's Pipeline with the process-wide layer of ``set_option`` over it: what a
    compile outside every ``options()`` block uses (O(1) until either changes)."""
    global _base_memo
    memo = _base_memo
    if memo[0] is _environment and memo[1] is _process_layer:
        return memo[2]
    environment, layer = environment_pipeline(), _process_layer
    merged = environment.merge(layer)
    _base_memo = (environment, layer, merged)
    return merged


def set_process_llvm_option(name: str, value: Any) -> Any:
    """``tritonpatch.llvm.set_option``: put ``name=value`` into the process-wide layer, or take
    ``name`` out of it for ``None``; return the layer's previous value (``None``: it had none).
    The caller installs tritonpatch into Triton."""
    global _process_layer
    canonical = llvm_registry.option_name(name)
    normalized = None if value is None else llvm_registry.normalize_value(canonical, value)
    if value is None:
        llvm_registry.get_option(canonical)  # an unknown name is an error here too (naming the close matches)
    with _process_lock:
        layer = dict(_process_layer.llvm)
        previous = layer.pop(canonical, None)
        if normalized is not None:
            layer[canonical] = normalized
        _process_layer = Pipeline._from_canonical(tuple(sorted(layer.items())), (), ())
    return previous


# --- the effective Pipeline ---------------------------------------------------------------------

_MERGE_MEMO_SIZE = 64


class _Frame:
    """One entry into an ``options()`` layer: the layer over the enclosing frame (or over
    :func:`base_pipeline`). The merge is resolved lazily and kept until what it was merged over
    changes (a ``set_option`` call), so a launch resolves it in O(1)."""

    __slots__ = ("parent", "layer", "merged", "_resolved")

    def __init__(self, parent: "_Frame | None", layer: Pipeline, merged: dict):
        self.parent = parent
        self.layer = layer
        self.merged = merged  # base -> base.merge(layer), shared by the entries of one options()
        self._resolved = (None, EMPTY)

    def resolve(self) -> Pipeline:
        parent = self.parent
        base = base_pipeline() if parent is None else parent.resolve()
        resolved = self._resolved
        if resolved[0] is base:
            return resolved[1]
        scoped = self.merged.get(base)
        if scoped is None:
            if len(self.merged) >= _MERGE_MEMO_SIZE:
                self.merged.clear()
            scoped = self.merged[base] = base.merge(self.layer)
        self._resolved = (base, scoped)
        return scoped


class _Fixed:
    """A per-kernel Pipeline (``use_pipeline``): exactly this one, whatever encloses it."""

    __slots__ = ("pipeline",)

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline

    def resolve(self) -> Pipeline:
        return self.pipeline


# The innermost options() frame; the per-kernel Pipeline; and the one of the two in effect (what
# current_pipeline() resolves: Triton 3.7+ asks for it on every launch).
_scoped: contextvars.ContextVar[_Frame | None] = contextvars.ContextVar("tritonpatch_options", default=None)
_forced: contextvars.ContextVar[_Fixed | None] = contextvars.ContextVar("tritonpatch_kernel", default=None)
_effective: contextvars.ContextVar["_Frame | _Fixed | None"] = contextvars.ContextVar("tritonpatch_effective",
                                                                                      default=None)


def current_pipeline() -> Pipeline:
    """The Pipeline a compile started here and now would use."""
    state = _effective.get()
    return base_pipeline() if state is None else state.resolve()


def current_cache_tag() -> str:
    """``current_pipeline().cache_tag``, on the per-launch path."""
    state = _effective.get()
    pipeline = base_pipeline() if state is None else state.resolve()
    return pipeline.cache_tag if pipeline.passes else pipeline._tag


class _KeyedCompile(threading.local):
    """What the last cache-key computation in this thread resolved: ``(state, pipeline)``."""
    record: tuple | None = None


_keyed = _KeyedCompile()


def keyed_cache_tag() -> str:
    """:func:`current_cache_tag` for the cache key of a compile about to run in this thread: the
    Pipeline is remembered so that the compile's stages use the very Pipeline its key names, even
    if ``set_option`` changes the process-wide layer in between. (Triton 3.7+ calls this on every
    launch: the base case is inlined.)"""
    state = _effective.get()
    if state is None:
        memo = _base_memo
        pipeline = memo[2] if memo[0] is _environment and memo[1] is _process_layer else base_pipeline()
    else:
        pipeline = state.resolve()
    _keyed.record = (state, pipeline)
    return pipeline.cache_tag if pipeline.passes else pipeline._tag


def compile_pipeline() -> Pipeline:
    """The Pipeline for the stages of the compile starting now in this thread: the one its cache
    key was computed with (:func:`keyed_cache_tag`) if that happened in the same ``options()`` /
    ``use_pipeline()`` context, else :func:`current_pipeline`."""
    record, _keyed.record = _keyed.record, None
    if record is not None and record[0] is _effective.get():
        return record[1]
    return current_pipeline()

