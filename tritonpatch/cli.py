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


def pipeline_from_text(text: str):
    """A Pipeline from the CLI form: ``default`` (plain Triton), or ``;``-separated items
    ``disable-lsr``, ``llvm:NAME[=VALUE],...``, ``passes:NAME,...``, ``ptxas:FLAGS``."""
    from . import env
    from .errors import PipelineError
    from .pipeline import Pipeline, pipeline_from_environ

    environ: dict[str, str] = {}
    sections = {"llvm": env.LLVM_OPTIONS, "passes": env.PASSES, "ptxas": env.PTXAS_OPTIONS}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        if item in ("default", "none"):
            continue
        if item == "disable-lsr":
            environ[env.DISABLE_LSR] = "1"
            continue
        section, colon, value = item.partition(":")
        if not colon or section not in sections:
            raise PipelineError(f"pipeline {text!r}: bad item {item!r}; expected default, disable-lsr, "
                                "llvm:NAME[=VALUE],..., passes:NAME,... or ptxas:FLAGS")
        variable = sections[section]
        environ[variable] = f"{environ[variable]},{value}" if variable in environ and section != "ptxas" else value
    return pipeline_from_environ(environ) if environ else Pipeline()


def load_kernel_spec(path: str) -> dict:
    """Read a kernel spec (TOML or JSON): ``kernel = "module:function"`` (or ``"file.py:function"``),
    ``[signature]`` argument types, optional ``[constexprs]``, ``[options]`` (num_warps, ...) and
    ``[launch]`` (``grid``, ``outputs`` and ``[launch.args]``, used when a GPU is present)."""
    import importlib
    import importlib.util
    import os

    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".json"):
        spec = json.loads(raw)
    else:
        import tomllib

        spec = tomllib.loads(raw.decode())
    for key in ("kernel", "signature"):
        if key not in spec:
            raise ValueError(f"{path}: missing '{key}' (see `tritonpatch compare --help`)")
    module_name, _, attr = spec["kernel"].partition(":")
    if module_name.endswith(".py"):
        module_path = os.path.join(os.path.dirname(os.path.abspath(path)), module_name)
        loader = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_path)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    if not attr or not hasattr(module, attr):
        raise ValueError(f"{path}: kernel {spec['kernel']!r} names no attribute of {module_name}")
    launch = spec.get("launch")
    if launch is not None:
        from .inspect import check_launch

        try:
            check_launch(launch)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    return {"kernel": getattr(module, attr), "signature": spec["signature"],
            "constexprs": spec.get("constexprs", {}), "options": spec.get("options", {}), "launch": launch}


def cmd_compare(args: argparse.Namespace) -> int:
    """Compile one kernel under two pipelines and compare what came out."""
    from . import inspect

    if args.cache_dir:
        reports = inspect.cache_dir_reports(args.cache_dir)
        if args.json:
            print(json.dumps(reports, indent=2))
        else:
            rows = [[r["kernel"], r["directory"][:12], str(r["registers"]), str(r["local"]), str(r["dynamic_shared"]),
                     str(sum(r["sass_main_loop"].values()))] for r in reports]
            print(_table(rows, ["KERNEL", "ENTRY", "REGS", "LOCAL", "SHARED", "LOOP-SASS"]) if rows
                  else f"no cubin in {args.cache_dir}")
        return 0
    if not args.spec:
        raise SystemExit("tritonpatch compare: give a kernel SPEC file, or --cache-dir DIR")
    spec = load_kernel_spec(args.spec)
    reports = []
    for label, text in (("A", args.a), ("B", args.b)):
        pipeline = pipeline_from_text(text)
        print(f"compiling {spec['kernel'].__name__} for {args.target} with {label} ...", file=sys.stderr)
        reports.append(inspect.compile_report(spec["kernel"], spec["signature"], spec["constexprs"], pipeline,
                                              target=args.target, **spec["options"]))
    outputs_equal = None
    if spec["launch"]:
        import torch

        if torch.cuda.is_available():
            outputs = []
            for label, report in zip("AB", reports):
                print(f"timing {label} on {torch.cuda.get_device_name()} ...", file=sys.stderr)
                report.runtime_ms, produced = inspect.run_on_gpu(spec["kernel"], spec["launch"], spec["constexprs"],
                                                                 spec["options"], report.pipeline)
                outputs.append(produced)
            outputs_equal = inspect.bitwise_equal(*outputs)
        else:
            print("no CUDA GPU: the spec's [launch] section is skipped (compile-only comparison)", file=sys.stderr)
    comparison = inspect.compare(*reports, outputs_equal=outputs_equal)
    print(json.dumps(comparison.to_dict(), indent=2) if args.json else inspect.format_comparison(comparison))
    if args.html:
        with open(args.html, "w") as f:
            f.write(inspect.comparison_html(comparison))
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The seed kernel and the packaged attention under plain Triton vs tuned Pipelines."""
    from . import demo

    return demo.run()


def _benchmark_scripts() -> dict:
    """``scripts/bench_<name>.py`` of the source checkout tritonpatch runs from, by name."""
    import pathlib

    scripts = pathlib.Path(__file__).resolve().parent.parent / "scripts"
    if not scripts.is_dir():
        raise FileNotFoundError(f"no benchmark scripts at {scripts}: `tritonpatch bench` runs from a source "
                                "checkout installed with `pip install -e .`")
    return {path.stem[len("bench_"):]: path for path in sorted(scripts.glob("bench_*.py"))}


def cmd_bench(args: argparse.Namespace) -> int:
    """Run benchmark scripts one after another; each writes JSON, markdown and a plot into --out."""
    import os
    import shlex
    import subprocess
    import time

    scripts = _benchmark_scripts()
    if args.list or not args.names:
        print("\n".join(f"{name:<20} {path}" for name, path in scripts.items()))
        return 0
    unknown = [name for name in args.names if name not in scripts]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(scripts)}")
    os.makedirs(args.out, exist_ok=True)
    failed = []
    for index, name in enumerate(args.names, 1):
        command = [sys.executable, str(scripts[name]), "--out", args.out, *shlex.split(args.script_args)]
        print(f"[{index}/{len(args.names)}] {name}: {' '.join(command)}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        status = subprocess.call(command)
        outcome = "done" if status == 0 else f"FAILED (exit {status})"
        print(f"[{index}/{len(args.names)}] {name}: {outcome} in {time.perf_counter() - start:.0f} s",
              file=sys.stderr, flush=True)
        if status:
            failed.append(name)
    return 1 if failed else 0


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

    compare = commands.add_parser(
        "compare", help="compile a kernel under two pipelines and compare registers, spills, SASS, IR",
        description="SPEC is a TOML/JSON file: kernel = \"module:function\" or \"file.py:function\", "
                    "[signature] NAME = \"*fp16\"|\"i32\"|..., optional [constexprs] and [options] "
                    "(num_warps, num_stages). PIPE: default | disable-lsr | llvm:NAME[=VALUE],... | "
                    "passes:NAME,... | ptxas:FLAGS, items joined with ';'.")
    compare.add_argument("spec", nargs="?", help="kernel spec file (TOML or JSON)")
    compare.add_argument("--a", default="default", metavar="PIPE", help="first pipeline (default: plain Triton)")
    compare.add_argument("--b", default="disable-lsr", metavar="PIPE", help="second pipeline (default: disable-lsr)")
    compare.add_argument("--target", default="sm_90", help="GPU target to compile for (default: sm_90)")
    compare.add_argument("--json", action="store_true", help="print JSON instead of a table")
    compare.add_argument("--html", metavar="OUT", help="also write an HTML report with diffs and a chart")
    compare.add_argument("--cache-dir", metavar="DIR", help="instead, inspect every kernel in a Triton cache dir")
    compare.set_defaults(run=cmd_compare)

    demo = commands.add_parser(
        "demo", help="the seed report's kernel and the packaged attention under plain vs tuned pipelines "
                     "(compile-only on a CPU machine; timings vs FlexAttention/SDPA on a GPU)")
    demo.set_defaults(run=cmd_demo)

    bench = commands.add_parser(
        "bench", help="run benchmark scripts (scripts/bench_<name>.py) writing JSON, markdown and plots")
    bench.add_argument("names", nargs="*", help="benchmarks to run (none: list them)")
    bench.add_argument("--list", action="store_true", help="list the available benchmarks")
    bench.add_argument("--out", default="docs/benchmarks", help="output directory (default: docs/benchmarks)")
    bench.add_argument("--script-args", default="", metavar="ARGS",
                       help="extra arguments for every script, e.g. --script-args='--masks causal'")
    bench.set_defaults(run=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (TritonpatchError, ValueError, OSError) as exc:
        print(f"tritonpatch: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
