"""The kernels written apart from the passes (tests/_support/data/unseen_kernels/, compiled for sm_90 by
tests/cpu/test_passes_unseen_kernels.py) launched on the GPU with each pass and with all three: every
output bit for bit the unpatched kernel's, and the unpatched outputs match the module's torch reference.

Each module's ``launch_case(device)`` returns one launch with seeded inputs and fresh outputs:
``grid``; ``args``, the positional kernel arguments without the constexprs (``compile_spec()`` gives
those and the options); ``outputs``, the indices in ``args`` of the tensors the kernel writes;
``reference()``, the expected outputs in fp32, compared within ``atol`` / ``rtol`` (equal NaNs equal),
where a ``valid`` list is given only ``output[valid[i]]``; ``nondeterministic``, indices among
``outputs`` whose bits vary between launches (float atomics), left out of the bitwise comparison.
tests/interpret/test_unseen_kernels_interpret.py checks the cases against the references in Triton's
interpreter.

Where skip-masked-blocks runs, elements the unpatched kernel leaves NaN are not compared: a row that
meets an all-masked tile while its max is still -inf comes out NaN, and the kernel without that tile
need not (docs/passes.md, "skip-masked-blocks")."""
from __future__ import annotations


import pytest
import torch

import tritonpatch
from tritonpatch.passes import collect_reports
from unseen_kernels import NAMES, load

pytestmark = pytest.mark.gpu

ALL = ["skip-masked-blocks", "elide-uniform-masks", "hoist-masks"]
BRANCH = "elide-uniform-masks(branch=true)"
PIPELINES = [[name] for name in ALL] + [ALL, [BRANCH], ["skip-masked-blocks", BRANCH, "hoist-masks"]]


@pytest.fixture(scope="module", autouse=True)
def always_compile(tmp_path_factory):
    """Every compile runs the passes (a cached kernel would carry no pass reports)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_ALWAYS_COMPILE", "1")
        patch.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
        yield


def launch(module, passes: list[str]):
    """A fresh launch case of ``module`` run on the GPU with ``passes``: (case, the passes' reports)."""
    spec, case = module.compile_spec(), module.launch_case("cuda")
    with collect_reports() as reports, tritonpatch.options(passes=passes):
        spec["fn"][case["grid"]](*case["args"], **spec["constexprs"], **spec["options"])
    return case, reports


def assert_bitwise_equal(patched, unpatched, what: str, unless_nan: bool):
    """``patched`` holds ``unpatched``'s bits (NaNs included), except where ``unless_nan`` and
    ``unpatched`` is NaN."""
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[unpatched.element_size()]
    differ = patched.view(bits) != unpatched.view(bits)
    if unless_nan:
        differ &= ~unpatched.isnan()
    count = int(differ.sum())
    if count:
        first = tuple(differ.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {count} of {differ.numel()} elements differ, the first at {first} "
                             f"({patched[first].item()!r} patched, {unpatched[first].item()!r} unpatched)")


@pytest.mark.parametrize("passes", PIPELINES, ids="+".join)
@pytest.mark.parametrize("name", NAMES)
def test_patched_launch_is_bitwise_equal_to_the_unpatched_one(name, passes):
    module = load(name)
    plain, _ = launch(module, [])
    patched, reports = launch(module, passes)
    print(f"{name}: changed by {sorted({r.name for r in reports if r.kept and any(r.counts.values())})}")
    valid = plain.get("valid", [slice(None)] * len(plain["outputs"]))
    for index, expected, where in zip(plain["outputs"], plain["reference"](), valid, strict=True):
        torch.testing.assert_close(plain["args"][index][where].double(), expected.double(), atol=plain["atol"],
                                   rtol=plain["rtol"], equal_nan=True,
                                   msg=lambda message: f"unpatched argument {index} vs the reference: {message}")
    for index in plain["outputs"]:
        if index not in plain.get("nondeterministic", []):
            assert_bitwise_equal(patched["args"][index], plain["args"][index], f"{name}, argument {index}",
                                 unless_nan="skip-masked-blocks" in passes)
