"""Randomized attention against the fp32 reference: many calls with fresh tensors and fresh modifier
tensors of recurring shapes (tests/_support/attention_cases.py RandomCalls), the pattern that catches caches
fooled by a reused address or an in-place write, over every mask factory and their combinations,
custom modifiers with tensor arguments, score modifiers, GQA/MQA, Sq != Skv, ragged lengths, prebuilt
block masks, forward and backward.

GPU: ``python -m pytest -m gpu tests/cpu/test_attention_random.py`` (seed: ``ATTENTION_RANDOM_SEED``,
default 2024; a failure names the seed and the call). The CPU twin, in Triton's interpreter at small
sizes, is tests/interpret/test_attention_random_interpret.py; ``test_interpreter_suite`` runs it in its own
``TRITON_INTERPRET=1`` process.
"""
from __future__ import annotations

import pytest
import torch

from attention_cases import GPU_LIMITS, GPU_SHAPES, RandomCalls, check_random_call, random_seed, run_interpreter_suite


@pytest.mark.gpu
def test_random_calls_match_reference():
    """300 calls over 16 random families (a shape, bf16 or fp16, a mask, a score modifier, with the
    backward on about half, dq_mode atomic or separate) in random order, every one through
    ``K.attention`` and checked against the fp32 reference: out within 1e-2 relative error, lse
    within 1e-2 + 1e-3 |lse|, dq/dk/dv within 2e-2. The first call of a family tunes (compiles and
    times the candidates); the rest run from the caches under test. A few minutes on an H200."""
    for call in RandomCalls(random_seed(), "cuda", GPU_SHAPES, [torch.bfloat16, torch.float16], families=16,
                            count=300):
        check_random_call(call, GPU_LIMITS)
        del call   # its tensors are freed before the next call's are made


def test_interpreter_suite():
    """tests/interpret/test_attention_random_interpret.py in its own TRITON_INTERPRET=1 process."""
    passed, skipped = run_interpreter_suite("test_attention_random_interpret.py")
    assert passed >= 3 and skipped == 0
