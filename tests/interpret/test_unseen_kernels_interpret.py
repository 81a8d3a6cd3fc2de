"""The launches of the kernels written apart from the passes (``launch_case`` in
tests/_support/data/unseen_kernels/) in Triton's interpreter against their torch references: the glue
that tests/gpu/test_passes_unseen_kernels_gpu.py launches on the GPU stays right.

Runs only with ``TRITON_INTERPRET=1`` set before Triton is imported:
``cd tests && TRITON_INTERPRET=1 python -m pytest interpret/test_unseen_kernels_interpret.py``.
"""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter tests run in their own TRITON_INTERPRET=1 process "
                                       "(cd tests && TRITON_INTERPRET=1 python -m pytest "
                                       "interpret/test_unseen_kernels_interpret.py)")

from tritonpatch.kernels._runtime.triton_compat import fix_interpreter_index  # noqa: E402
from unseen_kernels import NAMES, load  # noqa: E402

# the interpreter runs a loop's induction variable as a Python int, which has no .to()
CANNOT_INTERPRET = {name: "start_n.to(tl.int64) on the loop variable: a Python int in the interpreter"
                    for name in ("int64_index", "int64_loop")}


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # the NaN rows some cases expect
@pytest.mark.parametrize("name", NAMES)
def test_each_launch_case_matches_its_reference(name):
    if name in CANNOT_INTERPRET:
        pytest.skip(CANNOT_INTERPRET[name])
    fix_interpreter_index()       # Triton 3.6's interpreter and numpy >= 2.4: range() over a scalar argument
    module = load(name)
    spec, case = module.compile_spec(), module.launch_case("cpu")
    spec["fn"][case["grid"]](*case["args"], **spec["constexprs"], **spec["options"])
    valid = case.get("valid", [slice(None)] * len(case["outputs"]))
    for index, expected, where in zip(case["outputs"], case["reference"](), valid, strict=True):
        torch.testing.assert_close(case["args"][index][where].double(), expected.double(), atol=case["atol"],
                                   rtol=case["rtol"], equal_nan=True, msg=lambda m: f"argument {index}: {m}")


@pytest.mark.parametrize("name", NAMES)
def test_each_launch_case_is_seeded_and_makes_fresh_outputs(name):
    """Two calls give bitwise equal inputs (the GPU test compares a patched launch with an unpatched one)
    and outputs of their own; the nondeterministic outputs are among the outputs."""
    module = load(name)
    first, second = module.launch_case("cpu"), module.launch_case("cpu")
    assert set(first.get("nondeterministic", [])) <= set(first["outputs"])
    for index, (a, b) in enumerate(zip(first["args"], second["args"], strict=True)):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"argument {index} differs"
            if index in first["outputs"]:
                assert a.data_ptr() != b.data_ptr(), f"output {index} is shared between calls"
        else:
            assert a == b
