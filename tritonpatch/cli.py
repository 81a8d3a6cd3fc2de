"""The ``tritonpatch`` command line. One function per subcommand; ``main`` dispatches."""
from __future__ import annotations

import argparse
import json
import shutil
import sys

from .errors import TritonpatchError


def _format_value(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


def _table(rows: list[list[str]], header: list[str]) -> str:
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


def cmd_llvm_options(args: argparse.Namespace) -> int:
    """List the LLVM options inside Triton with their types, values and defaults."""
    from . import llvm

    options = llvm.list_options(args.pattern)
    if args.changed:
        options = [o for o in options if o.changed]
    if args.json:
        print(json.dumps([{**o.__dict__, "settable": o.settable} for o in options], indent=2))
        return 0
    if not options:
        what = "changed LLVM option" if args.changed else "LLVM option"
        print(f"no {what} matches {args.pattern or '*'!r}", file=sys.stderr)
        return 1
    rows = []
    for o in options:
        kind = o.type if not o.choices else f"enum{{{','.join(o.choices)}}}"
        rows.append([o.name, kind if len(kind) <= 40 else kind[:39] + "…",
                     _format_value(o.value) + (" *" if o.specified else ""), _format_value(o.default), o.help])
    print(_table(rows, ["NAME", "TYPE", "VALUE", "DEFAULT", "HELP"]))
    print(f"\n{len(options)} option(s); * = specified on a command line", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tritonpatch", description="Patch Triton's compile pipeline: LLVM options, IR passes, inspection.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    llvm_options = commands.add_parser(
        "llvm-options", help="list the LLVM options inside Triton (name, type, value, default, help)")
    llvm_options.add_argument("pattern", nargs="?", help="substring, or glob with * ? [ (case-insensitive)")
    llvm_options.add_argument("--json", action="store_true", help="print JSON instead of a table")
    llvm_options.add_argument("--changed", action="store_true",
                              help="only options that differ from their default or were specified")
    llvm_options.set_defaults(run=cmd_llvm_options)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except TritonpatchError as exc:
        print(f"tritonpatch: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
