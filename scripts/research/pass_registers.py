"""Registers and spills of kernels compiled for sm_90 under each pass pipeline (no GPU needed).

A pass that copies a loop or keeps a value live across it can push a kernel that sits at the register
limit into spilling, which costs more than the mask work the pass removes. This probe compiles the
FlexAttention template fixtures (``tests/_support/data/flex``) and the kernels written apart from the
passes (``tests/_support/data/unseen_kernels``) under each pipeline and prints what ``ptxas -v`` (the
one Triton ships, for sm_90a) reports: registers per thread and spill-store bytes.

    python -m scripts.research.pass_registers [--kernels NAME,...] [--pipelines "skip-masked-blocks;..."]

``--pipelines``: pipelines separated by ``;``, each a comma-separated pass list as
``TRITONPATCH_PASSES`` takes it (an empty item: unpatched). Default: unpatched, skip, elide,
skip+elide, all three. ``FLEX_DIR``: read the FlexAttention fixtures from another folder of the
same layout (a fixture with its mask edited, say).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

os.environ.setdefault("TRITON_ALWAYS_COMPILE", "1")

import tritonpatch  # noqa: E402
from tritonpatch.inspection.tools import tool_path  # noqa: E402
from tritonpatch.targets import compile_for_target  # noqa: E402

SUPPORT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "_support"
FLEX = pathlib.Path(os.environ.get("FLEX_DIR", SUPPORT / "data" / "flex"))
DEFAULT_PIPELINES = ";skip-masked-blocks;elide-uniform-masks;skip-masked-blocks,elide-uniform-masks;" \
                    "skip-masked-blocks,elide-uniform-masks,hoist-masks"


def flex_kernels() -> dict:
    """name -> (jit function, signature, constexprs, options) of the score_mod template fixtures."""
    import importlib.util
    kernels = {}
    for meta_path in sorted(FLEX.glob("score_mod_*.json")):
        meta = json.loads(meta_path.read_text())
        spec = importlib.util.spec_from_file_location(f"flex_{meta_path.stem}", meta_path.with_suffix(".py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kernels[f"flex/{meta_path.stem}"] = (getattr(module, meta["kernel"]), meta["signature"], {},
                                             {"num_warps": meta["num_warps"], "num_stages": meta["num_stages"],
                                              "aligned_pointers": True})
    return kernels


def unseen_kernels() -> dict:
    sys.path.insert(0, str(SUPPORT))
    from unseen_kernels import NAMES, load
    kernels = {}
    for name in NAMES:
        spec = load(name).compile_spec()
        kernels[name] = (spec["fn"], spec["signature"], spec["constexprs"], spec["options"])
    return kernels


def ptxas_usage(ptx: str) -> tuple[int, int]:
    """(registers, spill-store bytes) that ``ptxas -v`` reports for ``ptx`` on sm_90a."""
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "kernel.ptx")
        with open(path, "w") as handle:
            handle.write(ptx)
        log = subprocess.run([tool_path("ptxas"), "-v", "-arch=sm_90a", path, "-o", os.devnull],
                             capture_output=True, text=True).stderr
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    if not registers or not spills:
        raise RuntimeError(f"no register or spill line in ptxas -v output:\n{log}")
    return int(registers.group(1)), int(spills.group(1))


def usage(kernel, passes: list[str]) -> str:
    fn, signature, constexprs, options = kernel
    try:
        with tritonpatch.options(passes=passes):
            compiled = compile_for_target(fn, signature, constexprs, target="sm_90", **options)
    except Exception as error:                     # a pipeline the kernel fails under: say so in its cell
        return f"error ({type(error).__name__})"
    registers, spilled = ptxas_usage(compiled.asm["ptx"])
    return f"{registers} / {spilled}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", help="comma-separated names (flex/<fixture> or an unseen kernel); default all")
    parser.add_argument("--pipelines", default=DEFAULT_PIPELINES)
    args = parser.parse_args()
    kernels = {**flex_kernels(), **unseen_kernels()}
    names = args.kernels.split(",") if args.kernels else list(kernels)
    unknown = [n for n in names if n not in kernels]
    if unknown:
        raise SystemExit(f"unknown kernel {unknown[0]!r}; choose from {', '.join(kernels)}")
    pipelines = [[p for p in item.split(",") if p] for item in args.pipelines.split(";")]
    labels = [",".join(p) or "unpatched" for p in pipelines]
    print("registers / spill-store bytes per thread (ptxas -v, sm_90a)")
    print("| kernel | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for name in names:
        print(f"| {name} | " + " | ".join(usage(kernels[name], p) for p in pipelines) + " |", flush=True)


if __name__ == "__main__":
    main()
