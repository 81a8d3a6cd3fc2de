"""The stickiness proof: an option set for one compile leaves every later compile, in the same
process, byte-identical to a compile in a fresh process."""
from __future__ import annotations

import pytest

import tritonpatch
from compile_helpers import compile_ptx, digest, fresh_process_ptx_digest
from pipeline_helpers import raw_llvm_options
from test_llvm_options import llvm_state_unchanged, state, triton_initialized  # noqa: F401 (fixtures)
from tritonpatch.errors import OptionTypeError


@pytest.mark.parametrize("kernel,settings", [
    ("masked_attention", {"disable-lsr": True}),
    # unroll-threshold acts only when specified (LLVM reads getNumOccurrences()).
    ("fixed_trip_loop", {"unroll-threshold": 0}),
])
def test_scoped_option_leaves_no_trace(fresh_compiles, kernel, settings):
    default = compile_ptx(kernel)
    with raw_llvm_options(settings):
        patched = compile_ptx(kernel)
    after = compile_ptx(kernel)
    assert patched != default, f"{settings} should change the PTX of {kernel}"
    assert after == default
    assert digest(after) == fresh_process_ptx_digest(kernel, {"TRITON_ALWAYS_COMPILE": "1"})


@pytest.mark.parametrize("settings", [
    {"opt-bisect-limit": 20},        # its callback sets the pass bisector's limit
    {"time-passes-per-run": True},   # its callback switches time-passes on
])
def test_option_with_a_callback_leaves_no_trace(fresh_compiles, settings):
    """Setting these runs a ``cl::cb`` callback that changes LLVM state outside the option, which
    restoring the option does not undo. Whatever tritonpatch does with them (it refuses them), the
    plain compile after the block must match a fresh process's, and every option (``time-passes``
    included) must read as before."""
    before = state()
    try:
        with tritonpatch.options(llvm=settings):
            compile_ptx("masked_attention")
    except OptionTypeError as exc:
        assert "callback" in str(exc)
    after = compile_ptx("masked_attention")
    assert digest(after) == fresh_process_ptx_digest("masked_attention", {"TRITON_ALWAYS_COMPILE": "1"}), (
        f"{settings} leaked into the next plain compile")
    assert state() == before
