"""The tuners' compiles in forked worker processes (``kernels/_runtime/compile_workers.py``): workers run
their share and exit, a failing or hung one only costs time, a kernel asked for inside the block compiles
at once, and the tuner's candidates come out of the workers' cache bit for bit as compiled here."""
from __future__ import annotations

import contextlib
import os
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


def touch(path):
    return lambda: open(path, "w").close()


def test_workers_run_every_compile_once_in_another_process(tmp_path):
    parent = os.getpid()
    paths = [tmp_path / f"c{i}" for i in range(5)]

    def record(path):
        def compile_fn():
            path.write_text(str(os.getpid()))
        return compile_fn

    assert compile_in_workers([record(p) for p in paths], 3) == 3
    pids = {int(p.read_text()) for p in paths}
    assert len(pids) == 3 and parent not in pids


def test_a_failing_or_hung_worker_only_costs_time(tmp_path, monkeypatch):
    def fail():
        raise RuntimeError("compile failed")

    assert compile_in_workers([fail, touch(tmp_path / "ok")], 2) == 1
    assert (tmp_path / "ok").exists()
    monkeypatch.setattr(compile_workers, "WORKER_TIMEOUT_S", 0.5)
    start = time.monotonic()
    assert compile_in_workers([lambda: time.sleep(60), touch(tmp_path / "ok2")], 2) == 1
    assert time.monotonic() - start < 30 and (tmp_path / "ok2").exists()


def test_no_workers_where_they_cannot_help(tmp_path, monkeypatch):
    assert compile_in_workers([touch(tmp_path / "one")], 4) == 0   # a single compile
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


def test_tuning_candidates_come_from_the_workers_bit_for_bit(monkeypatch, tmp_path):
    """parallel_compiles with the disk cache on: every candidate (the disable-lsr variant's included) is
    compiled by the workers (no compile stage runs in this process) and loads as the binary a sequential
    compile here gives."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.driver import driver

    from tritonpatch import llvm
    from tritonpatch.kernels._runtime.launch import parallel_compiles, pipeline_variants
    from tritonpatch.targets import CompileOnlyDriver

    if not llvm.available():
        pytest.skip("tritonpatch._native is not usable here (no Pipeline variant to carry)")
    monkeypatch.setattr(driver, "_active", CompileOnlyDriver())
    monkeypatch.delenv("TRITON_ALWAYS_COMPILE", raising=False)
    compiled_here = []
    make_llir = CUDABackend.make_llir

    def counting_make_llir(self, *args):
        compiled_here.append(1)
        return make_llir(self, *args)

    monkeypatch.setattr(CUDABackend, "make_llir", counting_make_llir)
    kernel = fwd_kernels._attn_fwd_kernel
    base = [fwd_configs.FwdConfig(128, 64, 4, 2, True), fwd_configs.FwdConfig(128, 64, 4, 2)]
    configs = base + pipeline_variants(base[:1])
    q, k, v, out = (torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16) for _ in range(4))
    lse = torch.zeros(1, 2, 256)
    mask = K.causal()
    block_mask = K.build_block_mask(mask, 1, 2, 256, 256, block_m=128, block_n=64, device="cpu")

    def compile_all(workers: int, cache: str) -> list:
        monkeypatch.setenv("TRITONPATCH_COMPILE_THREADS", str(workers))
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / cache))
        monkeypatch.setattr(kernel, "device_caches", defaultdict(kernel.create_binder))   # no in-memory hits
        with parallel_compiles() if workers > 1 else contextlib.nullcontext():
            compiled = [fwd_launch.launch(q, k, v, out, lse, block_mask, mask, None, 0.125, c, warmup=True)
                        for c in configs]
        return [(c.result() if workers > 1 else c).asm["ptx"] for c in compiled]

    from_workers = compile_all(2, "workers")
    assert not compiled_here
    here = compile_all(1, "here")
    assert len(compiled_here) == len(configs)
    assert from_workers == here
    assert from_workers[2] != from_workers[0]   # the Pipeline reached its worker (disable-lsr changes the PTX)
