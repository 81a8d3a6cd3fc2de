"""What the passes say about a compile: one :class:`PassReport` per pass run, with its notes.

A running pass calls :func:`note` to say why it left a loop or a select as it is; the runner
collects those notes (:func:`collecting_notes`) into the pass's report, and :func:`publish` logs
every report (logger ``tritonpatch.passes``, INFO) and hands it to each :func:`collect_reports`
block of the current thread or task.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
from dataclasses import dataclass, field
from typing import Iterator

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
def collect_reports() -> Iterator[list[PassReport]]:
    """Collect a :class:`PassReport` for every pass run in this context (thread / task local)."""
    reports: list[PassReport] = []
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
        for collector in _COLLECTORS.get():
            collector.append(report)
