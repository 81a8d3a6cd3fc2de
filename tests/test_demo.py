"""`tritonpatch demo` end to end on a CPU machine: both kernels compiled under every demo pipeline."""
from __future__ import annotations

import pytest

from test_cli import run_cli
from tritonpatch import demo


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="on a GPU the demo also times kernels")
def test_demo_runs_compile_only_and_shows_the_passes_working():
    result = run_cli("demo")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "no GPU (compile-only, target sm_90)" in out and "timings skipped" in out
    for column in [*demo.SEED_PIPELINES, "unmasked (reference)"]:
        assert column in out
    assert "skip-masked-blocks on ttir: loops_narrowed=1" in out
    assert "elide-uniform-masks on ttir: loops_split=1" in out
    registers = next(line for line in out.splitlines() if line.strip().startswith("registers"))
    assert all(int(n) > 0 for n in registers.split()[1:])
