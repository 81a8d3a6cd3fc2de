"""The ``tritonpatch`` command line. One function per subcommand; ``main`` dispatches.

A mistake in the arguments, a spec, the environment or the kernel ends the command with one line,
``tritonpatch COMMAND: error: ...``, and exit status 2, like argparse's own errors; ``--traceback``
(or ``TRITONPATCH_LOG=debug``) adds the Python traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys

from . import env
from .errors import TritonpatchError
from .pipeline import Pipeline

DEFAULT_A = "default"
DEFAULT_B = "disable-lsr"
DEFAULT_TARGET = "sm_90"
COMPILE_REPEAT = 3  # timed compiles per pipeline in `compare`; the report shows their median
DEFAULT_BENCH_OUT = "bench-out"  # relative to the working directory, never into the checkout's docs/
TRACEBACK_HINT = "--traceback or TRITONPATCH_LOG=debug shows the full traceback"
MESSAGE_LIMIT = 2000


class CommandError(Exception):
    """A failure the user can fix (bad argument, spec, kernel); its message is the error line."""


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
        print(f"no {what} matches {env.quote(args.pattern or '*')}", file=sys.stderr)
        return 1
    rows = []
    for o in options:
        kind = o.type if not o.choices else f"enum{{{','.join(o.choices)}}}"
        rows.append([o.name, kind if len(kind) <= 40 else kind[:39] + "…",
                     _format_value(o.value) + (" *" if o.specified else ""), _format_value(o.default), o.help])
    print(_table(rows, ["NAME", "TYPE", "VALUE", "DEFAULT", "HELP"]))
    print(f"\n{len(options)} option(s); * = specified on a command line", file=sys.stderr)
    return 0


def pipeline_from_text(text: str, flag: str = "--a"):
    """The Pipeline of a ``--a`` / ``--b`` value: its text form (:meth:`Pipeline.parse`), with
    ``flag`` naming the option the text came from in errors."""
    return Pipeline.parse(text, where=flag)


_SPEC_KEYS = ("kernel", "signature", "constexprs", "options", "launch")


def _read_spec_file(path: str) -> dict:
    """The table a TOML/JSON spec file holds."""
    if not os.path.isfile(path):
        raise CommandError(f"spec file {path} {'is not a file' if os.path.exists(path) else 'does not exist'}")
    with open(path, "rb") as f:
        raw = f.read()
    language = "JSON" if path.lower().endswith(".json") else "TOML"
    try:
        if language == "JSON":
            spec = json.loads(raw)
        else:
            try:
                import tomllib
            except ImportError:
                raise CommandError(f"{path}: reading TOML needs Python 3.11 or later; write the spec as JSON") from None
            spec = tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise CommandError(f"{path}: not valid {language}: {exc}") from None
    if not isinstance(spec, dict):
        raise CommandError(f"{path}: expected a table with kernel = \"module:function\" and [signature], "
                           f"got a {type(spec).__name__}")
    return spec


def _import_kernel_module(module_name: str, spec_path: str):
    """The module a spec's ``kernel = "module:function"`` names: a module on ``sys.path``, or a
    ``.py`` file relative to the spec."""
    import importlib
    import importlib.util

    module_path = os.path.join(os.path.dirname(os.path.abspath(spec_path)), module_name)
    if module_name.endswith(".py") and not os.path.isfile(module_path):
        raise CommandError(f"{spec_path}: kernel file {module_path} does not exist")
    try:
        if not module_name.endswith(".py"):
            return importlib.import_module(module_name)
        loader = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_path)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        return module
    except Exception as exc:  # the module is missing, or it raised while it was imported
        if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.split(".")[0] == module_name.split(".")[0]:
            raise CommandError(f"{spec_path}: no module named {exc.name!r} (a kernel is \"module:function\" with the "
                               "module on sys.path, or \"file.py:function\" next to the spec)") from exc
        raise CommandError(f"{spec_path}: importing the kernel module {module_name!r} failed: "
                           f"{type(exc).__name__}: {exc} ({TRACEBACK_HINT})") from exc


def load_kernel_spec(path: str) -> dict:
    """Read a kernel spec (TOML or JSON): ``kernel = "module:function"`` (or ``"file.py:function"``),
    ``[signature]`` argument types, optional ``[constexprs]``, ``[options]`` (num_warps, ...) and
    ``[launch]`` (``grid``, ``outputs`` and ``[launch.args]``, used when a GPU is present). A mistake
    in the file raises :class:`CommandError` naming the file and what is wrong."""
    import difflib

    spec = _read_spec_file(path)
    for key in spec:
        if key not in _SPEC_KEYS:
            close = difflib.get_close_matches(key, _SPEC_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise CommandError(f"{path}: unknown key {env.quote(key)}{hint}; known keys: {', '.join(_SPEC_KEYS)}")
    for key in ("kernel", "signature"):
        if key not in spec:
            raise CommandError(f"{path}: missing '{key}' (see `tritonpatch compare --help`)")
    for key in ("signature", "constexprs", "options", "launch"):
        if key in spec and not isinstance(spec[key], dict):
            raise CommandError(f"{path}: [{key}] must be a table, got {env.quote(spec[key])}")
    kernel = spec["kernel"]
    module_name, colon, attr = kernel.partition(":") if isinstance(kernel, str) else ("", "", "")
    if not (module_name and colon and attr):
        raise CommandError(f"{path}: kernel = {env.quote(kernel)}: expected \"module:function\" or "
                           "\"file.py:function\"")
    module = _import_kernel_module(module_name, path)
    if not hasattr(module, attr):
        raise CommandError(f"{path}: kernel {env.quote(kernel)}: {module_name} has no attribute {attr!r}")
    launch = spec.get("launch")
    if launch is not None:
        from .inspection import check_launch

        try:
            check_launch(launch)
        except ValueError as exc:
            raise CommandError(f"{path}: {exc}") from None
    return {"kernel": getattr(module, attr), "signature": spec["signature"],
            "constexprs": spec.get("constexprs", {}), "options": spec.get("options", {}), "launch": launch}


def _check_output_path(flag: str, path: str) -> None:
    """Fail before any work when ``path`` cannot be written (no such directory, or a directory)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not path.strip():
        raise CommandError(f"{flag} is empty; give a file name")
    if os.path.isdir(path):
        raise CommandError(f"{flag} {path} is a directory; give a file name")
    if not os.path.isdir(folder):
        raise CommandError(f"{flag} {path}: directory {folder} does not exist")


def _compile_failure(exc: Exception) -> str:
    """What the compiler said, without Triton's wrapping: ptxas's own log for a ptxas failure."""
    from triton.runtime.errors import PTXASError

    if isinstance(exc, PTXASError):
        log = re.search(r"`ptxas` stderr:\n(.*?)\nRepro command", str(exc), re.S)
        return "ptxas failed: " + (log.group(1).strip() if log else str(exc))
    return f"{type(exc).__name__}: {exc}".strip()


def _cmd_compare_cache_dir(args: argparse.Namespace) -> int:
    from . import inspection

    given = [flag for flag, value in (("SPEC", args.spec), ("--a", args.a), ("--b", args.b),
                                      ("--target", args.target), ("--html", args.html)) if value is not None]
    if given:
        raise CommandError(f"--cache-dir lists the kernels of a Triton cache; it takes no {', '.join(given)}")
    if not os.path.isdir(args.cache_dir):
        what = "is not a directory" if os.path.exists(args.cache_dir) else "does not exist"
        raise CommandError(f"--cache-dir {args.cache_dir} {what} (Triton's default cache is ~/.triton/cache)")
    reports = inspection.cache_dir_reports(args.cache_dir)
    for report in reports:
        if "error" in report:
            print(f"tritonpatch compare: warning: skipped {report['directory']}/{report['kernel']}.cubin: "
                  f"{report['error']}", file=sys.stderr)
    if args.json:
        print(json.dumps(reports, indent=2))
        return 0
    rows = [[r["kernel"], r["directory"][:12], str(r["registers"]), str(r["local"]), str(r["dynamic_shared"]),
             str(sum(r["sass_main_loop"].values())), r["pipeline"]] for r in reports if "error" not in r]
    print(_table(rows, ["KERNEL", "ENTRY", "REGS", "LOCAL", "SHARED", "LOOP-SASS", "PIPELINE"]) if rows
          else f"no readable cubin in {args.cache_dir}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Compile one kernel under two pipelines and compare what came out. Every argument and the
    spec are checked before the first compile."""
    import contextlib
    import io

    from . import inspection, targets
    from .hooks import install

    if args.cache_dir is not None:
        return _cmd_compare_cache_dir(args)
    if not args.spec:
        raise CommandError("give a kernel SPEC file, or --cache-dir DIR")
    target = DEFAULT_TARGET if args.target is None else args.target
    try:
        capability = targets.parse_target(target, where="--target").arch
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    env.check_environment()  # a malformed TRITONPATCH_* variable is reported now, as itself,
    install()                # not as a compile failure
    pipelines = {"A": pipeline_from_text(DEFAULT_A if args.a is None else args.a, "--a"),
                 "B": pipeline_from_text(DEFAULT_B if args.b is None else args.b, "--b")}
    if args.html is not None:
        _check_output_path("--html", args.html)
    spec = load_kernel_spec(args.spec)
    try:
        targets.check_kernel_arguments(spec["kernel"], spec["signature"], spec["constexprs"],
                                       where=("[signature]", "[constexprs]"))
        targets.check_compile_options(spec["options"], capability, where="[options]")
    except ValueError as exc:
        raise CommandError(f"{args.spec}: {exc}") from None
    name = spec["kernel"].__name__
    reports = []
    for label, pipeline in pipelines.items():
        print(f"compiling {name} for {target} with {label} (once untimed, {COMPILE_REPEAT} times timed) ...",
              file=sys.stderr)
        # Triton prints the whole PTX on stdout when ptxas fails; keep stdout for the report.
        with contextlib.redirect_stdout(io.StringIO()) as compiler_output:
            try:
                # Warm: the first compile in a process also pays for imports and LLVM set-up, which
                # made A look slower than B when only A paid for it.
                reports.append(inspection.compile_report(spec["kernel"], spec["signature"], spec["constexprs"], pipeline,
                                                      target=target, warm_up=True, repeat=COMPILE_REPEAT,
                                                      **spec["options"]))
            except Exception as exc:
                if _wants_traceback(args):
                    sys.stderr.write(compiler_output.getvalue())
                raise CommandError(f"{name} does not compile for {target} with {label} "
                                   f"({inspection.describe_pipeline(pipeline)}): {_compile_failure(exc)} "
                                   f"({TRACEBACK_HINT})") from exc
        sys.stderr.write(compiler_output.getvalue())
    outputs_equal = None
    if spec["launch"]:
        import torch

        if torch.cuda.is_available():
            outputs = []
            for label, report in zip("AB", reports):
                print(f"timing {label} on {torch.cuda.get_device_name()} ...", file=sys.stderr)
                report.runtime_ms, produced = inspection.run_on_gpu(spec["kernel"], spec["launch"], spec["constexprs"],
                                                                 spec["options"], report.pipeline)
                outputs.append(produced)
            outputs_equal = inspection.bitwise_equal(*outputs)
        else:
            print("no CUDA GPU: the spec's [launch] section is skipped (compile-only comparison)", file=sys.stderr)
    comparison = inspection.compare(*reports, outputs_equal=outputs_equal)
    if args.html is not None:
        with open(args.html, "w") as f:
            f.write(inspection.comparison_html(comparison, command=_command_line(args)))
        print(f"wrote {args.html}", file=sys.stderr)
    print(json.dumps(comparison.to_dict(), indent=2) if args.json
          else inspection.format_comparison(comparison, html_path=args.html))
    return 0


def _command_line(args: argparse.Namespace) -> str:
    """The command as typed (for the HTML report's header)."""
    import shlex

    return " ".join(["tritonpatch", *(shlex.quote(word) for word in args.argv)])


def cmd_demo(args: argparse.Namespace) -> int:
    """A masked attention kernel and the packaged attention under plain Triton and the Pipelines."""
    from . import demo

    env.check_environment()
    return demo.run()


def _benchmark_scripts() -> dict:
    """``scripts/bench_<name>.py`` of the source checkout tritonpatch runs from, by name."""
    import pathlib

    scripts = pathlib.Path(__file__).resolve().parent.parent / "scripts"
    if not scripts.is_dir():
        raise CommandError(f"no benchmark scripts at {scripts}: `tritonpatch bench` runs from a source "
                                "checkout installed with `pip install -e .`")
    return {path.stem[len("bench_"):]: path for path in sorted(scripts.glob("bench_*.py"))}


def cmd_bench(args: argparse.Namespace) -> int:
    """Run benchmark scripts one after another; each writes JSON, markdown and a plot into --out
    (./bench-out unless given)."""
    import shlex
    import subprocess
    import time

    scripts = _benchmark_scripts()
    if args.list and args.names:
        raise CommandError("--list takes no benchmark names (give names to run them)")
    if args.list or not args.names:
        print("\n".join(f"{name:<20} {path}" for name, path in scripts.items()))
        return 0
    unknown = [name for name in args.names if name not in scripts]
    if unknown:
        raise CommandError(f"unknown benchmark(s) {', '.join(env.quote(n) for n in unknown)}; "
                           f"available: {', '.join(scripts)}")
    try:
        script_args = shlex.split(args.script_args)
    except ValueError as exc:
        raise CommandError(f"--script-args {env.quote(args.script_args)}: {exc} (quote it like a shell command line)") \
            from None
    if not args.out.strip() or (os.path.exists(args.out) and not os.path.isdir(args.out)):
        raise CommandError(f"--out {env.quote(args.out)} is not a directory")
    os.makedirs(args.out, exist_ok=True)
    failed = []
    for index, name in enumerate(args.names, 1):
        command = [sys.executable, str(scripts[name]), "--out", args.out, *script_args]
        print(f"[{index}/{len(args.names)}] {name}: {' '.join(command)}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        status = subprocess.call(command)
        outcome = "done" if status == 0 else f"FAILED (exit {status})"
        print(f"[{index}/{len(args.names)}] {name}: {outcome} in {time.perf_counter() - start:.0f} s",
              file=sys.stderr, flush=True)
        if status:
            failed.append(name)
    return 1 if failed else 0


def version_text() -> str:
    """``tritonpatch X.Y.Z (triton A.B.C, native LLVM options: available)``, or ``unavailable: why``
    when the native module cannot reach the LLVM inside this Triton."""
    import triton

    from . import __version__, llvm
    from .errors import NativeUnavailableError

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tritonpatch", description="Patch Triton's compile pipeline: LLVM options, IR passes, inspection.")
    parser.add_argument("--version", action=_VersionAction,
                        help="print the tritonpatch and Triton versions and whether LLVM options are available")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--traceback", action="store_true",
                        help="on an error, also print the Python traceback (as TRITONPATCH_LOG=debug does)")

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
        help="run the benchmarks (scripts/bench_<name>.py of a source checkout); each writes JSON, markdown "
             f"and a plot into --out (default: ./{DEFAULT_BENCH_OUT})",
        description="Runs the benchmark scripts scripts/bench_<name>.py of the source checkout tritonpatch is "
                    "installed from (pip install -e .), one after another; each writes JSON, markdown and a plot "
                    f"into --out, ./{DEFAULT_BENCH_OUT} unless given. Without names it lists them.")
    bench.add_argument("names", nargs="*", help="benchmarks to run (none: list them)")
    bench.add_argument("--list", action="store_true", help="list the available benchmarks")
    bench.add_argument("--out", default=DEFAULT_BENCH_OUT,
                       help=f"output directory, created if missing (default: ./{DEFAULT_BENCH_OUT})")
    bench.add_argument("--script-args", default="", metavar="ARGS",
                       help="extra arguments for every script, e.g. --script-args='--masks causal'")
    bench.set_defaults(run=cmd_bench)
    return parser


def _wants_traceback(args: argparse.Namespace) -> bool:
    """``--traceback``, or ``TRITONPATCH_LOG=debug``."""
    try:
        return args.traceback or env.log_level() == "debug"
    except TritonpatchError:  # a malformed TRITONPATCH_LOG is reported where it is read
        return False


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
        if _wants_traceback(args):
            import traceback

            traceback.print_exception(exc)
        print(f"{prog}: error: {error_message(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
