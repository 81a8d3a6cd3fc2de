"""The differential runner: compile every (kernel seed, pipeline) case, check it, compare it.

A **case** is one kernel (:func:`.generate.generate` of a seed) compiled with one pipeline
(:mod:`.pipelines`): the unpatched reference or one of the seven non-empty combinations of the
three mask passes. Every case is compiled for sm_90 (:mod:`.compiling`: a process pool, one fresh
Triton cache directory per run) and checked statically (:mod:`.checks`):

1. it compiles, or a pass falls back with the documented warning (Triton rejects the rewritten
   IR); a Python exception raised inside a pass, LLVM or ptxas failing on the patched IR, or a
   compile error is a finding;
2. for sampled runtime arguments and program ids, the patched loops run a contiguous, in-order run
   of the original loop's iterations inside ``[lb, ub)`` (all of them unless
   ``skip-masked-blocks`` is in the pipeline and the loop has no side effects), evaluated from each
   TTIR's scalar arithmetic (:mod:`.ttir`); every iteration ``skip-masked-blocks`` dropped has a
   ``-inf``-filled mask that is all-false on its tile, and every iteration a rewritten loop runs
   without the mask has a uniform mask on its tile (both evaluated by the generator's own mask
   model).

With ``gpu=True`` each kernel is then launched (serially, deterministic inputs) unpatched and with
every pipeline, and the outputs are compared bit for bit; under ``skip-masked-blocks`` only where
the unpatched output is finite (there exactly); side-effect outputs (counters, logs, bitsets, trip
counts) always bit for bit (:mod:`.gpu`). The run's cases and findings are a
:class:`~.results.RunResult`; :mod:`.report` prints and logs it.
"""
from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
import time
from collections import defaultdict

from tritonpatch.passes import collect_reports

from .checks import SAMPLES, static_findings
from .compiling import compile_all, compile_case, worker_init
from .generate import check_features, generate_kernels
from .gpu import compare, initial_tensors, launch
from .kernel import Kernel
from .pipelines import PIPELINES, REFERENCE, pass_names
from .report import show_cases, show_kernel
from .results import Case, Finding, RunResult


def _progress(out, done: int, total: int, compared: int, findings: int, start: float, gpu: bool) -> None:
    elapsed = time.perf_counter() - start
    rate = done / elapsed if elapsed > 0 else 0.0
    extra = f", {compared} compared on the GPU" if gpu else ""
    print(f"[fuzz] {done}/{total} compiled{extra}, {findings} findings, {rate:.1f} compiles/s, {elapsed:.0f} s",
          file=out, flush=True)


class NoKernelSelected(ValueError):
    """No kernel of the seeds has one of the features asked for (a run of nothing would pass)."""


def run(seeds, pipelines=PIPELINES, *, features: list[str] | None = None, gpu: bool = False, jobs: int | None = None,
        samples: int = SAMPLES, out=None, show: bool = False) -> RunResult:
    """Compile, check and (``gpu``) compare every case of the kernels of ``seeds`` x (reference +
    ``pipelines``); with ``features``, of only the kernels that have one of them (each kernel is
    generated once; ValueError for a name not in :data:`~.generate.FEATURES`,
    :class:`NoKernelSelected` when no kernel has one). Progress (and with ``show`` each
    kernel and case) goes to ``out`` (default: stdout)."""
    from triton.backends.compiler import GPUTarget

    out = out or sys.stdout

    seeds, pipelines = list(seeds), list(pipelines)
    for pipeline in pipelines:
        pass_names(pipeline)
    check_features(features or ())
    jobs = max(1, jobs or os.cpu_count() or 1)
    start = time.perf_counter()
    kernels = generate_kernels(seeds, features)
    if features:
        if not kernels:
            span = f"{seeds[0]}..{seeds[-1]}" if seeds else "(none)"
            raise NoKernelSelected(f"no kernel of seeds {span} has a feature of {features}")
        print(f"{len(kernels)} of {len(seeds)} kernels have a feature of {features}", file=out, flush=True)
        seeds = list(kernels)
    run_dir = tempfile.mkdtemp(prefix="tritonpatch-fuzz-")
    kernel_dir, cache_dir = os.path.join(run_dir, "kernels"), os.path.join(run_dir, "cache")
    os.makedirs(kernel_dir)
    for kernel in kernels.values():
        with open(os.path.join(kernel_dir, kernel.name + ".py"), "w") as handle:
            handle.write(kernel.source)
    generated = time.perf_counter()
    target = (GPUTarget("cuda", 90, 32) if not gpu else _device_target())
    target_tuple = (target.backend, target.arch, target.warp_size)
    saved_env = {name: os.environ.get(name) for name in ("TRITON_CACHE_DIR", "TRITON_ALWAYS_COMPILE",
                                                         "TRITONPATCH_STRICT")}
    worker_init(cache_dir, kernel_dir, target_tuple)     # this process loads the workers' kernels (--gpu)
    tasks = [(seed, pipeline) for seed in seeds for pipeline in [REFERENCE] + pipelines]
    cases, findings = [], []
    pending = defaultdict(dict)
    launch_seconds = compared = 0
    device_lost = False
    last_print = time.perf_counter()
    if show:
        for kernel in kernels.values():
            show_kernel(kernel, out)
    try:
        for done, result in enumerate(compile_all(tasks, jobs, cache_dir, kernel_dir, target_tuple), start=1):
            pending[result.seed][result.pipeline] = result
            if len(pending[result.seed]) == len(pipelines) + 1:
                kernel = kernels[result.seed]
                kernel_cases, kernel_findings = _check_kernel(kernel, pending.pop(result.seed), pipelines, samples)
                if gpu and not device_lost and kernel_cases[0].status != "error":
                    t = time.perf_counter()
                    try:
                        kernel_findings += _compare_kernel(kernel, kernel_cases, kernel_dir, target,
                                                           out if show else None)
                    except DeviceLost as lost:
                        kernel_findings += lost.findings
                        device_lost = True
                        print(f"[fuzz] seed {kernel.seed}: the GPU is unusable after a failed launch ({lost}); "
                              f"the remaining kernels are only checked statically", file=out, flush=True)
                    launch_seconds += time.perf_counter() - t
                    compared += sum(c.compared for c in kernel_cases)
                cases += kernel_cases
                findings += kernel_findings
                for finding in kernel_findings:     # at once: a run cut short still names its findings
                    print(f"[fuzz] FINDING seed {finding.seed} [{finding.pipeline}] {finding.kind}; reproduce: "
                          f"{finding.reproduce(gpu)}", file=out, flush=True)
                if show:
                    show_cases(kernel, kernel_cases, kernel_findings, out)
            if time.perf_counter() - last_print > 10 or done == len(tasks):
                _progress(out, done, len(tasks), compared, len(findings), start, gpu)
                last_print = time.perf_counter()
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(run_dir, ignore_errors=True)
    end = time.perf_counter()
    timings = {"generate_s": round(generated - start, 2), "total_s": round(end - start, 2),
               "compile_s_sum": round(sum(c.compile_seconds for c in cases), 2),
               "launch_compare_s": round(launch_seconds, 2), "jobs": jobs}
    config = {"seeds": [seeds[0], seeds[-1]] if seeds else [], "kernels": len(seeds), "pipelines": pipelines,
              "gpu": gpu, "samples": samples, "target": list(target_tuple), "versions": _versions()}
    return RunResult(cases, findings, config, timings)


def _device_target():
    from triton.runtime import driver

    return driver.active.get_current_target()


def _versions() -> dict:
    import triton

    versions = {"python": platform.python_version(), "triton": triton.__version__}
    try:
        import torch
        versions["torch"] = torch.__version__
        if torch.cuda.is_available():
            versions["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return versions


def _check_kernel(kernel: Kernel, results: dict, pipelines, samples: int):
    reference = results[REFERENCE]
    cases = [Case(kernel.seed, kernel.family, REFERENCE, reference.status, reference.seconds, reference.reports)]
    findings = []
    if reference.status != "ok":
        findings.append(Finding(kernel.seed, REFERENCE, "invalid-kernel",
                                "the generated kernel does not compile unpatched (a generator bug): "
                                + "; ".join(reference.messages)[:1500]))
        return cases, findings
    for pipeline in pipelines:
        result = results[pipeline]
        case_findings, checked = static_findings(kernel, reference, result, samples)
        cases.append(Case(kernel.seed, kernel.family, pipeline, result.status, result.seconds, result.reports,
                          checked, findings=[f.kind for f in case_findings],
                          messages=[] if result.status == "ok" else list(result.messages)))
        findings += case_findings
    return cases, findings


class DeviceLost(Exception):
    """A launch left the CUDA context unusable (e.g. an illegal address): no further launches."""

    def __init__(self, findings: list):
        super().__init__(findings[-1].detail)
        self.findings = findings


def _compare_kernel(kernel: Kernel, cases: list, kernel_dir: str, target, show_out) -> list:
    """Launch the reference (twice: it must be deterministic) and every pipeline; compare. A launch
    that raises is a finding (``launch-error``; for the reference ``invalid-kernel``); one that
    leaves the device unusable raises :class:`DeviceLost`."""
    import torch

    initial = initial_tensors(kernel)
    findings = []
    outputs = {}
    for case in cases:
        if case.status == "error":
            continue
        with collect_reports() as reports:
            compiled, _ = compile_case(kernel, case.pipeline, kernel_dir, target)   # from the run's cache
        if reports and show_out is not None:
            print(f"  (note: {case.pipeline} was recompiled in the launching process)", file=show_out)
        if compiled is None:
            continue
        try:
            outputs[case.pipeline] = launch(kernel, compiled, initial)
            again = launch(kernel, compiled, initial) if case.pipeline == REFERENCE else None
        except Exception as exc:  # noqa: BLE001 - out of resources, illegal address, ...
            kind = "invalid-kernel" if case.pipeline == REFERENCE else "launch-error"
            findings.append(Finding(kernel.seed, case.pipeline, kind, f"launch failed: {type(exc).__name__}: "
                                                                      f"{exc}"[:1500]))
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - a sticky CUDA error
                raise DeviceLost(findings) from exc
            if case.pipeline == REFERENCE:
                return findings
            continue
        if case.pipeline == REFERENCE:
            problem = compare(kernel, outputs[REFERENCE], again, finite_only=False)
            if problem:
                findings.append(Finding(kernel.seed, REFERENCE, "nondeterministic-reference", problem))
                return findings
            continue
        case.compared = True
        problem = compare(kernel, outputs[REFERENCE], outputs[case.pipeline],
                          finite_only="skip" in case.pipeline.split("+"))
        if problem:
            findings.append(Finding(kernel.seed, case.pipeline, "mismatch", problem))
            case.findings.append("mismatch")
    return findings
