"""``tritonpatch compare``: one kernel compiled under two Pipelines (``--a``, ``--b``), what
changed between them, and with a GPU their timings and whether their outputs are bitwise equal; or
(``--cache-dir``) the kernels of a Triton cache with the Pipeline that built each."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import sys

from . import env, inspection, targets
from ._cli_common import TRACEBACK_HINT, CommandError, table, wants_traceback
from ._cli_spec import check_launch_arguments, load_kernel_spec
from .hooks import install
from .pipeline import Pipeline

__all__ = ["cmd_compare", "pipeline_from_text", "DEFAULT_A", "DEFAULT_B", "DEFAULT_TARGET"]

DEFAULT_A = "default"
DEFAULT_B = "disable-lsr"
DEFAULT_TARGET = "sm_90"
COMPILE_REPEAT = 3  # timed compiles per pipeline in `compare`; the report shows their median


def pipeline_from_text(text: str, flag: str = "--a"):
    """The Pipeline of a ``--a`` / ``--b`` value: its text form (:meth:`Pipeline.parse`), with
    ``flag`` naming the option the text came from in errors."""
    return Pipeline.parse(text, where=flag)


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
    print(table(rows, ["KERNEL", "ENTRY", "REGS", "LOCAL", "SHARED", "LOOP-SASS", "PIPELINE"]) if rows
          else f"no readable cubin in {args.cache_dir}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Compile one kernel under two pipelines and compare what came out. Every argument and the
    spec are checked before the first compile."""
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
        if spec["launch"]:
            check_launch_arguments(spec["kernel"], spec["signature"], spec["constexprs"], spec["launch"]["args"])
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
                reports.append(inspection.compile_report(spec["kernel"], spec["signature"], spec["constexprs"],
                                                         pipeline, target=target, warm_up=True,
                                                         repeat=COMPILE_REPEAT, **spec["options"]))
            except Exception as exc:
                if wants_traceback(args):
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
                report.runtime_ms, produced = inspection.run_on_gpu(spec["kernel"], spec["launch"],
                                                                    spec["constexprs"], spec["options"],
                                                                    report.pipeline)
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
    return " ".join(["tritonpatch", *(shlex.quote(word) for word in args.argv)])
