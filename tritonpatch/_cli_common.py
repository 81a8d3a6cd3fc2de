"""What the ``tritonpatch`` subcommands share: the error a user can fix, the traceback hint, and
plain-text tables."""
from __future__ import annotations

import argparse
import shutil

from . import env
from .errors import TritonpatchError

TRACEBACK_HINT = "--traceback or TRITONPATCH_LOG=debug shows the full traceback"


class CommandError(Exception):
    """A failure the user can fix (bad argument, spec, kernel); its message is the error line."""


def format_value(value) -> str:
    """An option's value in a table: ``-`` for none, ``true``/``false``, strings quoted."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


def table(rows: list[list[str]], header: list[str]) -> str:
    """Left-aligned columns; the last column is cut to the terminal width."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    total = shutil.get_terminal_size((160, 24)).columns
    last = max(20, total - sum(widths) - 2 * len(widths))
    lines = []
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)]
        tail = row[-1] if len(row[-1]) <= last else row[-1][: last - 1] + "…"
        lines.append("  ".join([*cells, tail]).rstrip())
    return "\n".join(lines)


def wants_traceback(args: argparse.Namespace) -> bool:
    """``--traceback``, or ``TRITONPATCH_LOG=debug``."""
    try:
        return args.traceback or env.log_level() == "debug"
    except TritonpatchError:  # a malformed TRITONPATCH_LOG is reported where it is read
        return False
