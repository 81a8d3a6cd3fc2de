"""The tuners' compiles in forked worker processes (``kernels/_runtime/compile_workers.py``): workers run
their share once and exit, failing or hung ones only cost time (one deadline for all), a kernel asked for
inside the block compiles at once, a block left by an exception or an interrupted run still completes
every compile, and the tuner's candidates come out of the workers' cache bit for bit as compiled here. A hang fails the test run (faulthandler) instead of stalling it."""
from __future__ import annotations

import ast
import contextlib
import faulthandler
import os
import threading
import time
from collections import defaultdict

import pytest
import torch

import tritonpatch.kernels as K
from tritonpatch.kernels._runtime import compile_workers
from tritonpatch.kernels._runtime.compile_workers import DeferredCompiles, compile_in_workers
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import kernels as fwd_kernels
from tritonpatch.kernels.fwd import launch as fwd_launch

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="worker processes are forked (Linux, macOS)")


@pytest.fixture(autouse=True)
def no_hang():
    faulthandler.dump_traceback_later(600, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def touch(path):
    return lambda: open(path, "w").close()


def test_workers_run_every_compile_once_in_another_process(tmp_path):
    parent = os.getpid()
    paths = [tmp_path / f"c{i}" for i in range(5)]

    def record(path):
        def compile_fn():
            with open(path, "a") as f:
                f.write(f"{os.getpid()}\n")
        return compile_fn

    assert compile_in_workers([record(p) for p in paths], 3) == 3
    runs = [p.read_text().split() for p in paths]
    assert all(len(r) == 1 for r in runs)
    pids = {int(r[0]) for r in runs}
    assert len(pids) == 3 and parent not in pids


def test_failing_or_hung_workers_only_cost_time(tmp_path, monkeypatch):
    def fail():
        raise RuntimeError("compile failed")

    assert compile_in_workers([fail, touch(tmp_path / "ok")], 2) == 1
    assert (tmp_path / "ok").exists()
    monkeypatch.setattr(compile_workers, "WORKER_TIMEOUT_S", 1.0)
    start = time.monotonic()
    hang = lambda: time.sleep(60)   # noqa: E731
    assert compile_in_workers([hang, hang, touch(tmp_path / "ok2")], 3) == 1
    assert time.monotonic() - start < 1.9   # one deadline for all workers, not one per worker
    assert (tmp_path / "ok2").exists()
    with pytest.raises(ChildProcessError):   # the hung ones were stopped and reaped
        os.waitpid(-1, os.WNOHANG)


def test_an_interrupted_wait_stops_the_workers(monkeypatch):
    def interrupted(pid, deadline):
        raise KeyboardInterrupt

    monkeypatch.setattr(compile_workers, "_reap", interrupted)
    hang = lambda: time.sleep(60)   # noqa: E731
    with pytest.raises(KeyboardInterrupt):
        compile_in_workers([hang, hang], 2)
    with pytest.raises(ChildProcessError):   # none left running or unreaped
        os.waitpid(-1, os.WNOHANG)


def test_output_buffered_here_is_not_written_again_by_the_workers(tmp_path, monkeypatch):
    path = tmp_path / "stdout"
    with open(path, "w") as stdout:   # block-buffered, as a redirected stdout is
        monkeypatch.setattr("sys.stdout", stdout)
        print("pending line")
        assert compile_in_workers([lambda: None, lambda: None], 2) == 2
    assert path.read_text() == "pending line\n"


def test_a_worker_forked_while_another_thread_holds_tritonpatchs_locks_can_take_them(tmp_path):
    """tritonpatch's module-level locks (Pipeline layers, LLVM registry, pass reports) are renewed in a
    forked child: a worker forked while a thread of the parent holds them (a compile elsewhere) does not
    deadlock on its first compile."""
    from tritonpatch import _current, _llvm_registry
    from tritonpatch.passes import report

    locks = [(_current, "_process_lock"), (_current, "_environment_lock"), (_llvm_registry, "_lock"),
             (report, "_EVERY_THREAD_LOCK")]
    held, release = threading.Event(), threading.Event()

    def hold():
        with contextlib.ExitStack() as stack:
            for module, name in locks:
                stack.enter_context(getattr(module, name))
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()

    def take_locks():
        for module, name in locks:
            if not getattr(module, name).acquire(timeout=5):
                raise TimeoutError(f"{module.__name__}.{name}: held by a thread of the parent")
        (tmp_path / "took").touch()

    try:
        assert compile_in_workers([take_locks, lambda: None], 2) == 2
    finally:
        release.set()
        holder.join()
    assert (tmp_path / "took").exists()


def test_no_workers_where_they_cannot_help(tmp_path, monkeypatch):
    import triton

    assert compile_in_workers([touch(tmp_path / "one")], 4) == 0   # a single compile
    monkeypatch.setattr(triton.knobs.compilation, "instrumentation_mode", "gsan")   # may query the GPU
    assert compile_in_workers([touch(tmp_path / "a"), touch(tmp_path / "b")], 2) == 0
    monkeypatch.undo()
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")                # nothing would be read back from the cache
    assert compile_in_workers([touch(tmp_path / "a"), touch(tmp_path / "b")], 2) == 0
    assert not list(tmp_path.iterdir())


def test_deferred_compiles_run_once_and_early_when_asked_for():
    """A compile whose kernel is asked for inside the block (a kernel launched there) runs at once in the
    asking thread; run() completes the rest and runs nothing twice; exceptions reach the future."""
    calls = []
    executor = DeferredCompiles(1)   # one worker: no fork

    def compile_fn(name):
        calls.append(name)
        if name == "bad":
            raise ValueError("bad kernel")
        return name

    early, late, bad = (executor.submit(compile_fn, n) for n in ("early", "late", "bad"))
    assert early.result() == "early" and calls == ["early"]
    executor.run()
    assert sorted(calls) == ["bad", "early", "late"] and late.result() == "late"
    with pytest.raises(ValueError, match="bad kernel"):
        bad.result()


def test_an_interrupted_run_still_completes_every_compile(monkeypatch):
    """Triton's AsyncCompileMode waits for every submitted compile and (3.8+) keeps its future as the
    kernel: an interruption while the workers run must leave none pending or failed."""
    calls = []
    executor = DeferredCompiles(2)
    futures = [executor.submit(calls.append, i) for i in range(3)]

    def interrupted(compiles, workers):
        raise KeyboardInterrupt

    monkeypatch.setattr(compile_workers, "compile_in_workers", interrupted)
    with pytest.raises(KeyboardInterrupt):
        executor.run()
    assert all(f.done() and f.exception() is None for f in futures) and sorted(calls) == [0, 1, 2]


@pytest.fixture
def compiles_here(monkeypatch):
    """Compile-only Triton (sm_90, no GPU) with the disk cache on; yields the list that grows by one for
    every compile that runs its LLVM stage in this process."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.driver import driver

    from tritonpatch.targets import CompileOnlyDriver

    monkeypatch.setattr(driver, "_active", CompileOnlyDriver())
    monkeypatch.delenv("TRITON_ALWAYS_COMPILE", raising=False)
    compiled = []
    make_llir = CUDABackend.make_llir

    def counting_make_llir(self, *args):
        compiled.append(1)
        return make_llir(self, *args)

    monkeypatch.setattr(CUDABackend, "make_llir", counting_make_llir)
    kernel = fwd_kernels._attn_fwd_kernel
    monkeypatch.setattr(kernel, "device_caches", defaultdict(kernel.create_binder))   # no in-memory hits
    yield compiled


def warm_up(config):
    """Compile (not launch) the forward for ``config`` on a causal 256 x 256 problem."""
    q = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    block_mask = K.build_block_mask(K.causal(), 1, 2, 256, 256, block_m=128, block_n=64, device="cpu")
    return fwd_launch.launch(q, q, q, q.clone(), torch.zeros(1, 2, 256), block_mask, K.causal(), None, 0.125, config,
                             warmup=True)


def test_a_block_left_by_an_exception_leaves_its_kernels_usable(monkeypatch, tmp_path, compiles_here):
    """The exception goes on, and the compiles submitted before it complete: Triton 3.8+ keeps the
    submitted future as the kernel, so a later launch gets that kernel (not a failed future)."""
    from tritonpatch.kernels._runtime.launch import parallel_compiles

    monkeypatch.setenv("TRITONPATCH_COMPILE_THREADS", "2")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    config = fwd_configs.FwdConfig(128, 64, 4, 2)
    with pytest.raises(RuntimeError, match="tuning failed"):
        with parallel_compiles():
            pending = warm_up(config)
            raise RuntimeError("tuning failed")
    assert "ld.global" in pending.result().asm["ptx"]
    assert warm_up(config).asm["ptx"] == pending.result().asm["ptx"]


@pytest.mark.parametrize("where", ["workers", "threads"])
def test_tuning_candidates_compile_bit_for_bit_as_sequentially(monkeypatch, tmp_path, compiles_here, where):
    """parallel_compiles gives every candidate (the disable-lsr variant's included) the binary a sequential
    compile here gives (PTX and cubin): with the disk cache on, built by the workers only (no compile stage
    runs in this process); under TRITON_ALWAYS_COMPILE, without workers, on this process's threads (the
    Pipeline carried into each)."""
    from tritonpatch import llvm
    from tritonpatch.kernels._runtime.launch import parallel_compiles, pipeline_variants

    if not llvm.available():
        pytest.skip("tritonpatch._native is not usable here (no Pipeline variant to carry)")
    if where == "threads":
        monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
        # Triton parses each JIT function's source on every compile; on CPython 3.11 two threads building
        # ASTs at once can fail with "AST constructor recursion depth mismatch" (CPython gh-106905). The
        # tuner recompiles such a candidate at launch; this test compares binaries, so it parses one at a time.
        parse, parse_lock = ast.parse, threading.Lock()

        def parse_alone(*args, **kwargs):
            with parse_lock:
                return parse(*args, **kwargs)

        monkeypatch.setattr(ast, "parse", parse_alone)
    base = [fwd_configs.FwdConfig(128, 64, 4, 2, True), fwd_configs.FwdConfig(128, 64, 4, 2)]
    configs = base + pipeline_variants(base[:1])
    kernel = fwd_kernels._attn_fwd_kernel

    def compile_all(workers: int, cache: str) -> list:
        monkeypatch.setenv("TRITONPATCH_COMPILE_THREADS", str(workers))
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / cache))
        monkeypatch.setattr(kernel, "device_caches", defaultdict(kernel.create_binder))
        with parallel_compiles() if workers > 1 else contextlib.nullcontext():
            compiled = [warm_up(c) for c in configs]
        assert all(hasattr(c, "result") for c in compiled) == (workers > 1)   # futures only when deferred
        kernels = [c.result() if workers > 1 else c for c in compiled]
        return [(k.asm["ptx"], k.asm["cubin"]) for k in kernels]

    parallel = compile_all(2, "parallel")
    assert len(compiles_here) == (0 if where == "workers" else len(configs))
    sequential = compile_all(1, "sequential")
    assert parallel == sequential
    assert parallel[2][0] != parallel[0][0]   # the Pipeline reached its compile (disable-lsr changes the PTX)
