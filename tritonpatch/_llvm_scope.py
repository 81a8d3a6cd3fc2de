"""The one owner of LLVM's process-wide option state while Triton compiles.

LLVM's ``cl::opt`` options are process globals, and Triton releases the GIL in its LLVM stages,
so anything that changes them while another thread compiles changes that compile too. Every
change tritonpatch makes goes through :data:`scope`:

- a compile holds it around its ``llir`` and ``ptx`` stages with the option set its Pipeline asks
  for (``hooks``): compiles wanting the same set (the empty one included) share it and run in
  parallel; a compile wanting another set waits until they are done, and while it waits newcomers
  for the active set wait too, so no set starves. The first holder of a set also snapshots the
  options Triton's ``DISABLE_LLVM_OPT`` is about to set; the last holder restores everything;
- opening the native registry holds it exclusively (``llvm._registry``): the registry's
  constructor calibrates by flipping ``disable-lsr`` and ``unroll-threshold`` through LLVM's
  parser, which no compile may observe.

This module imports ``tritonpatch.llvm`` only inside functions, and ``llvm`` imports it the same
way, so neither import depends on the other.
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Iterator

__all__ = ["scope", "LLVMOptionScope"]


class LLVMOptionScope:
    """At most one set of LLVM options is applied at a time, process-wide (see the module doc).

    The condition's lock is never held while calling into ``tritonpatch.llvm`` (whose own lock a
    waiting thread may hold): applying and restoring happen in a transition that keeps everyone
    else out without holding the lock.
    """

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._active = None      # the key of the set applied now (None: no holder)
        self._holders = 0
        self._saved: list = []
        self._waiting = 0
        self._transition = False  # a set is being applied or restored: nobody enters
        self._thread = threading.local()  # .depth: how many holds this thread has open

    def _can_join(self, key, waiting_self: int) -> bool:
        if self._transition:
            return False
        return self._holders == 0 or (self._active == key and self._waiting == waiting_self)

    def _enter(self, key, settings: tuple, triton_names: tuple, unless=None) -> bool:
        """Hold the scope for ``key``; False (not held) as soon as ``unless()`` is true while waiting."""
        with self._cond:
            if not self._can_join(key, 0):
                self._waiting += 1
                try:
                    while not self._can_join(key, 1):
                        if unless is not None and unless():
                            return False
                        self._cond.wait()
                finally:
                    self._waiting -= 1
            if self._holders:
                self._holders += 1
                self._thread.depth = getattr(self._thread, "depth", 0) + 1
                return True
            self._holders, self._active, self._transition = 1, key, True
        try:
            saved = _snapshot(triton_names) + _apply(settings)
        except BaseException:
            with self._cond:
                self._holders, self._active, self._transition = 0, None, False
                self._cond.notify_all()
            raise
        with self._cond:
            self._saved, self._transition = saved, False
            self._cond.notify_all()
        self._thread.depth = getattr(self._thread, "depth", 0) + 1
        return True

    def _exit(self) -> None:
        with self._cond:
            if self._holders == 0:  # the scope was reset by a fork while this thread held it
                return
            self._holders -= 1
            self._thread.depth -= 1
            if self._holders:
                return
            saved, self._saved = self._saved, []
            if not saved:
                self._active = None
                self._cond.notify_all()
                return
            self._transition = True
        try:
            from . import llvm

            llvm.restore_options(saved)
        finally:
            with self._cond:
                self._active, self._transition = None, False
                self._cond.notify_all()

    def enter(self, settings: tuple, triton_names: tuple) -> None:
        """Hold the scope with the LLVM options ``settings`` (canonical ``((name, value), ...)``)
        applied and the options named by ``DISABLE_LLVM_OPT`` (``triton_names``) snapshotted;
        pair with :meth:`exit`. Waits while a different set is applied."""
        if settings or triton_names:
            _ensure_registry()  # before holding: opening the registry takes this scope exclusively
        self._enter((settings, triton_names), settings, triton_names)

    def exit(self) -> None:
        """Release a hold taken by :meth:`enter`; the last holder restores every option exactly."""
        self._exit()

    @contextlib.contextmanager
    def exclusive(self, unless=None) -> Iterator[bool]:
        """Hold the scope alone: no compile is in its LLVM stages meanwhile and none starts. For
        code that touches LLVM's options outside any option set (the registry's calibration).
        With ``unless``, stop waiting as soon as ``unless()`` is true and yield False (not held)."""
        if getattr(self._thread, "depth", 0):
            raise RuntimeError("tritonpatch: LLVM's option registry cannot be opened from inside a compile's "
                               "llir/ptx stage (the stage holds the LLVM option scope); open it before "
                               "compiling, e.g. with tritonpatch.llvm.available()")
        held = self._enter(object(), (), (), unless)  # a key nobody else has: nothing joins it
        try:
            yield held
        finally:
            if held:
                self._exit()

    def reset_after_fork(self) -> None:
        """In a forked child only the forking thread lives on: holders in other threads never
        exit there, so put back what they applied and start from an empty scope."""
        saved = self._saved
        self.__init__()
        if saved:
            try:
                from . import llvm

                # Fork handlers run in registration order, and this one may run before llvm's own:
                # a parent thread holding llvm's lock at fork time must not deadlock the child here.
                llvm._reset_lock_in_child()
                llvm.restore_options(saved)
            except Exception as exc:  # noqa: BLE001 - a child must not die for this; say what is left
                warnings.warn(f"tritonpatch: LLVM options applied in the parent at fork time stay set in "
                              f"this child process: {exc}", RuntimeWarning, stacklevel=1)


scope = LLVMOptionScope()
os.register_at_fork(after_in_child=scope.reset_after_fork)
_warned_unrestorable = False


def _ensure_registry() -> None:
    """Open the native registry now (a no-op once open), before a hold that will need it."""
    from . import llvm
    from .errors import NativeUnavailableError

    try:
        llvm._registry()
    except NativeUnavailableError:
        pass  # _snapshot says what that means; _apply raises it


def _apply(settings: tuple) -> list:
    if not settings:
        return []
    from . import llvm

    return llvm.apply_options(dict(settings))


def _snapshot(names: tuple[str, ...]) -> list:
    """Exact states of the options ``DISABLE_LLVM_OPT`` names (unknown names are skipped, as
    Triton skips them)."""
    global _warned_unrestorable
    if not names:
        return []
    from . import llvm
    from .errors import NativeUnavailableError

    try:
        registry = llvm._registry()
    except NativeUnavailableError as exc:
        if not _warned_unrestorable:
            _warned_unrestorable = True
            warnings.warn(f"DISABLE_LLVM_OPT={','.join(names)} will leak into later compiles (Triton never "
                          f"resets it) because tritonpatch cannot restore LLVM options here: {exc}",
                          RuntimeWarning, stacklevel=2)
        return []
    return [registry.snapshot(name) for name in names if registry.option(name) is not None]
