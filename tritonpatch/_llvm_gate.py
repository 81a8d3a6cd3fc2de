"""Who may change LLVM's process-wide options now: one set of options at a time.

LLVM's ``cl::opt`` options are process globals, and Triton releases the GIL in its LLVM stages,
so a change made while another thread compiles changes that compile too. Whoever changes them
holds :data:`gate` for as long as the change must stand:

- holds for the same key (a compile's option set: ``_llvm_scope``) share the gate and run in
  parallel; a hold for another key waits until they are done, and while it waits newcomers for
  the active key wait too, so no key starves;
- an exclusive hold (opening the native registry: ``_llvm_registry``, whose calibration flips
  options through LLVM's parser) shares with nobody.

The first holder of a key applies its change and the last one undoes it, each in a transition
that keeps everyone else out without holding the gate's lock, so what they call may take other
locks. The gate knows nothing of LLVM: what is applied and undone is its holders' concern. It
sits below both of them, so the registry and the scope import it one way.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Callable, Iterator

from . import _interrupts as interrupts

__all__ = ["gate", "LLVMOptionGate"]


class LLVMOptionGate:
    """At most one key holds the gate at a time, process-wide (see the module doc)."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._active = None      # the key holding the gate now (None: no holder)
        self._holders = 0
        self._waiting = 0
        self._transition = False  # a change is being applied or undone: nobody enters
        self._thread = threading.local()  # .depth: how many holds this thread has open

    def _can_join(self, key, waiting_self: int) -> bool:
        if self._transition:
            return False
        return self._holders == 0 or (self._active == key and self._waiting == waiting_self)

    def hold(self, key, apply: Callable[[], None] | None = None,
             unless: Callable[[], bool] | None = None) -> bool:
        """Hold the gate for ``key``; pair with :meth:`release`. Waits while another key holds it.

        The first holder of ``key`` runs ``apply()`` in a transition (if it raises, the hold is
        given up and the exception propagates). With ``unless``, stop waiting as soon as
        ``unless()`` is true and return False (not held); otherwise return True."""
        with self._cond:
            if not self._can_join(key, 0):
                self._waiting += 1
                try:
                    while not self._can_join(key, 1):
                        if unless is not None and unless():
                            return False
                        with interrupts.delivered():   # Ctrl-C stops a wait: nothing is applied yet
                            self._cond.wait()
                finally:
                    self._waiting -= 1
            if self._holders:
                self._holders += 1
                self._thread.depth = self.depth() + 1
                return True
            self._holders, self._active, self._transition = 1, key, True
        try:
            if apply is not None:
                apply()
        except BaseException:
            with self._cond:
                self._holders, self._active, self._transition = 0, None, False
                self._cond.notify_all()
            raise
        with self._cond:
            self._transition = False
            self._cond.notify_all()
        self._thread.depth = self.depth() + 1
        return True

    def release(self, undo: Callable[[], None] | None = None) -> None:
        """Give up a hold taken by :meth:`hold`; the last holder runs ``undo()`` in a transition."""
        with self._cond:
            if self._holders == 0:  # the gate was reset by a fork while this thread held it
                return
            self._holders -= 1
            self._thread.depth -= 1
            if self._holders:
                return
            if undo is None:
                self._active = None
                self._cond.notify_all()
                return
            self._transition = True
        try:
            undo()
        finally:
            with self._cond:
                self._active, self._transition = None, False
                self._cond.notify_all()

    def depth(self) -> int:
        """How many holds the calling thread has open (a compile in its LLVM stages has one)."""
        return getattr(self._thread, "depth", 0)

    @contextlib.contextmanager
    def exclusive(self, unless: Callable[[], bool] | None = None) -> Iterator[bool]:
        """Hold the gate alone: nobody else holds it meanwhile and nobody enters. With ``unless``,
        stop waiting as soon as ``unless()`` is true and yield False (not held). Never from a
        thread that holds the gate already (it would wait for itself)."""
        held = self.hold(object(), unless=unless)  # a key nobody else has: nothing joins it
        try:
            yield held
        finally:
            if held:
                self.release()

    def reset_after_fork(self) -> None:
        """In a forked child only the forking thread lives on: holders in other threads never
        release there, so the child starts from an empty gate. (Undoing what they applied is the
        holders' concern: ``_llvm_scope`` does it in its own fork handler, which runs after this one.)"""
        self.__init__()


gate = LLVMOptionGate()
os.register_at_fork(after_in_child=gate.reset_after_fork)
