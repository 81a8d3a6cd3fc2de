"""Compiling the tuners' candidates in forked worker processes.

Triton's code generation and its in-process LLVM stages hold the GIL, so compile threads overlap
little more than ptxas: on the H200's 16-CPU host the first attention fwd+bwd call took 36 s on 16
threads, most of it compiling about 31 candidates, and 17 s with workers (``docs/benchmarks/first_call.md``).

:class:`DeferredCompiles` is the executor :func:`.launch.parallel_compiles` gives Triton's
``AsyncCompileMode``: it only records each compile the tuner's warm-up launches submit. :meth:`run`
then forks worker processes, each a copy of this process at that moment (the same kernels, masks,
Pipelines, hooks and options), which compile their share of the recorded compiles into Triton's disk
cache and exit; afterwards the compiles run here, on threads, and load what the workers stored. The
binaries are the ones this process would have built: the workers run the very same compile calls, under
the same cache keys. A worker that fails, hangs past :data:`WORKER_TIMEOUT_S`, or cannot be forked costs
only time: the compile then happens here, as without workers. What a compile prints or warns (a pass
falling back, an ignored register cap) comes from the worker that ran it.

Workers are skipped where they cannot help or could differ: one compile, no ``os.fork`` (not
Linux/macOS), ``TRITON_ALWAYS_COMPILE`` (nothing would be read back from the cache),
``TRITON_INSTRUMENTATION_MODE`` (its option parsing may query the GPU). A worker never touches the GPU
(the compiles carry their target; its garbage collector is off, so no finalizer of this process's
kernels runs there) and leaves with ``os._exit``; Ctrl-C stops it.
"""
from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import time
import warnings
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Callable

import triton

# The workers still compiling this long after they were started are stopped; their compiles then run here.
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

    def _take(self) -> bool:
        with self._claim:
            taken, self._claimed = not self._claimed, True
        return taken

    def ensure_run(self) -> None:
        """Run the compile here unless some thread already has it."""
        if not self._take():
            return
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
        """Complete every recorded compile (its kernel, or its exception). Interrupted while the workers
        run (Ctrl-C), it stops them and still completes every compile here before the interruption goes
        on: Triton keeps each submitted compile's future as the kernel (3.8+), so one left without a
        kernel would fail every later launch of that kernel in this process."""
        pending, self.pending = self.pending, []
        try:
            compile_in_workers([f.compile_fn for f in pending if not f.claimed()], self.workers)
        finally:
            try:
                with ThreadPoolExecutor(self.workers, thread_name_prefix="tritonpatch-compile") as threads:
                    for future in pending:
                        threads.submit(future.ensure_run)
            finally:
                for future in pending:   # any the threads were not given (a second interruption)
                    future.ensure_run()


def compile_in_workers(compiles: list, workers: int) -> int:
    """Run ``compiles`` (zero-argument callables) in up to ``workers`` forked processes, round robin, and
    wait for them (all stopped :data:`WORKER_TIMEOUT_S` after the start, or when this raises); returns how
    many workers finished without an error (0 where none were started)."""
    workers = min(workers, len(compiles))
    knobs = triton.knobs.compilation
    if workers < 2 or not hasattr(os, "fork") or knobs.always_compile or knobs.instrumentation_mode:
        return 0
    pids = []
    clean = 0
    freeze = gc.get_freeze_count() == 0   # gc.freeze does not nest: leave a caller's own freeze alone
    if freeze:
        gc.freeze()   # the children share these objects' pages untouched (their collector is off anyway)
    for stream in (sys.stdout, sys.stderr):   # or each worker would write what is buffered here again
        _flush(stream)
    try:
        with warnings.catch_warnings(), _sigint_blocked():
            # Python 3.12 warns on fork in a multi-threaded process (torch's threads). The worker only
            # compiles; locks tritonpatch takes are reset in a forked child (os.register_at_fork).
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            for share in (compiles[i::workers] for i in range(workers)):
                try:
                    pid = os.fork()
                except OSError:   # no more processes: what the workers do not build compiles here
                    break
                if pid == 0:
                    try:
                        _worker(share)
                    finally:
                        os._exit(1)
                pids.append(pid)
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        for pid in list(pids):
            clean += _reap(pid, deadline)
            pids.remove(pid)
    finally:
        if freeze:
            gc.unfreeze()
        for pid in pids:   # left by an exception (Ctrl-C): stop the rest
            _stop(pid)
    return clean


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT held back while forking: Ctrl-C between a fork and recording its pid would leave that worker
    unstopped (a worker unblocks it once its handler is the default one)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _worker(compiles: list) -> None:
    """A forked worker's whole life: compile, never return into the caller's code."""
    status = 1
    try:
        gc.disable()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        status = 0
        for compile_fn in compiles:
            try:
                compile_fn()
            except Exception:  # noqa: BLE001 - this compile runs again in the parent, which reports it
                status = 1
            except BaseException:   # SystemExit and the like: the rest of the share runs in the parent
                status = 1
                break
    finally:
        for stream in (sys.stdout, sys.stderr):
            _flush(stream)
        os._exit(status)


def _flush(stream) -> None:
    try:
        stream.flush()
    except Exception:  # noqa: BLE001 - a closed or replaced stream: nothing to flush
        pass


def _reap(pid: int, deadline: float) -> bool:
    """Wait for worker ``pid`` until ``deadline`` (then stop it); whether it exited cleanly."""
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:   # reaped elsewhere (SIGCHLD ignored): its outcome is unknown
            return False
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        if time.monotonic() > deadline:
            _stop(pid)
            return False
        time.sleep(0.02)


def _stop(pid: int) -> None:
    """Kill worker ``pid`` and reap it (it may have exited already)."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
