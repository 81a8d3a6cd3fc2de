"""Compiling the tuners' candidates in forked worker processes.

Triton's code generation and its in-process LLVM stages hold the GIL, so compile threads overlap
little more than ptxas: on the H200's 16-CPU host the first attention fwd+bwd call spent most of its
36 s compiling about 31 candidates one at a time (``docs/benchmarks/first_call.md``).

:class:`DeferredCompiles` is the executor :func:`.launch.parallel_compiles` gives Triton's
``AsyncCompileMode``: it only records each compile the tuner's warm-up launches submit. :meth:`run`
then forks worker processes, each a copy of this process at that moment (the same kernels, masks,
Pipelines, hooks and options), which compile their share of the recorded compiles into Triton's disk
cache and exit; afterwards the compiles run here, on threads, and load what the workers stored. The
binaries are the ones this process would have built (the workers run the very same compile calls);
a worker that fails, hangs past :data:`WORKER_TIMEOUT_S`, or cannot be forked costs only time: the
compile then happens here, as without workers.

Workers are skipped where they cannot help: one compile, no ``os.fork`` (not Linux/macOS),
``TRITON_ALWAYS_COMPILE`` (nothing would be read back from the cache). A worker never touches the GPU:
the compiles have their target already, and it leaves with ``os._exit``.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Callable

import triton

# A worker compiling longer than this is stopped; its compiles then run in this process.
WORKER_TIMEOUT_S = 600.0


class DeferredCompile(Future):
    """A recorded compile: it runs when :meth:`DeferredCompiles.run` gets to it, or at once, in the asking
    thread, when its kernel is asked for earlier (a kernel launched inside the block, e.g. a block-mask
    build's, must not wait for the block's end)."""

    def __init__(self, compile_fn: Callable):
        super().__init__()
        self.compile_fn = compile_fn
        self._claim = threading.Lock()
        self._claimed = False

    def claimed(self) -> bool:
        return self._claimed

    def ensure_run(self) -> None:
        """Run the compile here unless some thread already has it."""
        with self._claim:
            if self._claimed:
                return
            self._claimed = True
        self.set_running_or_notify_cancel()
        try:
            self.set_result(self.compile_fn())
        except BaseException as exc:  # noqa: BLE001 - the future carries it to whoever asks for the kernel
            self.set_exception(exc)

    def result(self, timeout=None):
        self.ensure_run()
        return super().result(timeout)


class DeferredCompiles(Executor):
    """An executor that records submitted compiles and runs them in :meth:`run` (on ``workers`` forked
    processes first, then on as many threads here)."""

    def __init__(self, workers: int):
        self.workers = workers
        self.pending: list[DeferredCompile] = []

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = DeferredCompile(lambda: fn(*args, **kwargs))
        self.pending.append(future)
        return future

    def run(self) -> None:
        """Complete every recorded compile (its kernel, or its exception)."""
        pending, self.pending = self.pending, []
        compile_in_workers([f.compile_fn for f in pending if not f.claimed()], self.workers)
        with ThreadPoolExecutor(self.workers, thread_name_prefix="tritonpatch-compile") as threads:
            for future in pending:
                threads.submit(future.ensure_run)


def compile_in_workers(compiles: list, workers: int) -> int:
    """Run ``compiles`` (zero-argument callables) in up to ``workers`` forked processes, round robin, and
    wait for them; returns how many workers finished without an error (0 where none were started)."""
    workers = min(workers, len(compiles))
    if workers < 2 or not hasattr(os, "fork") or triton.knobs.compilation.always_compile:
        return 0
    pids = []
    with warnings.catch_warnings():
        # Python 3.12 warns on fork in a multi-threaded process (torch's threads): the worker only compiles
        # (no CUDA, no locks of other threads: the tuner's own compile threads are not started yet).
        warnings.simplefilter("ignore", DeprecationWarning)
        for share in (compiles[i::workers] for i in range(workers)):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                _worker(share)
            pids.append(pid)
    return sum(_wait(pid, time.monotonic() + WORKER_TIMEOUT_S) for pid in pids)


def _worker(compiles: list) -> None:
    """A forked worker's whole life: compile, never return into the caller's code."""
    status = 0
    try:
        for compile_fn in compiles:
            try:
                compile_fn()
            except BaseException:  # noqa: BLE001 - this compile runs again in the parent, which reports it
                status = 1
    finally:
        os._exit(status)


def _wait(pid: int, deadline: float) -> bool:
    """Reap worker ``pid`` (killing it at ``deadline``); whether it exited cleanly."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False
        time.sleep(0.02)
