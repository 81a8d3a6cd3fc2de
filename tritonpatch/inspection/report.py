"""One kernel compiled under one Pipeline, measured: :class:`CompileReport`."""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Any, Mapping

from ..pipeline import Pipeline, as_pipeline
from ..scope import use_pipeline
from ..targets import compile_for_target, parse_target
from .llir import LoopStats, llir_loops
from .resources import Resources, measure_resources
from .sass import SassStats, analyze_sass, disassemble


@dataclasses.dataclass
class CompileReport:
    """What one compile of one kernel under one Pipeline produced."""

    kernel: str
    target: str
    pipeline: Pipeline
    compile_seconds: float
    resources: Resources
    sass: SassStats
    loops: list[LoopStats]
    passes: list[dict]
    asm: dict[str, str]  # ttir, ttgir, llir, ptx, sass
    runtime_ms: float | None = None
    warmed_up: bool = False  # compile_seconds was measured after one untimed compile of the same kernel

    def to_dict(self, include_asm: bool = False) -> dict:
        out = {
            "kernel": self.kernel, "target": self.target, "pipeline": self.pipeline.to_dict(),
            "fingerprint": self.pipeline.fingerprint(), "compile_seconds": round(self.compile_seconds, 4),
            "compile_warmed_up": self.warmed_up,
            "resources": dataclasses.asdict(self.resources), "sass": dataclasses.asdict(self.sass),
            "llir_loops": [dataclasses.asdict(loop) for loop in self.loops], "passes": self.passes,
            "runtime_ms": self.runtime_ms,
        }
        if include_asm:
            out["asm"] = self.asm
        return out


def describe_pass(report: Mapping[str, Any]) -> str:
    """``elide-uniform-masks on ttir: loops_split=1`` (+ fell back, if so)."""
    counts = ", ".join(f"{k}={v}" for k, v in report.get("counts", {}).items()) or "no change"
    kept = "" if report.get("kept", True) else " (fell back to the unpatched IR)"
    return f"{report['name']} on {report['stage']}: {counts}{kept}"


def pass_lines(report: Mapping[str, Any], label: str) -> list[str]:
    """``pass (B) skip-masked-blocks on ttir: loops_narrowed=0`` and, indented under it, the pass's notes:
    why it left a loop or a select as it is (so a comparison tells "no mask here" from "mask not understood")."""
    return [f"pass ({label}) {describe_pass(report)}", *(f"  {note}" for note in report.get("notes", ()))]


def _pass_reports(collected) -> list[dict]:
    return [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r) for r in collected]


def compile_report(kernel, signature: Mapping[str, str], constexprs: Mapping[str, Any] | None = None,
                   pipeline: Pipeline | Mapping[str, Any] | None = None, target: str = "sm_90", warm_up: bool = False,
                   repeat: int = 1, aligned_pointers: bool = True, **compile_options) -> CompileReport:
    """Compile ``kernel`` for ``target`` with exactly ``pipeline`` (default: plain Triton) — a real
    compile, never a cache hit — and measure what came out.

    Pointer arguments are compiled as 16-byte aligned (``aligned_pointers``), as a launch with
    torch tensors specializes them: without that Triton vectorizes no load or store and the
    registers, shared memory and SASS measured are not those of the kernel the GPU runs.

    ``warm_up=True`` compiles once untimed first, so that ``compile_seconds`` leaves out what only
    the first compile in a process pays (imports, LLVM and pass set-up); two reports compare
    compile times fairly only when both were warmed up. ``repeat`` compiles that many times and
    keeps the median time (one compile's time varies by tens of percent on a busy machine).
    ``pipeline``: a Pipeline or a dict of its keywords (as ``tritonpatch.jit`` takes); anything else raises
    :class:`PipelineError` before anything is compiled."""
    from ..passes import collect_reports

    pipeline = Pipeline() if pipeline is None else as_pipeline(pipeline, "compile_report(pipeline=...)")
    capability = parse_target(target).arch
    previous = os.environ.get("TRITON_ALWAYS_COMPILE")
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    try:
        if warm_up:
            with use_pipeline(pipeline), collect_reports():
                compile_for_target(kernel, signature, constexprs, target=target, aligned_pointers=aligned_pointers,
                                   **compile_options)
        times = []
        for _ in range(max(1, repeat)):
            with use_pipeline(pipeline), collect_reports() as reports:
                start = time.perf_counter()
                compiled = compile_for_target(kernel, signature, constexprs, target=target,
                                              aligned_pointers=aligned_pointers, **compile_options)
                times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
    finally:
        if previous is None:
            os.environ.pop("TRITON_ALWAYS_COMPILE", None)
        else:
            os.environ["TRITON_ALWAYS_COMPILE"] = previous
    sass = disassemble(compiled.asm["cubin"])
    asm = {stage: compiled.asm[stage] for stage in ("ttir", "ttgir", "llir", "ptx")}
    asm["sass"] = sass
    return CompileReport(
        kernel=compiled.metadata.name, target=target, pipeline=pipeline, compile_seconds=seconds,
        resources=measure_resources(compiled.asm["cubin"], compiled.asm["ptx"], capability, pipeline.ptxas,
                                    compiled.metadata.shared),
        sass=analyze_sass(sass), loops=llir_loops(compiled.asm["llir"]), passes=_pass_reports(reports), asm=asm,
        warmed_up=warm_up)
