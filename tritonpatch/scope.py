"""The blocks that choose a compile's Pipeline: ``options()`` (merged over what encloses it) and
``use_pipeline()`` (exactly one Pipeline, for per-kernel pipelines). Entering one installs
tritonpatch into Triton (:mod:`.hooks`) if that has not happened yet."""
from __future__ import annotations

import contextvars
import functools
import inspect
from typing import Any

from . import hooks
from ._current import _effective, _Fixed, _forced, _Frame, _scoped
from .errors import PipelineError
from .pipeline import Pipeline

__all__ = ["options", "use_pipeline", "ensure_installed"]


def ensure_installed() -> None:
    """Install tritonpatch into Triton unless done, and keep its stages hook the one Triton calls (runs on
    every block entry: keep it cheap)."""
    if not hooks.installed():
        hooks.install()
    else:
        hooks.ensure_outermost()


# The blocks open in this context, innermost last, of every kind: `with options()`, a call of an
# options-decorated function, `with use_pipeline()`. Each exits its own entry; one options object may be
# entered by several threads or asyncio tasks at once (each has its own context).
_open_blocks: contextvars.ContextVar[tuple] = contextvars.ContextVar("tritonpatch_open_blocks", default=())


class _Entry:
    """One entry into a block: the values of the three context variables it replaced, restored at its exit.

    Exits come in the reverse order of entries except when a generator suspended inside a block (it shares
    its caller's context) is closed after blocks its caller entered later, or the caller leaves such a block
    while the generator is still inside its own. Then the exiting block restores what was in effect before
    it, closes the blocks entered after it (their exits do nothing) and raises: no block's settings stay in
    effect for good, and the program learns that its blocks did not nest."""

    __slots__ = ("owner", "saved")

    def __init__(self, owner):
        self.owner = owner   # the options object whose `with` made the entry; None for the entry itself

    def enter(self, scoped: "_Frame | None", forced: "_Fixed | None") -> None:
        ensure_installed()
        self.saved = (_scoped.get(), _forced.get(), _effective.get())
        _scoped.set(scoped)
        _forced.set(forced)
        _effective.set(scoped if forced is None else forced)
        _open_blocks.set(_open_blocks.get() + (self,))

    def exit(self) -> None:
        stack = _open_blocks.get()
        in_order = bool(stack) and stack[-1] is self
        position = len(stack) - 1 if in_order else next((i for i, e in enumerate(stack) if e is self), None)
        if position is None:
            return   # closed already, by an out-of-order exit of a block around it
        _open_blocks.set(stack[:position])
        scoped, forced, effective = self.saved
        _scoped.set(scoped)
        _forced.set(forced)
        _effective.set(effective)
        if not in_order:
            raise RuntimeError("tritonpatch blocks (options(), use_pipeline(), options-decorated calls) must be "
                               "exited in the reverse order of entry (a generator that yields inside a block lends "
                               "it to the code iterating it); the settings from before this block are back in "
                               "effect, and the blocks entered after it are closed")


def _innermost_entry(owner) -> "_Entry | None":
    for entry in reversed(_open_blocks.get()):
        if entry.owner is owner:
            return entry
    return None


class use_pipeline(_Entry):
    """``with use_pipeline(p):`` compiles with exactly ``p``, ignoring ``options()``, ``set_option``
    and the environment (per-kernel pipelines: ``tritonpatch.jit`` enters one around each launch,
    so it is kept light). One object per ``with``."""

    __slots__ = ("pipeline", "fixed")

    def __init__(self, pipeline: Pipeline):
        if not isinstance(pipeline, Pipeline):
            raise PipelineError(f"use_pipeline() takes a Pipeline, got {pipeline!r}")
        super().__init__(None)
        self.pipeline = pipeline
        self.fixed = _Fixed(pipeline)

    def __enter__(self) -> Pipeline:
        self.enter(_scoped.get(), self.fixed)
        return self.pipeline

    def __exit__(self, *exc_info) -> None:
        self.exit()


class _Block(_Entry):
    """One entry into an options() layer, merged over the enclosing frame (a decorated function's call)."""

    __slots__ = ("layer", "merged")

    def __init__(self, layer: Pipeline, merged: dict):
        super().__init__(None)
        self.layer = layer
        self.merged = merged

    def __enter__(self) -> Pipeline:
        frame = _Frame(_scoped.get(), self.layer, self.merged)
        self.enter(frame, _forced.get())
        return frame.resolve()

    def __exit__(self, *exc_info) -> None:
        self.exit()


_PIPELINE_KEYWORDS = frozenset(inspect.signature(Pipeline.__init__).parameters) - {"self"}


class options:
    """Compile the kernels of a block (or of every call of a decorated function) with these settings.

    ``with tritonpatch.options(disable_lsr=True, llvm={...}, passes=[...], ptxas=[...]):``. The
    keywords are those of :class:`Pipeline` and are validated immediately. Blocks nest by merging
    key by key over the enclosing block (and over ``set_option``'s layer and the ``TRITONPATCH_*``
    variables); the settings
    are held in a context variable, so other threads and asyncio tasks are unaffected. Entering a
    block installs tritonpatch into Triton if that has not happened yet. As a decorator (sync or
    async functions) each call enters the block afresh.
    """

    def __init__(self, **settings: Any):
        unknown = sorted(set(settings) - _PIPELINE_KEYWORDS)
        if unknown:
            raise TypeError(f"tritonpatch.options got unknown keyword(s) {unknown}; the keywords are "
                            f"{', '.join(sorted(_PIPELINE_KEYWORDS))} (an LLVM option goes in llvm= by its name, "
                            "e.g. llvm={'disable-lsr': True})")
        self.layer = Pipeline(**settings)
        self._merged: dict = {}

    def __enter__(self) -> Pipeline:
        frame = _Frame(_scoped.get(), self.layer, self._merged)
        _Entry(self).enter(frame, _forced.get())
        return frame.resolve()

    def __exit__(self, *exc_info) -> None:
        entry = _innermost_entry(self)
        if entry is not None:   # None: closed already, by an out-of-order exit of a block around it
            entry.exit()

    def __call__(self, func):
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(f"tritonpatch.options cannot decorate the generator function {func.__qualname__}: its "
                            "body runs while it is iterated, in the iterating code's context, not in the call; "
                            "put `with tritonpatch.options(...):` around the compiles inside it, without yielding "
                            "inside the block")
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args, **kwargs):
                with _Block(self.layer, self._merged):
                    return await func(*args, **kwargs)
            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with _Block(self.layer, self._merged):
                return func(*args, **kwargs)
        return wrapper

    def __repr__(self):
        return f"tritonpatch.options({self.layer!r})"
