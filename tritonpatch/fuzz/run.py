"""The differential runner: compile every (kernel seed, pipeline) case, check it, compare it.

A **case** is one kernel (:func:`.generate.generate` of a seed) compiled with one pipeline: the
unpatched reference or one of the seven non-empty combinations of the three mask passes. Every
case is compiled for sm_90 (a process pool, one fresh Triton cache directory per run) and checked
statically:

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
counts) always bit for bit.
"""
from __future__ import annotations

import itertools
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter, defaultdict, deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field

from .generate import Kernel, generate
from .ttir import ScalarProgram, check_segments, dropped_iterations, iterations

PASSES = {"skip": "skip-masked-blocks", "elide": "elide-uniform-masks", "hoist": "hoist-masks"}
REFERENCE = "unpatched"
PIPELINES = tuple("+".join(combo) for size in (1, 2, 3) for combo in itertools.combinations(PASSES, size))
SAMPLES = 24            # runtime-argument assignments per kernel for the static checks
DROPPED_CHECKED = 8     # leading / trailing dropped iterations whose masks are evaluated
SM90_SHARED_MEMORY = 232448   # bytes of shared memory one block may use on sm_90 (H100 / H200)


def pass_names(pipeline: str) -> list[str]:
    """``"skip+elide"`` -> ``["skip-masked-blocks", "elide-uniform-masks"]`` (the reference: [])."""
    if pipeline == REFERENCE:
        return []
    names = pipeline.split("+")
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise ValueError(f"unknown pass {unknown[0]!r} in pipeline {pipeline!r}; use {'+'.join(PASSES)} "
                         f"joined by '+', or {REFERENCE!r}")
    return [PASSES[n] for n in names]


# --- compiling (shared by the pool workers and the launching process) ------------------------------------
@dataclass
class Compiled:
    """What compiling one case gave: ``status`` ok / fallback / crash / backend-crash (see
    :func:`_fallback_status`) / error (the compile raised), the pass reports, the TTIR."""
    seed: int
    pipeline: str
    status: str
    seconds: float
    reports: list = field(default_factory=list)       # (pass, counts, kept)
    messages: list = field(default_factory=list)
    ttir: str = ""
    shared: int = 0                                     # bytes of shared memory the kernel needs


_MODULES: dict[str, object] = {}


def kernel_function(kernel: Kernel, directory: str):
    """The ``@triton.jit`` function of ``kernel``, imported from its source file in ``directory``
    (written on first use; triton.jit needs real source)."""
    import importlib.util

    path = os.path.join(directory, kernel.name + ".py")
    if _MODULES.get(path, (None,))[0] != kernel.source:
        if not os.path.exists(path) or _read(path) != kernel.source:
            partial = f"{path}.{os.getpid()}"
            with open(partial, "w") as handle:
                handle.write(kernel.source)
            os.replace(partial, path)
        spec = importlib.util.spec_from_file_location(kernel.name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _MODULES[path] = (kernel.source, module)
    return getattr(_MODULES[path][1], kernel.name)


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def compile_case(kernel: Kernel, pipeline: str, directory: str, target):
    """(CompiledKernel or None, Compiled) for ``kernel`` under ``pipeline`` with tritonpatch's
    passes (strict mode off, as in production)."""
    import triton
    from triton.compiler import ASTSource

    import tritonpatch
    from tritonpatch.passes import collect_reports

    fn = kernel_function(kernel, directory)
    attrs = {(i,): [["tt.divisibility", 16]] for i, (_, kind) in enumerate(kernel.params) if kind.startswith("*")}
    source = ASTSource(fn=fn, signature=kernel.signature, constexprs=kernel.constexprs, attrs=attrs)
    start = time.perf_counter()
    compiled, status, messages = None, "ok", []
    with warnings.catch_warnings(record=True) as caught, collect_reports() as reports:
        warnings.simplefilter("always")
        try:
            with tritonpatch.options(passes=pass_names(pipeline)):
                compiled = triton.compile(source, target=target, options=dict(kernel.options))
        except Exception as exc:  # noqa: BLE001 - any compile failure is recorded as a finding
            status = "error"
            messages.append("".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:])
    for warning in caught:
        text = str(warning.message)
        if text.startswith("tritonpatch:"):
            messages.append(text[:2000])
            if status == "ok":
                status = _fallback_status(text)
    result = Compiled(kernel.seed, pipeline, status, time.perf_counter() - start,
                      [(r.name, dict(r.counts), r.kept) for r in reports], messages,
                      compiled.asm.get("ttir", "") if compiled is not None else "",
                      compiled.metadata.shared if compiled is not None else 0)
    return compiled, result


def _fallback_status(warning: str) -> str:
    """The status a tritonpatch fallback warning gives: ``crash`` (a pass raised),
    ``backend-crash`` (LLVM or ptxas failed on the patched IR and the kernel was compiled without
    the passes) or ``fallback`` (Triton rejected the pass's output; the documented safety net)."""
    if " failed on kernel " in warning:
        return "crash"
    if " stage after the IR passes " in warning:
        return "backend-crash"
    return "fallback"


_WORKER: dict = {}


def _worker_init(cache_dir: str, kernel_dir: str, target: tuple) -> None:
    """Set up a compiling process: the run's cache directory, no forced recompiles (the launching
    process loads what the workers compiled), strict mode off."""
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    os.environ.pop("TRITON_ALWAYS_COMPILE", None)
    os.environ.pop("TRITONPATCH_STRICT", None)
    _WORKER.update(kernel_dir=kernel_dir, target=target)


def _worker_compile(seed: int, pipeline: str) -> Compiled:
    from triton.backends.compiler import GPUTarget

    _, result = compile_case(generate(seed), pipeline, _WORKER["kernel_dir"], GPUTarget(*_WORKER["target"]))
    return result


# --- static checks -----------------------------------------------------------------------------------
@dataclass
class Finding:
    """Something a case did that the passes' contracts forbid (or a generator bug)."""
    seed: int
    pipeline: str
    kind: str          # invalid-kernel, compile-error, pass-crash, bounds, skipped-live-tile, mismatch, ...
    detail: str

    def reproduce(self, gpu: bool) -> str:
        pipeline = f" --pipeline {self.pipeline}" if self.pipeline != REFERENCE else ""
        return f"python -m tritonpatch.fuzz --seed {self.seed} --kernels 1{pipeline}{' --gpu' if gpu else ''} --show"


def _ttir_arguments(kernel: Kernel, env: dict) -> list:
    """The TTIR function's arguments, in order: (value, width) for integers, None otherwise."""
    out = []
    for name, kind in kernel.params:
        if kind == "constexpr":
            continue
        out.append((env[name], 64 if kind == "i64" else 32) if kind in ("i32", "i64") else None)
    return out


def static_findings(kernel: Kernel, reference: Compiled, case: Compiled, samples: int) -> tuple[list, int]:
    """(findings, loops checked) for one patched case against the reference compile."""
    findings = []
    if case.status in ("error", "crash", "backend-crash"):
        kind = {"error": "compile-error", "crash": "pass-crash", "backend-crash": "backend-crash"}[case.status]
        findings.append(Finding(kernel.seed, case.pipeline, kind, "; ".join(case.messages)[:1500]))
        return findings, 0
    if case.shared > SM90_SHARED_MEMORY >= reference.shared:
        findings.append(Finding(kernel.seed, case.pipeline, "shared-memory",
                                f"the patched kernel needs {case.shared} bytes of shared memory, more than an "
                                f"sm_90 block may have ({SM90_SHARED_MEMORY}); the unpatched kernel needs "
                                f"{reference.shared}"))
    if not case.ttir or not reference.ttir:
        return findings, 0
    original, patched = ScalarProgram(reference.ttir), ScalarProgram(case.ttir)
    skipping = "skip" in case.pipeline.split("+")
    exact = not skipping or bool(kernel.loop_effects)      # a loop with side effects keeps every iteration
    checked = 0
    for env in kernel.samples(samples):
        arguments = _ttir_arguments(kernel, env)
        pids = (env["pid"][0], env["pid"][1], 0)
        by_line, runs = defaultdict(list), defaultdict(list)
        for loop, bounds in patched.loop_bounds(arguments, pids):
            by_line[loop.line].append(bounds)
            runs[loop.line].append((loop, bounds))
        for loop, bounds in original.loop_bounds(arguments, pids):
            segments = by_line.pop(loop.line, [])
            if bounds is None or not segments or None in segments:
                kind, problem = "unchecked", "a loop bound is not computable from the arguments (evaluator gap)"
            elif bounds[2] <= 0:
                continue                                      # a sampled runtime step <= 0: no defined loop
            else:
                checked += 1
                kind, problem = "bounds", check_segments(bounds, segments, exact)
                if problem and skipping and kernel.loop_effects and check_segments(bounds, segments, False) is None:
                    kind, problem = "side-effects-dropped", (f"skip-masked-blocks dropped iterations of a loop with "
                                                             f"{', '.join(kernel.loop_effects)}: {problem}")
                if problem is None and not exact:
                    kind, problem = "skipped-live-tile", _live_tile_dropped(kernel, bounds, segments, loop.width, env)
                if problem is None:
                    kind, problem = "elided-mixed-tile", _mixed_tile_elided(kernel, loop, runs[loop.line], env)
            if problem:
                findings.append(Finding(kernel.seed, case.pipeline, kind, f"{problem} [{_describe_env(kernel, env)}]"))
                return findings, checked
        if by_line:
            findings.append(Finding(kernel.seed, case.pipeline, "bounds",
                                    f"patched TTIR has loops at source lines {sorted(by_line, key=str)} that the "
                                    f"unpatched TTIR has not"))
            return findings, checked
    return findings, checked


def _live_tile_dropped(kernel: Kernel, original, segments, iv_width: int, env: dict) -> str | None:
    """Every dropped iteration must have a ``-inf``-filled mask that is all-false on its tile."""
    neg_inf = [select.mask for select in kernel.selects if select.neg_inf]
    for start in dropped_iterations(original, segments, DROPPED_CHECKED):
        tile = kernel.tile_at(env, start, iv_width)
        if not any(not mask.evaluate(tile).any() for mask in neg_inf):
            return f"skip-masked-blocks dropped iteration start={start}, whose tile has no all-false -inf mask"
    return None


def _mixed_tile_elided(kernel: Kernel, original, runs: list, env: dict) -> str | None:
    """A rewritten loop with fewer masked selects than the original runs without a mask: where
    the kernel has a single mask, that mask must be uniform (all-true or all-false) on each of
    its tiles (up to 8 first and last iterations checked)."""
    masks = {select.mask for select in kernel.selects}
    if len(masks) != 1:
        return None
    (mask,) = masks
    for loop, (lower, upper, step) in runs:
        if loop.masked_selects >= original.masked_selects:
            continue
        first, count = iterations(lower, upper, step)
        for k in sorted(set(range(min(count, DROPPED_CHECKED))) | set(range(max(0, count - DROPPED_CHECKED), count))):
            values = mask.evaluate(kernel.tile_at(env, first + k * step, loop.width))
            if values.any() and not values.all():
                return (f"elide-uniform-masks runs iteration start={first + k * step} in a loop without the mask "
                        f"([{lower}, {upper}) step {step}), but the mask is mixed on that tile")
    return None


def _describe_env(kernel: Kernel, env: dict) -> str:
    """The sample's values of the scalars the kernel reads, and its program ids."""
    return ", ".join(f"{name}={env[name]}" for name in kernel.used_scalars) + f", pid={env['pid']}"


# --- the GPU comparison --------------------------------------------------------------------------------
_TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "i32": "int32", "i8": "int8"}
SENTINEL = 1234.5


def initial_tensors(kernel: Kernel):
    """Deterministic initial contents of every buffer (CPU tensors, seeded by the kernel seed)."""
    import torch

    generator = torch.Generator().manual_seed(kernel.seed)
    tensors = {}
    for buffer in kernel.buffers:
        dtype = getattr(torch, _TORCH_DTYPES[buffer.dtype])
        if buffer.fill == "randn":
            value = torch.randn(buffer.shape, generator=generator) * 0.5
        elif buffer.fill == "uniform":
            value = torch.rand(buffer.shape, generator=generator) * 4.0
        elif buffer.fill == "table":
            value = torch.tensor(kernel.table)
        elif buffer.fill == "sentinel":
            value = torch.full(buffer.shape, SENTINEL if dtype.is_floating_point else -1)
        else:
            value = torch.zeros(buffer.shape)
        tensors[buffer.name] = value.to(dtype)
    return tensors


def launch(kernel: Kernel, compiled, initial: dict) -> dict:
    """Run ``compiled`` once on fresh copies of the buffers; the output and effect buffers (CPU)."""
    import torch

    buffers = {name: tensor.cuda() for name, tensor in initial.items()}
    unused = torch.zeros(16, device="cuda")                 # for the pointer parameters this kernel ignores
    args = [buffers.get(name, unused) if kind.startswith("*") else kernel.constexprs[name] if kind == "constexpr"
            else kernel.scalars[name] for name, kind in kernel.params]
    compiled[kernel.grid + (1,)](*args)
    torch.cuda.synchronize()
    return {b.name: buffers[b.name].cpu() for b in kernel.buffers if b.role != "input"}


_BIT_VIEWS = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}     # element size -> same-width integer dtype


def compare(kernel: Kernel, reference: dict, patched: dict, finite_only: bool) -> str | None:
    """None when ``patched`` matches ``reference``; else where it differs first."""
    import torch

    bit_views = {size: getattr(torch, name) for size, name in _BIT_VIEWS.items()}
    for buffer in kernel.buffers:
        if buffer.role == "input":
            continue
        ref, out = reference[buffer.name], patched[buffer.name]
        if buffer.role == "output" and finite_only:
            where = torch.isfinite(ref)
            differ = where & (out != ref)             # exact equality, -0.0 == +0.0
        else:
            bits = bit_views[ref.element_size()]
            differ = ref.view(bits) != out.view(bits)
        count = int(differ.sum())
        if count:
            index = tuple(int(i) for i in differ.nonzero()[0])
            return (f"{buffer.name}: {count} of {ref.numel()} elements differ"
                    f"{' where the unpatched output is finite' if buffer.role == 'output' and finite_only else ''};"
                    f" first at {list(index)}: unpatched {ref[index].item()!r}, patched {out[index].item()!r}")
    return None


# --- the run -----------------------------------------------------------------------------------------------
@dataclass
class Case:
    seed: int
    family: str
    pipeline: str
    status: str
    compile_seconds: float
    reports: list
    loops_checked: int = 0
    compared: bool = False
    findings: list = field(default_factory=list)


@dataclass
class RunResult:
    """Every case and finding of a run, its configuration and timings."""
    cases: list
    findings: list
    config: dict
    timings: dict

    @property
    def ok(self) -> bool:
        return not self.findings


def _progress(out, done: int, total: int, compared: int, findings: int, start: float, gpu: bool) -> None:
    elapsed = time.perf_counter() - start
    rate = done / elapsed if elapsed > 0 else 0.0
    extra = f", {compared} compared on the GPU" if gpu else ""
    print(f"[fuzz] {done}/{total} compiled{extra}, {findings} findings, {rate:.1f} compiles/s, {elapsed:.0f} s",
          file=out, flush=True)


def run(seeds, pipelines=PIPELINES, *, gpu: bool = False, jobs: int | None = None, samples: int = SAMPLES,
        out=None, show: bool = False) -> RunResult:
    """Compile, check and (``gpu``) compare every case of ``seeds`` x (reference + ``pipelines``);
    progress (and with ``show`` each kernel and case) goes to ``out`` (default: stdout)."""
    from triton.backends.compiler import GPUTarget

    out = out or sys.stdout

    seeds, pipelines = list(seeds), list(pipelines)
    for pipeline in pipelines:
        pass_names(pipeline)
    jobs = max(1, jobs or os.cpu_count() or 1)
    start = time.perf_counter()
    run_dir = tempfile.mkdtemp(prefix="tritonpatch-fuzz-")
    kernel_dir, cache_dir = os.path.join(run_dir, "kernels"), os.path.join(run_dir, "cache")
    os.makedirs(kernel_dir)
    kernels = {seed: generate(seed) for seed in seeds}
    for kernel in kernels.values():
        with open(os.path.join(kernel_dir, kernel.name + ".py"), "w") as handle:
            handle.write(kernel.source)
    generated = time.perf_counter()
    target = (GPUTarget("cuda", 90, 32) if not gpu else _device_target())
    target_tuple = (target.backend, target.arch, target.warp_size)
    saved_env = {name: os.environ.get(name) for name in ("TRITON_CACHE_DIR", "TRITON_ALWAYS_COMPILE",
                                                         "TRITONPATCH_STRICT")}
    _worker_init(cache_dir, kernel_dir, target_tuple)     # this process loads the workers' kernels (--gpu)
    tasks = [(seed, pipeline) for seed in seeds for pipeline in [REFERENCE] + pipelines]
    cases, findings = [], []
    pending = defaultdict(dict)
    launch_seconds = compared = 0
    device_lost = False
    last_print = time.perf_counter()
    if show:
        for kernel in kernels.values():
            _show_kernel(kernel, out)
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
                if show:
                    _show_cases(kernel, kernel_cases, kernel_findings, out)
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


def compile_all(tasks, jobs: int, cache_dir: str, kernel_dir: str, target: tuple, compile_task=None):
    """Compiled results of ``tasks`` (``(seed, pipeline)`` pairs) as they finish, from a pool of
    ``jobs`` spawned processes running ``compile_task(seed, pipeline)`` (a module-level function;
    default: compile the case).

    A process that dies (a crash inside Triton or LLVM) breaks the pool: the tasks then in flight
    (at most ``2 * jobs``) are compiled again one by one, each in a process of its own, so the one
    that kills its process is recorded as an ``error`` and the run goes on."""
    compile_task = compile_task or _worker_compile
    queue = deque(tasks)
    while queue:
        interrupted = []
        with _pool(jobs, cache_dir, kernel_dir, target) as pool:
            running = {}
            while (queue or running) and not interrupted:
                while queue and len(running) < 2 * jobs:
                    task = queue.popleft()
                    running[pool.submit(compile_task, *task)] = task
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    task = running.pop(future)
                    try:
                        yield future.result()
                    except BrokenProcessPool:
                        interrupted.append(task)
            interrupted += running.values()
        for seed, pipeline in interrupted:
            yield _compile_alone(compile_task, seed, pipeline, cache_dir, kernel_dir, target)


def _pool(jobs: int, cache_dir: str, kernel_dir: str, target: tuple):
    import multiprocessing

    return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                               initargs=(cache_dir, kernel_dir, target))


def _compile_alone(compile_task, seed: int, pipeline: str, cache_dir: str, kernel_dir: str, target: tuple) -> Compiled:
    with _pool(1, cache_dir, kernel_dir, target) as pool:
        try:
            return pool.submit(compile_task, seed, pipeline).result()
        except BrokenProcessPool:
            return Compiled(seed, pipeline, "error", 0.0, [], ["the compiling process died (a crash inside Triton, "
                                                                 "LLVM or a pass)"])


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
                          checked, findings=[f.kind for f in case_findings]))
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

    from tritonpatch.passes import collect_reports

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


# --- reporting ---------------------------------------------------------------------------------------------
def _show_kernel(kernel: Kernel, out) -> None:
    print(f"=== seed {kernel.seed}: {kernel.family}, grid {kernel.grid}, options {kernel.options}", file=out)
    print(f"features: {', '.join(kernel.features)}", file=out)
    print(f"launch scalars: { {name: kernel.scalars[name] for name in kernel.used_scalars} }", file=out)
    print(kernel.source, file=out)


def _show_cases(kernel: Kernel, cases: list, findings: list, out) -> None:
    for case in cases:
        reports = "; ".join(f"{name} {counts}{'' if kept else ' (discarded)'}" for name, counts, kept in case.reports)
        print(f"--- {case.pipeline}: {case.status}, {case.compile_seconds:.2f} s, {reports or 'no passes'}", file=out)
    for finding in findings:
        print(f"FINDING {finding.kind} [{finding.pipeline}]: {finding.detail}", file=out)


def _applied(case: Case) -> dict[str, str]:
    """pass -> applied / refused / fallback for one case."""
    out = {}
    for name, counts, kept in case.reports:
        out[name] = "fallback" if not kept else "applied" if any(counts.values()) else "refused"
    return out


def summary(result: RunResult) -> str:
    """The end-of-run table: cases per pipeline and family, pass outcomes, findings."""
    lines = []
    gpu = result.config["gpu"]
    by_pipeline = defaultdict(Counter)
    by_family = defaultdict(Counter)
    by_pass = defaultdict(Counter)
    for case in result.cases:
        if case.pipeline == REFERENCE:
            by_family[case.family]["kernels"] += 1
            continue
        row = by_pipeline[case.pipeline]
        row["cases"] += 1
        row[case.status] += 1
        row["compared"] += case.compared
        row["loops checked"] += case.loops_checked
        row["findings"] += len(case.findings)
        by_family[case.family]["cases"] += 1
        by_family[case.family]["findings"] += len(case.findings)
        outcomes = _applied(case)
        for name, outcome in outcomes.items():
            by_pass[name][outcome] += 1
        row["changed"] += "applied" in outcomes.values()
    columns = ["cases", "ok", "fallback", "crash", "backend-crash", "error", "changed", "loops checked", "compared",
               "findings"]
    width = max(len(c) for c in columns) + 2
    lines.append(f"{'pipeline':<18}" + "".join(f"{c:>{width}}" for c in columns))
    for pipeline in result.config["pipelines"]:
        lines.append(f"{pipeline:<18}" + "".join(f"{by_pipeline[pipeline][c]:>{width}}" for c in columns))
    total = Counter()
    for row in by_pipeline.values():
        total.update(row)
    lines.append(f"{'total':<18}" + "".join(f"{total[c]:>{width}}" for c in columns))
    lines.append("(changed: cases in which a pass rewrote the IR; loops checked: loop x sample evaluations of the "
                 "static check; compared: cases compared on the GPU)")
    lines.append("")
    lines.append(f"{'family':<18}{'kernels':>10}{'cases':>10}{'findings':>10}")
    for family in sorted(by_family):
        row = by_family[family]
        lines.append(f"{family:<18}{row['kernels']:>10}{row['cases']:>10}{row['findings']:>10}")
    lines.append("")
    lines.append(f"{'pass':<22}{'applied':>10}{'refused':>10}{'fallback':>10}")
    for name in sorted(by_pass):
        row = by_pass[name]
        lines.append(f"{name:<22}{row['applied']:>10}{row['refused']:>10}{row['fallback']:>10}")
    lines.append("")
    timings = result.timings
    lines.append(f"time: {timings['total_s']} s total ({timings['generate_s']} s generating, "
                 f"{timings['compile_s_sum']} s of compiles over {timings['jobs']} processes, "
                 f"{timings['launch_compare_s']} s launching and comparing)")
    fallbacks = [c for c in result.cases if c.status == "fallback"]
    if fallbacks:
        lines.append(f"fallbacks (documented warning, unpatched IR kept): "
                     + ", ".join(f"seed {c.seed} {c.pipeline}" for c in fallbacks[:20])
                     + (" ..." if len(fallbacks) > 20 else ""))
    kinds = Counter(f.kind for f in result.findings)
    lines.append(f"findings: {len(result.findings)}" + (f" ({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items()))})"
                                                        if kinds else ""))
    for finding in result.findings[:50]:
        lines.append(f"  seed {finding.seed} [{finding.pipeline}] {finding.kind}: {finding.detail[:300]}")
        lines.append(f"    reproduce: {finding.reproduce(gpu)}")
    if len(result.findings) > 50:
        lines.append(f"  ... {len(result.findings) - 50} more in the log")
    return "\n".join(lines)


def write_log(result: RunResult, path: str, command: str) -> None:
    """The whole run as JSON: configuration, timings, every case, every finding, the summary."""
    gpu = result.config["gpu"]
    payload = {"command": command, "config": result.config, "timings": result.timings,
               "findings": [{**asdict(f), "reproduce": f.reproduce(gpu)} for f in result.findings],
               "cases": [asdict(c) for c in result.cases], "summary": summary(result)}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=1)
