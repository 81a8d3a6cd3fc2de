"""Capture, store, compare and decide: the machinery behind the golden IR corpus.

A corpus folder ``tests/ir_corpus/<triton version>/`` holds, for every kernel of
:data:`kernels.CORPUS`, ``<kernel>.ttir`` (Triton's ``make_ttir`` output: the input of the ttir
passes) and ``<kernel>.ttgir`` (``make_ttgir`` output: the input of the ttgir passes), compiled for
sm_90 with no tritonpatch pass active, plus ``decisions.json``: what each built-in pass reports
when it runs on that stored text.

The one normalisation: the stored IR has no location information (the ``#locN = loc(...)``
alias lines and every `` loc(...)`` suffix are removed). Locations hold machine paths, source
line numbers of kernels edited elsewhere, and names numbered in process order (generated mask
functions), and they make up half of the text. Everything else (value names, attribute and type
syntax, op order) is kept as Triton prints it. The passes' real input carries locations, so the
test also runs every pass on the freshly printed IR, locations included, and expects the same
decisions.
"""
from __future__ import annotations

import contextlib
import difflib
import json
import os
import tempfile
from typing import Iterator

import triton

import tritonpatch
from tritonpatch.passes import parse_module, pass_info, pass_stage, resolved_options, validate_pass_spec

from .kernels import CORPUS, CorpusKernel

CORPUS_ROOT = os.path.dirname(os.path.abspath(__file__))
STAGES = ("ttir", "ttgir")
PASSES = ("skip-masked-blocks", "elide-uniform-masks", "hoist-masks")
DECISIONS_FILE = "decisions.json"
REGENERATE = "python scripts/update_ir_corpus.py"
TARGET = ("cuda", 90, 32)   # GPUTarget(backend, arch, warp size): sm_90


def version_folder(version: str | None = None) -> str:
    """``tests/ir_corpus/<version>`` (default: the installed Triton's)."""
    return os.path.join(CORPUS_ROOT, version or triton.__version__)


def without_locations(text: str) -> str:
    """``text`` without its location information: the ``#loc`` alias lines and every
    `` loc(...)`` (balanced parentheses, string literals skipped)."""
    kept = [line for line in text.splitlines(keepends=True) if not line.startswith("#loc")]
    text, out, i = "".join(kept), [], 0
    while i < len(text):
        if text[i] == '"':
            end = _string_end(text, i)
            out.append(text[i:end])
            i = end
        elif text.startswith(" loc(", i):
            i = _group_end(text, i + len(" loc"))
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _string_end(text: str, start: int) -> int:
    """Index just past the string literal that opens at ``text[start]``."""
    i = start + 1
    while text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _group_end(text: str, start: int) -> int:
    """Index just past the parenthesised group that opens at ``text[start]``."""
    depth, i = 0, start
    while True:
        if text[i] == '"':
            i = _string_end(text, i)
            continue
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return i


@contextlib.contextmanager
def private_triton_cache() -> Iterator[None]:
    """Compile into an empty Triton cache, so no IR ever comes from a stale artifact."""
    previous = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="tritonpatch-ir-corpus-") as folder:
        os.environ["TRITON_CACHE_DIR"] = folder
        try:
            yield
        finally:
            if previous is None:
                del os.environ["TRITON_CACHE_DIR"]
            else:
                os.environ["TRITON_CACHE_DIR"] = previous


def compile_ir(kernel: CorpusKernel) -> dict[str, str]:
    """``{"ttir": ..., "ttgir": ...}`` of ``kernel`` compiled for sm_90 under the empty Pipeline
    (so no pass from the environment rewrites what is captured), as Triton prints them."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=kernel.fn, signature=kernel.signature, constexprs=kernel.constexprs, attrs=kernel.attrs)
    with tritonpatch.use_pipeline(tritonpatch.Pipeline()):
        compiled = triton.compile(source, target=GPUTarget(*TARGET),
                                  options={"num_warps": kernel.num_warps, "num_stages": kernel.num_stages,
                                           "enable_fp_fusion": True})
    return {stage: compiled.asm[stage] for stage in STAGES}


def ir_path(folder: str, kernel_name: str, stage: str) -> str:
    return os.path.join(folder, f"{kernel_name}.{stage}")


def stored_kernels(folder: str) -> set[str]:
    """Names of the kernels that have IR files in ``folder``."""
    return {name.rsplit(".", 1)[0] for name in os.listdir(folder) if name.rsplit(".", 1)[-1] in STAGES}


def read_ir(folder: str, kernel_name: str, stage: str) -> str:
    with open(ir_path(folder, kernel_name, stage), encoding="utf-8") as handle:
        return handle.read()


def read_decisions(folder: str) -> dict:
    """``{kernel: {pass: report}}`` from ``folder``'s decisions.json ({} when there is none)."""
    path = os.path.join(folder, DECISIONS_FILE)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["decisions"]


def write_decisions(folder: str, decisions: dict) -> None:
    """Write decisions.json: a header, what each kernel is, then one line per kernel and pass
    (so ``git diff`` shows each moved verdict on its own line)."""
    what = ",\n".join(f"  {json.dumps(kernel.name)}: {json.dumps(kernel.what)}"
                      for kernel in CORPUS if kernel.name in decisions)
    blocks = ",\n".join(
        f"  {json.dumps(name)}: {{\n" + ",\n".join(f"   {json.dumps(pass_name)}: {json.dumps(report, sort_keys=True)}"
                                                 for pass_name, report in decisions[name].items()) + "\n  }"
        for name in sorted(decisions))
    how = f"each pass alone, default options, on the stored IR of its stage; regenerate: {REGENERATE}"
    text = "\n".join(["{", f' "triton": {json.dumps(os.path.basename(folder))},',
                      f' "target": {json.dumps(f"GPUTarget{TARGET}")},', f' "how": {json.dumps(how)},',
                      ' "kernels": {', what, " },", ' "decisions": {', blocks, " }", "}", ""])
    with open(os.path.join(folder, DECISIONS_FILE), "w", encoding="utf-8") as handle:
        handle.write(text)


class Verifier:
    """Parses and verifies IR text with Triton in one context holding the NVIDIA dialects."""

    def __init__(self):
        from triton._C.libtriton import ir
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend

        self.context = ir.context()
        ir.load_dialects(self.context)
        make_backend(GPUTarget(*TARGET)).load_dialects(self.context)

    def problem(self, text: str) -> str | None:
        """None when ``text`` parses and verifies, else why not."""
        try:
            parse_module(text, self.context)
        except Exception as exc:  # noqa: BLE001 - any rejection is the answer
            return f"{type(exc).__name__}: {exc}"
        return None


def decide(pass_name: str, text: str) -> tuple[dict, str]:
    """(report, rewritten text) of pass ``pass_name`` run alone with its default options on
    ``text``. The report is the pass's counts, or ``{"raised": "<error>"}`` when it raises (the
    compile would then fall back to the unpatched IR with a warning)."""
    info = pass_info(pass_name)
    try:
        rewritten, counts = info.run(text, resolved_options(validate_pass_spec(pass_name)))
    except Exception as exc:  # noqa: BLE001 - a raising pass is a recorded decision
        return {"raised": f"{type(exc).__name__}: {exc}"}, text
    return json.loads(json.dumps(counts)), rewritten   # as decisions.json reads back (tuples become lists)


def kernel_decisions(ir: dict[str, str], verifier: Verifier) -> tuple[dict, list[str]]:
    """``{pass: report}`` of every pass of :data:`PASSES` on the IR of its stage in ``ir``, and a
    line for each pass whose rewritten module Triton rejects."""
    decisions, rejected = {}, []
    for pass_name in PASSES:
        decisions[pass_name], rewritten = decide(pass_name, ir[pass_stage(pass_name)])
        problem = verifier.problem(rewritten)
        if problem:
            rejected.append(f"{pass_name}: Triton rejects the rewritten IR: {problem}")
    return decisions, rejected


def read_kernel_ir(folder: str, kernel_name: str) -> dict[str, str]:
    return {stage: read_ir(folder, kernel_name, stage) for stage in STAGES}


def first_difference(golden: str, fresh: str, context: int = 3, limit: int = 40) -> str:
    """A unified diff (golden -> fresh) of the first lines that differ, at most ``limit`` lines."""
    diff = list(difflib.unified_diff(golden.splitlines(), fresh.splitlines(), "golden", "fresh", n=context,
                                     lineterm=""))
    shown = diff[:limit]
    if len(diff) > limit:
        shown.append(f"... ({len(diff) - limit} more diff lines)")
    return "\n".join(shown)


def kernels_by_name() -> dict[str, CorpusKernel]:
    return {kernel.name: kernel for kernel in CORPUS}
