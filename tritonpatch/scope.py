"""The blocks that choose a compile's Pipeline: ``options()`` (merged over what encloses it) and
``use_pipeline()`` (exactly one Pipeline, for per-kernel pipelines). Entering one installs
tritonpatch into Triton (:mod:`.hooks`) if that has not happened yet."""
from __future__ import annotations

import contextvars
import copy
import functools
import inspect
import sys
from typing import Any

from . import hooks
from ._current import _effective, _Fixed, _forced, _Frame, _scoped
from .pipeline import Pipeline, as_pipeline, check_keywords

__all__ = ["options", "use_pipeline", "ensure_installed"]


def ensure_installed() -> None:
    """Install tritonpatch into Triton unless done, and keep its stages hook the one Triton calls (runs on
    every block entry: keep it cheap)."""
    if not hooks.installed():
        hooks.install()
    else:
        hooks.ensure_outermost()


# The blocks open in this context, innermost last, of every kind: `with options()`, a call of an
# options-decorated function, `with use_pipeline()`. Each `with` makes an entry of its own, so one object
# may be entered again while open (nested, recursively, or by several threads or asyncio tasks at once: each
# has its own context).
_open_blocks: contextvars.ContextVar[tuple] = contextvars.ContextVar("tritonpatch_open_blocks", default=())


class _Entry:
    """One entry into a block: what it puts in effect (an options() layer merged over the enclosing frame,
    or a per-kernel Pipeline), the context state it replaced, and who entered it: the block object and the
    Python frame running its ``with``, by identity and code (holding the frame would keep its locals alive in
    every context copied meanwhile, e.g. by an asyncio task; the code tells a frame from a later one of other
    code at the same address)."""

    __slots__ = ("origin", "owner", "frame_id", "code", "layer", "merged", "fixed", "saved")

    def __init__(self, owner, frame, layer: "Pipeline | None" = None, merged: "dict | None" = None,
                 fixed: "_Fixed | None" = None):
        self.origin = self   # the entry this one stands for (a copy made by an out-of-order exit: _pop)
        self.owner = owner
        self.frame_id = id(frame)
        self.code = frame.f_code
        self.layer = layer
        self.merged = merged
        self.fixed = fixed

    def over(self, saved: tuple) -> "_Entry":
        """This entry with ``saved`` as what preceded it: a copy, as the entry may be open in other contexts too
        (copied by an asyncio task made inside the block), whose record must not change."""
        copied = copy.copy(self)
        copied.saved = saved
        return copied

    def state_over(self, scoped: "_Frame | None", forced: "_Fixed | None") -> tuple:
        """The (options frame, per-kernel Pipeline) in effect inside this block, given those outside it."""
        if self.fixed is not None:
            return scoped, self.fixed
        return _Frame(scoped, self.layer, self.merged), forced


def _set_state(scoped: "_Frame | None", forced: "_Fixed | None") -> None:
    _scoped.set(scoped)
    _forced.set(forced)
    _effective.set(scoped if forced is None else forced)


def _push(entry: _Entry) -> "_Frame | None":
    """Enter ``entry``; its options frame (what ``with options() as p`` resolves)."""
    ensure_installed()
    entry.saved = (_scoped.get(), _forced.get())
    scoped, forced = entry.state_over(*entry.saved)
    _set_state(scoped, forced)
    _open_blocks.set(_open_blocks.get() + (entry,))
    return scoped


def _pop(entry: _Entry) -> None:
    """Exit ``entry``: restore what was in effect before it.

    Exits come in the reverse order of entries except when a generator suspended inside a block (it shares
    its caller's context) is closed or collected inside blocks its caller entered later, or the caller
    leaves a block while a generator is still suspended inside its own. Then the entry is taken out alone:
    the blocks entered after it stay in effect with its settings taken out from beneath theirs (until their
    own exits, a generator's when it resumes and leaves its block or is closed), and it raises, so the
    program learns that its blocks did not nest."""
    stack = _open_blocks.get()
    if stack and stack[-1] is entry:
        _open_blocks.set(stack[:-1])
        _set_state(*entry.saved)
        return
    position = next((i for i, open_entry in enumerate(stack) if open_entry.origin is entry.origin), None)
    if position is None:
        return   # not open in this context (exited in another one, e.g. an asyncio task's copy)
    if position == len(stack) - 1:   # a copy made by an earlier out-of-order exit, now in order
        _open_blocks.set(stack[:-1])
        _set_state(*stack[-1].saved)
        return
    state, later = stack[position].saved, []
    for open_entry in stack[position + 1:]:
        later.append(open_entry.over(state))
        state = open_entry.state_over(*state)
    _open_blocks.set(stack[:position] + tuple(later))
    _set_state(*state)
    raise RuntimeError("tritonpatch blocks (options(), use_pipeline(), options-decorated calls) must be exited in "
                       "the reverse order of entry (a generator that yields inside a block lends it to the code "
                       "iterating it); this block's settings are no longer in effect, and the blocks entered "
                       "after it keep theirs until they are left")


def _exit_block(owner, frame) -> None:
    """Exit the innermost open entry of ``owner`` made by the ``with`` running in ``frame`` (a generator
    entering its caller's options object makes entries of its own, left by its own ``with``). An entry made
    in another frame (``ExitStack``, ``AsyncExitStack``, ``__enter__``/``__exit__`` called by hand from two
    functions) is found by owner alone: the innermost one (so two ExitStacks holding one object at once must
    be left in the reverse order of entry; use an object per stack otherwise)."""
    stack = _open_blocks.get()
    frame_id = id(frame)
    code = frame.f_code
    entry = next((e for e in reversed(stack) if e.owner is owner and e.frame_id == frame_id and e.code is code),
                 None)
    if entry is None:
        entry = next((e for e in reversed(stack) if e.owner is owner), None)
    if entry is not None:
        _pop(entry)


class use_pipeline:
    """``with use_pipeline(p):`` compiles with exactly ``p``, ignoring ``options()``, ``set_option``
    and the environment (per-kernel pipelines: ``tritonpatch.jit`` enters one around each launch,
    so it is kept light)."""

    __slots__ = ("pipeline", "fixed")

    def __init__(self, pipeline: Pipeline | dict):
        self.pipeline = as_pipeline(pipeline, "use_pipeline()")   # a dict of Pipeline keywords, as tritonpatch.jit takes
        self.fixed = _Fixed(self.pipeline)

    def __enter__(self) -> Pipeline:
        _push(_Entry(self, sys._getframe(1), fixed=self.fixed))
        return self.pipeline

    def __exit__(self, *exc_info) -> None:
        _exit_block(self, sys._getframe(1))


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
        check_keywords(settings, "tritonpatch.options")
        self.layer = Pipeline(**settings)
        self._merged: dict = {}

    def __enter__(self) -> Pipeline:
        return _push(_Entry(self, sys._getframe(1), self.layer, self._merged)).resolve()

    def __exit__(self, *exc_info) -> None:
        _exit_block(self, sys._getframe(1))

    def __call__(self, func):
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(f"tritonpatch.options cannot decorate the generator function {func.__qualname__}: its "
                            "body runs while it is iterated, in the iterating code's context, not in the call; "
                            "put `with tritonpatch.options(...):` around the compiles inside it, without yielding "
                            "inside the block")
        layer, merged = self.layer, self._merged
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args, **kwargs):
                entry = _Entry(None, sys._getframe(), layer, merged)
                _push(entry)
                try:
                    return await func(*args, **kwargs)
                finally:
                    _pop(entry)
            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            entry = _Entry(None, sys._getframe(), layer, merged)
            _push(entry)
            try:
                return func(*args, **kwargs)
            finally:
                _pop(entry)
        return wrapper

    def __repr__(self):
        return f"tritonpatch.options({self.layer!r})"
