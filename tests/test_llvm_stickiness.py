"""The stickiness proof: an option set for one compile leaves every later compile, in the same
process, byte-identical to a compile in a fresh process."""
from __future__ import annotations

import pytest

from compile_helpers import compile_ptx, digest, fresh_process_ptx_digest
from tritonpatch.llvm import llvm_options


@pytest.mark.parametrize("kernel,settings", [
    ("masked_attention", {"disable-lsr": True}),
    # unroll-threshold acts only when specified (LLVM reads getNumOccurrences()).
    ("fixed_trip_loop", {"unroll-threshold": 0}),
])
def test_scoped_option_leaves_no_trace(fresh_compiles, kernel, settings):
    default = compile_ptx(kernel)
    with llvm_options(settings):
        patched = compile_ptx(kernel)
    after = compile_ptx(kernel)
    assert patched != default, f"{settings} should change the PTX of {kernel}"
    assert after == default
    assert digest(after) == fresh_process_ptx_digest(kernel, {"TRITON_ALWAYS_COMPILE": "1"})
