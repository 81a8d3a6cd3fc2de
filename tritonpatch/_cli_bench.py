"""``tritonpatch bench``: the product benchmarks of a source checkout, ``scripts/benchmarks/<name>.py``
(every ``.py`` there whose name does not start with ``_``; the others are their shared helpers),
run one after another, each writing JSON, markdown and a plot into ``--out``."""
from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import subprocess
import sys
import time

from . import env
from ._cli_common import CommandError

__all__ = ["cmd_bench", "benchmark_scripts", "BENCHMARKS", "DEFAULT_BENCH_OUT"]

DEFAULT_BENCH_OUT = "bench-out"  # relative to the working directory, never into the checkout's docs/
BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "benchmarks"  # of the source checkout


def benchmark_scripts(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """The benchmarks in ``folder`` by name: every ``<name>.py`` whose name does not start with ``_``."""
    if not folder.is_dir():
        raise CommandError(f"no benchmark scripts at {folder}: `tritonpatch bench` runs from a source "
                           "checkout installed with `pip install -e .`")
    return {path.stem: path for path in sorted(folder.glob("*.py")) if not path.name.startswith("_")}


def needs_gpu(script: pathlib.Path) -> bool:
    """Whether the benchmark measures on a CUDA GPU: it calls ``_common.require_gpu``, which stops it with
    a message where there is none (its ``--from-json`` and similar modes run without one)."""
    return "require_gpu(" in script.read_text(encoding="utf-8")


def takes_compile_only(script: pathlib.Path) -> bool:
    """Whether the benchmark declares ``--compile-only`` (compiles its variants for sm_90 without a GPU)."""
    return '"--compile-only"' in script.read_text(encoding="utf-8")


def cmd_bench(args: argparse.Namespace) -> int:
    """Run benchmark scripts one after another; each writes JSON, markdown and a plot into --out
    (./bench-out unless given)."""
    scripts = benchmark_scripts(BENCHMARKS)
    if args.list and args.names:
        raise CommandError("--list takes no benchmark names (give names to run them)")
    if args.list or not args.names:
        print("\n".join(f"{name:<22} {path}{'  (measures on a CUDA GPU)' if needs_gpu(path) else ''}"
                        for name, path in scripts.items()))
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
    created = not os.path.exists(args.out)
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
    if failed:
        compile_only = [name for name in failed if takes_compile_only(scripts[name])]
        example = (f"--script-args=--compile-only (no GPU needed: {', '.join(compile_only)})" if compile_only
                   else "--script-args=--help (each script's options)")
        print(f"a script's own options (those its messages name) are passed with --script-args, e.g. {example}",
              file=sys.stderr)
        if created and not os.listdir(args.out):
            os.rmdir(args.out)          # nothing was written: leave no empty folder behind
    return 1 if failed else 0
