"""Cases shared by the attention tests: the mask factories at a sequence length, the error metric,
and running an interpreter-only test file in its own ``TRITON_INTERPRET=1`` process."""
from __future__ import annotations

import gc
import os
import re
import subprocess
import sys

import numpy
import pytest
import torch

import tritonpatch.kernels as K

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def doc_ids(seq, device):
    """Four documents of uneven lengths covering ``seq`` positions."""
    cuts = torch.tensor([0, seq // 5, seq // 2, seq - 100, seq])
    return torch.repeat_interleave(torch.arange(4, dtype=torch.int32), cuts.diff()).to(device)


# name -> factory(seq, device) of a mask_mod (None: attend everywhere)
MASKS = {
    "none": lambda s, d: None,
    "causal": lambda s, d: K.causal(),
    "prefix_lm": lambda s, d: K.prefix_lm(s // 4),
    "sliding_window": lambda s, d: K.sliding_window(256),
    "document": lambda s, d: K.and_masks(K.causal(), K.document(doc_ids(s, d))),
    "sliding|prefix": lambda s, d: K.or_masks(K.sliding_window(64), K.prefix_lm(128)),
}


def spill_allowance(bytes_on_triton_36: int) -> int:
    """Spill bytes a tuning candidate may show: as measured on Triton 3.6 (the candidate tables were
    tuned there); later versions allocate differently (3.9 spills more on some tiles), which the
    run-time tuner then weighs by timing."""
    import triton

    return bytes_on_triton_36 if triton.__version__.startswith("3.6.") else 2 * bytes_on_triton_36 + 64


def forward_candidates():
    """(head dim, config) of every forward config the Hopper tuner may pick, and their test ids."""
    from tritonpatch.kernels import attention_fwd as A

    cases = [(d, c) for d, configs in A._HOPPER_CONFIGS.items() for c in configs]
    return cases, [f"D{d}-{c.label()}" for d, c in cases]


def rel_err(got, ref):
    """‖got − ref‖ / ‖ref‖ in fp32."""
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


def run_interpreter_suite(test_file: str) -> tuple[int, int]:
    """Run ``tests/<test_file>`` with ``TRITON_INTERPRET=1`` in a fresh process (the variable must be
    set before Triton is imported); assert it passed and return (passed, skipped) counts."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           os.path.join(REPO, "tests", test_file)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = proc.stdout.splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped)", summary)}
    return counts.get("passed", 0), counts.get("skipped", 0)


def new_tensor_at_old_address(how: str, first_values, second_values, dtype, use, attempts: int = 20):
    """``(use(first), use(second))`` for two distinct tensors of one shape and dtype, both at version 0,
    where ``second`` lies at the address ``first`` had when ``use`` saw it: the case a cache keyed by
    address mistakes for a hit. ``how``: ``"freed"``, ``first`` is freed before ``second`` is made
    and the allocator hands its block out again (tried ``attempts`` times, then skipped: small blocks
    are usually reused at once, but not always); ``"shared"``, both are ``torch.from_numpy`` views of
    one buffer, rewritten in between through numpy (which bypasses the version counter), so this case
    never depends on the allocator. ``use`` must keep no reference to its tensor."""
    if how == "shared":
        buffer = torch.tensor(first_values, dtype=dtype).numpy()
        first = torch.from_numpy(buffer)
        first_result = use(first)
        buffer[...] = numpy.asarray(second_values)
        second = torch.from_numpy(buffer)
        assert second is not first and second.data_ptr() == first.data_ptr()
        assert second._version == first._version == 0
        return first_result, use(second)
    for _ in range(attempts):
        first = torch.tensor(first_values, dtype=dtype)
        address = first.data_ptr()
        source = torch.tensor(second_values, dtype=dtype)
        first_result = use(first)
        del first
        gc.collect()
        second = source.clone()   # the only allocation since first was freed
        if second.data_ptr() == address:
            return first_result, use(second)
    pytest.skip("the allocator did not hand a freed block out again (the 'shared' case covers this)")
