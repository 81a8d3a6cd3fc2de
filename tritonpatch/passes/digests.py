"""Digests that tie cache keys to the code of the passes.

:func:`implementation_digest` identifies one pass implementation (its code, defaults, closure and
module source), :func:`registration_digest` adds what its registration decides (stage, order,
option defaults), and :func:`source_digest` covers the source files of the built-in passes. Each
joins the cache key of the Pipelines that name passes, so an edited or re-registered pass never
gets an artifact its old code built.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import types
from typing import Any, Callable, Mapping


def implementation_digest(run: Callable, version: str | None = None) -> str:
    """sha256 identifying a pass implementation: ``version``, and for a plain function its module
    and name, its code objects (bytecode, names, constants, nested functions), its defaults, its
    closure's values, and the bytes of its module's source file. Stable across processes for the
    same code and Python version. Values it cannot read into (instances of other classes) count by
    their type only."""
    digest = hashlib.sha256(f"version={version!r}\0".encode())
    if isinstance(run, types.FunctionType):
        _digest_function(digest, run, set())
    else:
        digest.update(f"{type(run).__module__}.{type(run).__qualname__}".encode())
    return digest.hexdigest()


def registration_digest(run: Callable, version: str | None, stage: str, order: int, options: Mapping) -> str:
    """:func:`implementation_digest` plus the rest of a registration that decides what a compile
    gets: the stage and order the pass runs at, and its options' types and defaults (a Pipeline
    names only the options it sets; the others take the registered defaults when the pass runs)."""
    defaults = {key: [option.type.__name__, repr(option.default)] for key, option in sorted(options.items())}
    settings = {"stage": stage, "order": order, "options": defaults}
    payload = json.dumps(settings, sort_keys=True)
    return hashlib.sha256(f"{implementation_digest(run, version)}\0{payload}".encode()).hexdigest()


def _digest_function(digest, function: types.FunctionType, seen: set) -> None:
    if id(function) in seen:  # recursion through a closure or a default
        digest.update(b"<seen>")
        return
    seen.add(id(function))
    digest.update(f"function {function.__module__}.{function.__qualname__}\0".encode())
    _digest_code(digest, function.__code__, seen)
    _digest_value(digest, function.__defaults__, seen)
    _digest_value(digest, function.__kwdefaults__, seen)
    for cell in function.__closure__ or ():
        try:
            _digest_value(digest, cell.cell_contents, seen)
        except ValueError:  # an empty cell
            digest.update(b"<empty cell>")
    path = getattr(sys.modules.get(function.__module__), "__file__", None)
    if path:
        try:
            with open(path, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
        except OSError:
            digest.update(b"<unreadable module source>")


def _digest_code(digest, code: types.CodeType, seen: set) -> None:
    digest.update(b"code\0" + code.co_code)
    for names in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        digest.update(("\0".join(names) + "\1").encode())
    for constant in code.co_consts:
        _digest_value(digest, constant, seen)


def _digest_value(digest, value: Any, seen: set) -> None:
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        digest.update(f"{type(value).__name__}:{value!r}\0".encode())
    elif isinstance(value, (tuple, list)):
        digest.update(f"{type(value).__name__}[".encode())
        for item in value:
            _digest_value(digest, item, seen)
        digest.update(b"]")
    elif isinstance(value, (frozenset, set, dict)):  # iteration order may follow the hash seed: sort
        items = value.items() if isinstance(value, dict) else ((item,) for item in value)
        parts = []
        for item in items:
            part = hashlib.sha256()
            _digest_value(part, tuple(item), seen)
            parts.append(part.hexdigest())
        digest.update(f"{type(value).__name__}{{{','.join(sorted(parts))}}}".encode())
    elif isinstance(value, types.CodeType):
        _digest_code(digest, value, seen)
    elif isinstance(value, types.FunctionType):
        _digest_function(digest, value, seen)
    else:
        digest.update(f"<{type(value).__module__}.{type(value).__qualname__}>".encode())


@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    """sha256 of the built-in passes' source files: it joins the cache key of every Pipeline with
    passes, so an edited pass recompiles even where the package version stays the same."""
    digest = hashlib.sha256()
    folder = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".py")):
        with open(os.path.join(folder, name), "rb") as handle:
            digest.update(name.encode() + b"\0" + handle.read())
    return digest.hexdigest()
