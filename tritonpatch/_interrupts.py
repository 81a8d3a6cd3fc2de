"""Ctrl-C (SIGINT) held back while LLVM's process-wide options change hands.

Python raises ``KeyboardInterrupt`` in the main thread between any two bytecodes. Raised while a compile
applies or restores its LLVM options (``_llvm_scope``), or between taking the option gate and the
``try`` that gives it back, it would leave options set for every later compile (under other cache keys)
or the gate held for good. :func:`held` defers the signal over such a section: the handler in effect
(Python's ``KeyboardInterrupt`` one, or a handler of the program's own) runs when the section ends;
:func:`delivered` lets it through again inside one (while the stage itself runs, so that Ctrl-C stops a
long compile as before).

Only the main thread receives signals in Python, so elsewhere both are no-ops; so are they when
SIGINT is ignored or left to the operating system, or while another handler than the one found on
entry was installed meanwhile (the program's choice wins)."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

__all__ = ["held", "delivered"]


class _Deferral:
    """The deferring handler of one :func:`held` section: records the signal, and calls the handler it
    replaced once delivery is allowed."""

    def __init__(self, original):
        self.original = original
        self.pending = None   # (signum, frame) of a SIGINT received while deferred

    def __call__(self, signum, frame) -> None:
        self.pending = (signum, frame)

    def deliver(self) -> None:
        """Run the replaced handler for a recorded signal (raising KeyboardInterrupt, by default)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            self.original(*pending)


def _deferrable():
    """The SIGINT handler a section may defer: a Python callable in the main thread; None otherwise."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signal.SIGINT)
    return handler if callable(handler) and not isinstance(handler, _Deferral) else None


@contextlib.contextmanager
def held() -> Iterator["_Deferral | None"]:
    """Defer SIGINT over the block; a signal received meanwhile is handled when it ends (its
    KeyboardInterrupt chains an exception already leaving the block)."""
    original = _deferrable()
    if original is None:
        yield None
        return
    deferral = _Deferral(original)
    signal.signal(signal.SIGINT, deferral)
    try:
        yield deferral
    finally:
        if signal.getsignal(signal.SIGINT) is deferral:
            signal.signal(signal.SIGINT, original)
        deferral.deliver()


@contextlib.contextmanager
def delivered(deferral: "_Deferral | None") -> Iterator[None]:
    """Inside a :func:`held` block, let SIGINT through over this block: a signal recorded so far is handled
    on entry, and the deferring handler is back on exit, however the block ends."""
    if deferral is None or signal.getsignal(signal.SIGINT) is not deferral:
        yield
        return
    signal.signal(signal.SIGINT, deferral.original)
    try:
        deferral.deliver()
        yield
    finally:
        signal.signal(signal.SIGINT, deferral)
