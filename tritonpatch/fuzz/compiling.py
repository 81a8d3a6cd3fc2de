"""Compiling the fuzzer's cases: one (kernel, pipeline) with tritonpatch's passes, in a pool of
processes, each compile recorded as a :class:`Compiled`.

Every case is compiled with strict mode off, as in production, so a pass that fails falls back
with the documented warning, and the warning says which kind of failure it was
(:func:`_fallback_status`). The pool's processes are spawned, regenerate each kernel from its seed
and share the run's Triton cache directory, from which the launching process loads the kernels on
``--gpu``; a process that dies (a crash inside Triton or LLVM) costs only its own case
(:func:`compile_all`).
"""
from __future__ import annotations

import os
import time
import traceback
import warnings
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

import tritonpatch
from tritonpatch.passes import collect_reports
from tritonpatch.targets import aligned_pointer_attrs

from .generate import generate
from .kernel import Kernel
from .pipelines import pass_names


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

    fn = kernel_function(kernel, directory)
    source = ASTSource(fn=fn, signature=kernel.signature, constexprs=kernel.constexprs,
                       attrs=aligned_pointer_attrs(fn, kernel.signature))
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


def worker_init(cache_dir: str, kernel_dir: str, target: tuple) -> None:
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
                while queue and len(running) < 2 * jobs and not interrupted:
                    task = queue.popleft()
                    try:
                        running[pool.submit(compile_task, *task)] = task
                    except BrokenProcessPool:             # a worker died since the last wait
                        interrupted.append(task)
                if interrupted:
                    break
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

    return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=worker_init,
                               initargs=(cache_dir, kernel_dir, target))


def _compile_alone(compile_task, seed: int, pipeline: str, cache_dir: str, kernel_dir: str, target: tuple) -> Compiled:
    with _pool(1, cache_dir, kernel_dir, target) as pool:
        try:
            return pool.submit(compile_task, seed, pipeline).result()
        except BrokenProcessPool:
            return Compiled(seed, pipeline, "error", 0.0, [], ["the compiling process died (a crash inside Triton, "
                                                               "LLVM or a pass)"])
