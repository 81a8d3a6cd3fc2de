"""The ``tritonpatch`` command line: the parser, ``main``, and the small subcommands
(``llvm-options``, ``demo``, ``--version``); ``compare`` and its spec files, and ``bench``, have
modules of their own (``_cli_compare``, ``_cli_spec``, ``_cli_bench``).

A mistake in the arguments, a spec, the environment or the kernel ends the command with one line,
``tritonpatch COMMAND: error: ...``, and exit status 2, like argparse's own errors; ``--traceback``
(or ``TRITONPATCH_LOG=debug``) adds the Python traceback.

Triton is imported only by the commands that need it (``--version``, ``demo`` and the compiles),
so ``--help`` and the argument errors stay quick.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import traceback

from . import __version__, env, llvm
from ._cli_bench import DEFAULT_BENCH_OUT, cmd_bench
from ._cli_common import TRACEBACK_HINT, CommandError, format_value, table, wants_traceback
from ._cli_compare import DEFAULT_A, DEFAULT_B, DEFAULT_TARGET, cmd_compare, pipeline_from_text
from ._cli_spec import load_kernel_spec
from .errors import NativeUnavailableError, TritonpatchError

__all__ = ["main", "build_parser", "version_text", "error_message", "pipeline_from_text", "load_kernel_spec",
           "CommandError"]

MESSAGE_LIMIT = 2000


def cmd_llvm_options(args: argparse.Namespace) -> int:
    """List the LLVM options inside Triton with their types, values and defaults."""
    options = llvm.list_options(args.pattern)
    if args.changed:
        options = [o for o in options if o.changed]
    if args.json:
        print(json.dumps([{**o.__dict__, "settable": o.settable} for o in options], indent=2))
        return 0 if options else 1
    if not options:
        what = "changed LLVM option" if args.changed else "LLVM option"
        close = difflib.get_close_matches(args.pattern or "", [o.name for o in llvm.list_options()], n=3)
        hint = f"; did you mean {', '.join(close)}?" if close and not args.changed else ""
        print(f"no {what} matches {env.quote(args.pattern or '*')}{hint}", file=sys.stderr)
        return 1
    rows = []
    for o in options:
        kind = o.type if not o.choices else f"enum{{{','.join(o.choices)}}}"
        rows.append([o.name, kind if len(kind) <= 40 else kind[:39] + "…",
                     format_value(o.value) + (" *" if o.specified else ""), format_value(o.default), o.help])
    print(table(rows, ["NAME", "TYPE", "VALUE", "DEFAULT", "HELP"]))
    print(f"\n{len(options)} option(s); * = specified on a command line; - = no value held (no default "
          "recorded, a boolOrDefault left unset) or one not read (list, bits and other types)", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """A masked attention kernel and the packaged attention under plain Triton and the Pipelines."""
    from . import demo  # its Pipelines are built when it loads, which imports Triton and opens LLVM's registry

    env.check_environment()
    return demo.run()


def version_text() -> str:
    """``tritonpatch X.Y.Z (triton A.B.C, native LLVM options: available)``, or ``unavailable: why``
    when the native module cannot reach the LLVM inside this Triton."""
    import triton  # the one import of Triton here: --version names its version

    try:
        llvm.native_info()
        native = "available"
    except NativeUnavailableError as exc:
        native = f"unavailable: {exc}"
    return f"tritonpatch {__version__} (triton {triton.__version__}, native LLVM options: {native})"


class _VersionAction(argparse.Action):
    """``--version``: print :func:`version_text` and exit (computed only when asked for, since it
    imports Triton)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser. Arguments it does not take are its own error, with its own usage:
    argparse would otherwise hand them back to the top-level parser, whose error shows only
    ``tritonpatch [-h] [--version] COMMAND ...``."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


TRACEBACK_HELP = "on an error, also print the Python traceback (as TRITONPATCH_LOG=debug does)"


def build_parser() -> argparse.ArgumentParser:
    """The ``tritonpatch`` parser. ``--traceback`` goes before or after the subcommand: the
    subcommands' copy sets it only when given, so it does not undo one given before."""
    parser = argparse.ArgumentParser(
        prog="tritonpatch", description="Patch Triton's compile pipeline: LLVM options, IR passes, inspection.")
    parser.add_argument("--version", action=_VersionAction,
                        help="print the tritonpatch and Triton versions and whether LLVM options are available")
    parser.add_argument("--traceback", action="store_true", help=TRACEBACK_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS, help=TRACEBACK_HELP)

    llvm_options = commands.add_parser(
        "llvm-options", parents=[common],
        help="list the LLVM options inside Triton (name, type, value, default, help)")
    llvm_options.add_argument("pattern", nargs="?", help="substring, or glob with * ? [ (case-insensitive)")
    llvm_options.add_argument("--json", action="store_true", help="print JSON instead of a table")
    llvm_options.add_argument("--changed", action="store_true",
                              help="only options that differ from their default or were specified")
    llvm_options.set_defaults(run=cmd_llvm_options)

    compare = commands.add_parser(
        "compare", parents=[common],
        help="compile a kernel under two pipelines and compare registers, spills, SASS, IR",
        description="SPEC is a TOML/JSON file: kernel = \"module:function\" or \"file.py:function\", "
                    "[signature] NAME = \"*fp16\"|\"i32\"|..., optional [constexprs] and [options] "
                    "(num_warps, num_stages). PIPE: default | disable-lsr | llvm:NAME[=VALUE],... | "
                    "passes:NAME,... | ptxas:FLAGS, items joined with ';'.")
    compare.add_argument("spec", nargs="?", help="kernel spec file (TOML or JSON)")
    compare.add_argument("--a", metavar="PIPE", help=f"first pipeline (default: {DEFAULT_A}, plain Triton)")
    compare.add_argument("--b", metavar="PIPE", help=f"second pipeline (default: {DEFAULT_B})")
    compare.add_argument("--target", help=f"GPU target to compile for (default: {DEFAULT_TARGET})")
    compare.add_argument("--json", action="store_true", help="print JSON instead of a table")
    compare.add_argument("--html", metavar="OUT", help="also write an HTML report with diffs and a chart")
    compare.add_argument("--cache-dir", metavar="DIR",
                         help="instead, inspect every kernel in a Triton cache dir (takes only --json)")
    compare.set_defaults(run=cmd_compare)

    demo = commands.add_parser(
        "demo", parents=[common],
        help="what the Pipelines do to two prefix-LM attention kernels, against plain Triton "
             "(compile-only on a CPU machine; timings vs FlexAttention/SDPA on a GPU)")
    demo.set_defaults(run=cmd_demo)

    bench = commands.add_parser(
        "bench", parents=[common],
        help="run the benchmarks (scripts/benchmarks/<name>.py of a source checkout); each writes JSON, "
             f"markdown and a plot into --out (default: ./{DEFAULT_BENCH_OUT})",
        description="Runs the benchmark scripts scripts/benchmarks/<name>.py of the source checkout tritonpatch "
                    "is installed from (pip install -e .; names starting with _ are their helpers), one after "
                    "another; each writes JSON, markdown and a plot into --out, "
                    f"./{DEFAULT_BENCH_OUT} unless given. Without names it lists them.")
    bench.add_argument("names", nargs="*", help="benchmarks to run (none: list them)")
    bench.add_argument("--list", action="store_true", help="list the available benchmarks")
    bench.add_argument("--out", default=DEFAULT_BENCH_OUT,
                       help=f"output directory, created if missing (default: ./{DEFAULT_BENCH_OUT})")
    bench.add_argument("--script-args", default="", metavar="ARGS",
                       help="extra arguments for every script, e.g. --script-args='--masks causal'")
    bench.set_defaults(run=cmd_bench)
    return parser


def error_message(exc: BaseException) -> str:
    """The error line's text: our own errors as they are, anything else with its type and how to see
    the traceback; cut to MESSAGE_LIMIT characters."""
    if isinstance(exc, (CommandError, TritonpatchError, OSError)):
        message = str(exc)
    else:
        message = f"{type(exc).__name__}: {exc} ({TRACEBACK_HINT})"
    if len(message) > MESSAGE_LIMIT:
        message = f"{message[:MESSAGE_LIMIT]}… ({len(message)} characters; {TRACEBACK_HINT})"
    return message


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; its exit status (2: an error, reported on one ``error:`` line)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    prog = f"{parser.prog} {args.command}"
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`tritonpatch llvm-options | head`): stop quietly
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        except (OSError, ValueError, AttributeError):
            pass
        return 141
    except Exception as exc:
        if wants_traceback(args):
            traceback.print_exception(exc)
        print(f"{prog}: error: {error_message(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
