"""The mask passes on kernels written apart from the passes, in the styles other codebases use
(tests/_support/data/unseen_kernels/: FlashAttention-2's run-time ``IS_CAUSAL``, ALiBi, sliding windows written
as what they drop, ``%`` on ragged lengths, int64 indices, loaded document masks, a dK/dV loop, masked
matmuls and reductions, stores and atomics in the loop, xor masks, scales after the select).

Each compiles for sm_90 with all three passes and falls back nowhere: a pass either rewrites a loop into IR
that Triton accepts and verifies, or leaves it and says why. (One of them, a loop whose end an ``if`` on a
run-time flag chooses, made elide-uniform-masks emit IR Triton rejected.) Each module has
``compile_spec()`` (what ``triton.compile`` needs) and ``reference(...)``, the same computation in torch."""
from __future__ import annotations

import warnings

import pytest

import tritonpatch
from attention_cases import run_interpreter_suite
from tritonpatch.passes import collect_reports
from tritonpatch.targets import compile_for_target
from unseen_kernels import NAMES, load

ALL = ["skip-masked-blocks", "elide-uniform-masks", "hoist-masks"]


@pytest.fixture(scope="module", autouse=True)
def always_compile(tmp_path_factory):
    """Every compile runs the passes (a cached kernel would carry no pass reports)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_ALWAYS_COMPILE", "1")
        patch.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
        yield


@pytest.mark.parametrize("name", NAMES)
def test_the_passes_rewrite_or_leave_each_loop_without_falling_back(name):
    spec = load(name).compile_spec()
    with warnings.catch_warnings(record=True) as caught, collect_reports() as reports, \
            tritonpatch.options(passes=ALL):
        warnings.simplefilter("always")
        compile_for_target(spec["fn"], spec["signature"], spec["constexprs"], target="sm_90", **spec["options"])
    assert not [str(w.message) for w in caught if "tritonpatch" in str(w.message)]
    assert sorted({r.name for r in reports}) == sorted(ALL) and all(r.kept for r in reports)


def test_launch_cases_match_their_references_in_the_interpreter():
    """tests/interpret/test_unseen_kernels_interpret.py in its own TRITON_INTERPRET=1 process: the
    launch glue the GPU test uses (tests/gpu/test_passes_unseen_kernels_gpu.py) computes what each
    module's torch reference does."""
    passed, _ = run_interpreter_suite("test_unseen_kernels_interpret.py")
    assert passed >= 40   # the suite really ran
