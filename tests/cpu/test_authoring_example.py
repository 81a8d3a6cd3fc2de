"""examples/masked_matmul.py: compile-only for sm_90 (CPU), the interpreter, and the GPU."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import triton

from tritonpatch import Pipeline
from tritonpatch import llvm as tllvm
from pipeline_helpers import raw_llvm_options
from tritonpatch._triton_compat import TRITON_VERSION
from tritonpatch.targets import compile_for_target

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
sys.path.insert(0, EXAMPLES)
import masked_matmul as example  # noqa: E402

needs_native = pytest.mark.skipif(not tllvm.available(), reason="tritonpatch._native is not usable here")


@pytest.fixture
def fresh_compiles(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))


@needs_native
def test_every_candidate_compiles_with_its_pipeline(fresh_compiles):
    """Each (config, Pipeline) candidate compiles for sm_90 with relaxed (fire-and-forget) atomics,
    and its PTX is plain Triton's under the same raw LLVM options; the pinned kernel compiles its
    Pipeline."""
    compiled = example.compile_candidates()
    assert set(compiled) == {(i, p) for i in range(len(example.CONFIGS)) for p in example.PIPELINES}
    assert all(re.search(r"\b(atom|red)\.global\.gpu\.relaxed\.add", kernel.asm["ptx"]) for kernel in compiled.values())
    index = example.CONFIGS.index(example.PINNED_CONFIG)
    config = example.PINNED_CONFIG
    options = {k: v for k, v in config.all_kwargs().items() if k not in config.kwargs}
    constexprs = config.kwargs
    plain = triton.jit(example.masked_matmul_kernel)
    for pipeline, raw in ((Pipeline(), {}), (Pipeline(disable_lsr=True), {"disable-lsr": True})):
        with raw_llvm_options(raw):
            reference = compile_for_target(plain, example.SIGNATURE, constexprs, **options).asm["ptx"]
        assert compiled[index, pipeline].asm["ptx"] == reference
    assert compiled[index, Pipeline()].asm["ptx"] != compiled[index, example.PINNED_PIPELINE].asm["ptx"]
    pinned = example.pinned_kernel.compile_for_target(example.SIGNATURE, constexprs, **options)
    assert pinned.asm["ptx"] == compiled[index, example.PINNED_PIPELINE].asm["ptx"]


@pytest.mark.skipif(TRITON_VERSION < (3, 9), reason="Triton 3.6's interpreter cannot take range() bounds from "
                    "integer arguments under NumPy 2 ('only 0-dimensional arrays can be converted')")
def test_pinned_kernel_in_the_interpreter():
    """The pinned kernel against float64, in a TRITON_INTERPRET=1 process."""
    code = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {EXAMPLES!r})
        import masked_matmul as example
        torch.manual_seed(0)
        worst = 0.0
        for M, N, K in ((100, 70, 90), (64, 130, 200)):
            a, b = torch.randn(M, K), torch.randn(K, N)
            out, ref = example.masked_matmul(a, b, tuned=False), example.reference(a, b)
            worst = max(worst, ((out.double() - ref).norm() / ref.norm()).item())
        print(worst)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TRITON_INTERPRET": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(result.stdout.strip().splitlines()[-1]) < 1e-5


@pytest.mark.gpu
def test_example_on_the_gpu(capsys):
    """Tuned (configs x Pipelines) and pinned kernels against float64."""
    import torch

    for M, N, K in ((1000, 700, 300), (512, 512, 2048)):
        a = torch.randn(M, K, device="cuda", dtype=torch.float16)
        b = torch.randn(K, N, device="cuda", dtype=torch.float16)
        expected = example.reference(a, b)
        for tuned in (True, False):
            out = example.masked_matmul(a, b, tuned=tuned)
            error = ((out.double() - expected).norm() / expected.norm()).item()
            assert error < 1e-3, (M, N, K, tuned, error)
        best = example.tuned_kernel.best_config
        assert best.pipeline in example.PIPELINES
        with capsys.disabled():
            print(f"\nmasked_matmul {M}x{N}x{K}: tuned winner {best.describe()}")
