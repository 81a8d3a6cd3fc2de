"""The pass registry: which passes exist, the stage each follows, its options and its digest.

A pass is registered with :func:`register_pass` under a name, with the stage it follows and the
options it accepts; the built-in ones register when :mod:`tritonpatch.passes` is imported
(:mod:`.builtin`). :func:`implementation_tag` turns the registrations a Pipeline names into part of
its cache tag, memoized until a pass is registered or removed (``generation`` counts those events).
"""
from __future__ import annotations

import hashlib
import types
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..env import quote
from ..errors import PipelineError
from .digests import registration_digest

PassSpec = tuple[str, tuple[tuple[str, object], ...]]
STAGES = ("ttir", "ttgir")


@dataclass(frozen=True)
class PassOption:
    """One option of a pass: its type (bool, int, float or str), default and meaning."""
    type: type
    default: Any
    help: str


@dataclass(frozen=True)
class PassInfo:
    """A registered pass. ``run(text, options) -> (new_text, counts)`` rewrites the module's IR
    text; ``counts`` says what changed (e.g. ``{"loops_split": 1}``), all zero when nothing did."""
    name: str
    stage: str
    description: str
    options: Mapping[str, PassOption]
    run: Callable[[str, Mapping[str, Any]], tuple[str, dict[str, int]]]
    order: int = 0
    digest: str = ""  # identifies the implementation and its registration (stage, order, option defaults)


_REGISTRY: dict[str, PassInfo] = {}
_IMPLEMENTATION_TAGS: dict[tuple, str] = {}  # pass specs -> implementation_tag(specs); cleared on (un)registering
generation = 0  # counts registrations and removals: cached cache tags are stale once it moves


def register_pass(name: str, stage: str, description: str, options: Mapping[str, PassOption] | None = None,
                  order: int = 0, version: str | None = None):
    """Decorator registering ``run(text, options) -> (text, counts)`` as pass ``name``. Within a
    stage, passes run in ascending ``order`` and, for equal order, in the order they were given
    (``skip-masked-blocks`` must see the loop before ``elide-uniform-masks`` restructures it).

    The cache keys of compiles with the pass follow :func:`~.digests.implementation_digest` of ``run``
    (its code, defaults and closure, and the source file of its module) and the registration's
    stage, order and option defaults. Code it calls in *other*
    modules is not covered: give such a pass a ``version`` string and change it whenever that code
    changes (``version`` is required when ``run`` is not a plain function)."""
    if stage not in STAGES:
        raise ValueError(f"pass {name!r}: stage must be one of {STAGES}, got {stage!r}")
    if version is not None and not isinstance(version, str):
        raise ValueError(f"pass {name!r}: version= takes a string, got {version!r}")

    def decorate(run):
        if name in _REGISTRY:
            raise ValueError(f"a pass named {name!r} is already registered")
        if not isinstance(run, types.FunctionType) and version is None:
            raise ValueError(f"pass {name!r}: {run!r} is not a plain function, so its code cannot join the cache "
                             "keys; register it with version='...' and change the version whenever the pass changes")
        info = PassInfo(name, stage, description, dict(options or {}), run, order,
                        registration_digest(run, version, stage, order, options or {}))
        _REGISTRY[name] = info
        _registry_changed()
        return run
    return decorate


def unregister_pass(name: str) -> None:
    """Remove a pass registered with :func:`register_pass` (tests and experiments)."""
    _REGISTRY.pop(name, None)
    _registry_changed()


def _registry_changed() -> None:
    global generation
    _IMPLEMENTATION_TAGS.clear()
    generation += 1


def implementation_tag(specs: Sequence[PassSpec]) -> str:
    """``-`` and 16 hex digits over the implementations registered now under the passes of
    ``specs`` (part of a Pipeline's cache tag; memoized until a pass is registered or removed)."""
    tag = _IMPLEMENTATION_TAGS.get(specs)
    if tag is None:
        digest = hashlib.sha256()
        for name in sorted({spec[0] for spec in specs}):
            digest.update(f"{name}\0{pass_info(name).digest}\0".encode())
        tag = _IMPLEMENTATION_TAGS[specs] = f"-{digest.hexdigest()[:16]}"
    return tag


def available_passes() -> dict[str, str]:
    """Name -> one-line description of every registered pass."""
    return {name: info.description for name, info in sorted(_REGISTRY.items())}


def pass_info(name: str) -> PassInfo:
    """The registration of pass ``name``; PipelineError naming the known passes if there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise PipelineError(f"unknown pass {quote(name)}; known passes: {known}") from None


def pass_stage(name: str) -> str:
    """``"ttir"`` or ``"ttgir"``: the Triton stage after which pass ``name`` runs."""
    return pass_info(name).stage
