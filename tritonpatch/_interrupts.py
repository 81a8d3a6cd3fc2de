"""Ctrl-C (SIGINT) held back while LLVM's process-wide options change hands.

Python raises ``KeyboardInterrupt`` in the main thread between bytecodes. Raised while a compile applies
or restores its LLVM options (``_llvm_scope``), or between taking the option gate and the ``try`` that
gives it back, it would leave options set for every later compile (under other cache keys) or the gate
held for good. :class:`held` installs one handler, a :class:`Guard`, for such a section: it records a
SIGINT and hands it to the handler it replaced (Python's ``KeyboardInterrupt`` one, or a handler of the
program's own) when the section ends. Inside the section, :class:`delivered` marks the stretches where
an interrupt is safe (the stage itself, a wait for the gate): there the guard hands a signal on at once,
so Ctrl-C stops a long compile or a wait as before. Only a flag changes between the two: the handler
installed stays the same for the whole section.

Only the main thread receives signals in Python, so elsewhere both are no-ops; so are they when SIGINT is
ignored or left to the operating system. A handler the program installs meanwhile (inside the stage) is
left in place."""
from __future__ import annotations

import signal
import threading

__all__ = ["held", "delivered", "Guard"]


class Guard:
    """The SIGINT handler of a :class:`held` section: records a signal, or hands it to the handler it
    replaced at once while ``immediate`` (a :class:`delivered` stretch)."""

    __slots__ = ("original", "pending", "immediate")

    def __init__(self, original=None):
        self.original = original   # the handler replaced; None for an inactive guard (nothing installed)
        self.pending = None        # (signum, frame) of a SIGINT received while held back
        self.immediate = False

    def __call__(self, signum, frame) -> None:
        if self.immediate:
            self.original(signum, frame)
        else:
            self.pending = (signum, frame)

    def deliver(self) -> None:
        """Hand a recorded signal to the replaced handler (raising KeyboardInterrupt, by default). Cleared only
        when set: a signal arriving meanwhile is not lost (two arriving at once are handed on as one)."""
        pending = self.pending
        if pending is not None:
            self.pending = None
            self.original(*pending)


def _installed_guard() -> "Guard | None":
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signal.SIGINT)
    return handler if isinstance(handler, Guard) else None


class held:
    """``with held() as guard:`` holds SIGINT back over the block and hands a recorded one on when it ends
    (its KeyboardInterrupt chains an exception already leaving the block). Inside a section already held
    (a compile inside a compile's stage) it holds back the enclosing guard's signals over the block and
    gives the guard its mode back after it. ``guard.immediate = False`` is a plain store, which no signal
    can interrupt: a ``finally`` that must run held back starts with it."""

    __slots__ = ("guard", "installed", "was_immediate")

    def __enter__(self) -> Guard:
        self.installed = False
        if threading.current_thread() is not threading.main_thread():
            self.guard = Guard()
            return self.guard
        handler = signal.getsignal(signal.SIGINT)
        if isinstance(handler, Guard):
            self.guard, self.was_immediate = handler, handler.immediate
            handler.immediate = False
            return handler
        self.guard = Guard(handler if callable(handler) else None)
        if self.guard.original is not None:
            signal.signal(signal.SIGINT, self.guard)
            self.installed = True
        return self.guard

    def __exit__(self, *exc_info) -> None:
        guard = self.guard
        if self.installed:
            guard.immediate = False
            if signal.getsignal(signal.SIGINT) is guard:   # else the program installed a handler meanwhile
                signal.signal(signal.SIGINT, guard.original)
            guard.deliver()
        elif guard.original is not None:                   # the enclosing section's guard
            guard.immediate = self.was_immediate
            if guard.immediate:
                guard.deliver()


class delivered:
    """``with delivered():`` inside a :class:`held` section of this thread: SIGINT goes through at once over
    the block (a signal recorded so far is handed on first). A no-op outside a held section."""

    __slots__ = ("guard", "was_immediate")

    def __enter__(self) -> None:
        self.guard = _installed_guard()
        if self.guard is not None:
            self.guard.deliver()
            self.was_immediate, self.guard.immediate = self.guard.immediate, True

    def __exit__(self, *exc_info) -> None:
        if self.guard is not None:
            self.guard.immediate = self.was_immediate
