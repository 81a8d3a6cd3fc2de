"""What the passes say about a compile: one :class:`PassReport` per pass run, with its notes.

A running pass calls :func:`note` to say why it left a loop or a select as it is; the runner
collects those notes (:func:`collecting_notes`) into the pass's report, and :func:`publish` logs
every report (logger ``tritonpatch.passes``, INFO) and hands it to each :func:`collect_reports`
block of the current thread or task, and to each ``collect_reports(every_thread=True)`` block.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from dataclasses import dataclass, field
from typing import Iterator

from .._fork_safety import renew_in_child

logger = logging.getLogger("tritonpatch.passes")


@dataclass
class PassReport:
    """What one pass did to one module: the stage, the kernel, the counts, the pass's notes (why it
    left a loop or a select as it is, see :func:`note`), and whether the stage's result was kept
    (False when the stage fell back to the unpatched IR)."""
    name: str
    stage: str
    kernel: str
    counts: dict[str, int] = field(default_factory=dict)
    kept: bool = True
    notes: tuple[str, ...] = ()


_COLLECTORS: contextvars.ContextVar[tuple[list, ...]] = contextvars.ContextVar("tritonpatch_pass_reports", default=())
_EVERY_THREAD: list[list] = []          # collectors of every thread's reports (collect_reports(every_thread=True))
_EVERY_THREAD_LOCK = threading.Lock()
renew_in_child(globals(), _EVERY_THREAD_LOCK=threading.Lock)
_NOTES: contextvars.ContextVar[list | None] = contextvars.ContextVar("tritonpatch_pass_notes", default=None)


def note(message: str) -> None:
    """Called by a running pass: say why it left a loop or a select as it is (or what limited it).
    The message joins that pass's :class:`PassReport` ``notes`` and is logged with the kernel's name
    (logger ``tritonpatch.passes``, INFO: ``TRITONPATCH_LOG=info``). Outside a pass run it is only
    logged."""
    notes = _NOTES.get()
    if notes is None:
        logger.info("%s", message)
    else:
        notes.append(message)


@contextlib.contextmanager
def collecting_notes() -> Iterator[list[str]]:
    """The notes :func:`note` gives while one pass runs in this context."""
    notes: list[str] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


@contextlib.contextmanager
def collect_reports(every_thread: bool = False) -> Iterator[list[PassReport]]:
    """``with collect_reports() as reports:`` collects a :class:`PassReport` for every pass run in this
    context (thread / task local) into the list ``reports``, or
    with ``every_thread`` in any thread of the process while the block runs: compiles that others
    start in their own threads (torch.compile compiles its templates in a thread pool) report there.
    Compiles in other processes (Inductor's compile workers) report to their own process only:
    ``TORCHINDUCTOR_COMPILE_THREADS=1`` keeps them in this one."""
    reports: list[PassReport] = []
    if every_thread:
        with _EVERY_THREAD_LOCK:
            _EVERY_THREAD.append(reports)
        try:
            yield reports
        finally:
            with _EVERY_THREAD_LOCK:
                _EVERY_THREAD.remove(reports)
        return
    token = _COLLECTORS.set(_COLLECTORS.get() + (reports,))
    try:
        yield reports
    finally:
        _COLLECTORS.reset(token)


def publish(reports: list[PassReport]) -> None:
    """Log ``reports`` (counts, whether kept, notes) and add them to every :func:`collect_reports`
    block of the current context."""
    for report in reports:
        logger.info("pass %s (%s) on %s: %s%s", report.name, report.stage, report.kernel,
                    ", ".join(f"{k}={v}" for k, v in sorted(report.counts.items())) or "no change",
                    "" if report.kept else " (discarded: stage fell back)")
        for message in report.notes:
            logger.info("%s: %s (kernel %s)", report.name, message, report.kernel)
        with _EVERY_THREAD_LOCK:
            collectors = _COLLECTORS.get() + tuple(_EVERY_THREAD)
        for collector in collectors:
            collector.append(report)
