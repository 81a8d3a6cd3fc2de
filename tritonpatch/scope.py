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


class use_pipeline:
    """``with use_pipeline(p):`` compiles with exactly ``p``, ignoring ``options()``, ``set_option``
    and the environment (per-kernel pipelines: ``tritonpatch.jit`` enters one around each launch,
    so it is kept light). One object per ``with``."""

    __slots__ = ("pipeline", "fixed", "tokens")

    def __init__(self, pipeline: Pipeline):
        if not isinstance(pipeline, Pipeline):
            raise PipelineError(f"use_pipeline() takes a Pipeline, got {pipeline!r}")
        self.pipeline = pipeline
        self.fixed = _Fixed(pipeline)

    def __enter__(self) -> Pipeline:
        ensure_installed()
        self.tokens = (_forced.set(self.fixed), _effective.set(self.fixed))
        return self.pipeline

    def __exit__(self, *exc_info) -> None:
        forced, effective = self.tokens
        _effective.reset(effective)
        _forced.reset(forced)


class _Block:
    """One entry into an options() layer: sets its frame, restores the previous one."""

    __slots__ = ("layer", "merged", "tokens")

    def __init__(self, layer: Pipeline, merged: dict):
        self.layer = layer
        self.merged = merged

    def __enter__(self) -> Pipeline:
        ensure_installed()
        frame = _Frame(_scoped.get(), self.layer, self.merged)
        forced = _forced.get()
        self.tokens = (_scoped.set(frame), _effective.set(frame if forced is None else forced))
        return frame.resolve()

    def __exit__(self, *exc_info) -> None:
        scoped, effective = self.tokens
        _effective.reset(effective)
        _scoped.reset(scoped)


# The options() blocks entered by `with` in this context, innermost last: one object may be entered
# by several threads or asyncio tasks at once, and each exits its own entry.
_open_blocks: contextvars.ContextVar[tuple] = contextvars.ContextVar("tritonpatch_open_blocks", default=())


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
        block = _Block(self.layer, self._merged)
        effective = block.__enter__()
        _open_blocks.set(_open_blocks.get() + ((self, block),))
        return effective

    def __exit__(self, *exc_info) -> None:
        stack = _open_blocks.get()
        if stack and stack[-1][0] is self:
            _open_blocks.set(stack[:-1])
            stack[-1][1].__exit__(*exc_info)
            return
        # Exited out of order: generators suspended inside blocks share their caller's context and are
        # closed in any order. Restore what was in effect before this block, closing the blocks entered
        # after it too (their exits then do nothing), so that no block's settings stay in effect for good.
        position = next((i for i, (entered, _) in enumerate(stack) if entered is self), None)
        if position is None:
            return   # closed already by an earlier out-of-order exit
        _open_blocks.set(stack[:position])
        block = stack[position][1]
        block.__exit__(*exc_info)
        raise RuntimeError("tritonpatch.options blocks must be exited in the reverse order of entry (a "
                           "generator that yields inside a block lends it to the code iterating it); the settings "
                           "from before this block are back in effect, and the blocks entered after it are closed")

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
