"""Shared pytest setup: a private Triton cache for the run, GPU tests skip without CUDA (and the
summary says how many and how to run them), slow tests skip unless ``-m slow`` asks for them,
compile tests never reuse a cached kernel."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

# tests import their helpers (tests/_support: compile_helpers, attention_cases, ...) and the IR corpus package
sys.path[:0] = [os.path.join(os.path.dirname(__file__), "_support"), os.path.dirname(__file__)]
# `python -m pytest` in the checkout puts its root on the path, where the source folder kernels/ (installed
# as tritonpatch.kernels) would shadow the PyPI package `kernels` that transformers imports
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _ROOT]


GPU_SKIP_REASON = "needs a CUDA GPU (run on the device machine)"


def pytest_configure(config):
    """Compile into a private Triton cache and keep tuning decisions in a private directory (both
    removed at the end), unless the caller chose them: the suite never reads stale kernels from,
    or grows, the user's ~/.triton/cache and ~/.cache/tritonpatch. Child processes inherit them."""
    private = {"TRITON_CACHE_DIR": "triton-cache", "TRITONPATCH_TUNING_CACHE": "tuning"}
    if any(name not in os.environ for name in private):
        root = tempfile.mkdtemp(prefix="tritonpatch-tests-")
        config._tritonpatch_private_root = root
        for name, folder in private.items():
            os.environ.setdefault(name, os.path.join(root, folder))


def pytest_unconfigure(config):
    root = getattr(config, "_tritonpatch_private_root", None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    """One line saying how many tests skipped for want of a GPU, and how to run them."""
    skipped = terminalreporter.stats.get("skipped", [])
    gpu = sum(1 for report in skipped if GPU_SKIP_REASON in str(report.longrepr))
    if gpu:
        terminalreporter.write_line(
            f"{gpu} of {len(skipped)} skipped tests need a CUDA GPU: on a GPU machine run "
            "`python -m pytest -m gpu` (the rest say why with -rs)")


def _cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


SLOW_SKIP_REASON = "a wider fuzz range, opt-in: run with `python -m pytest -m slow`"


def pytest_collection_modifyitems(config, items):
    """GPU tests skip without CUDA; slow tests (more fuzz seeds) skip unless ``-m`` names them."""
    skips = []
    if "slow" not in (config.getoption("markexpr") or ""):
        skips.append(("slow", pytest.mark.skip(reason=SLOW_SKIP_REASON)))
    if not _cuda_available():
        skips.append(("gpu", pytest.mark.skip(reason=GPU_SKIP_REASON)))
    for item in items:
        for keyword, skip in skips:
            if keyword in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def fresh_compiles(monkeypatch, tmp_path):
    """Compile for real every time, into a private cache dir."""
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
