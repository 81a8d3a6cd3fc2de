"""Randomized attention in Triton's interpreter against the reference: the CPU twin of
tests/cpu/test_attention_random.py at small sizes, plus the packed-sequence loop that once reused freed
doc_ids addresses.

Runs only with ``TRITON_INTERPRET=1`` set before Triton is imported;
``test_attention_random.py::test_interpreter_suite`` starts such a process. Seed:
``ATTENTION_RANDOM_SEED`` (default 2024); a failure names the seed and the call.
"""
from __future__ import annotations

import os

import pytest
import torch
import triton.language as tl  # noqa: F401 - the interpreter needs tl in jit functions' globals

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter tests run in their own TRITON_INTERPRET=1 process "
                                       "(tests/cpu/test_attention_random.py::test_interpreter_suite)")

import tritonpatch.kernels as K  # noqa: E402
from attention_cases import (RandomCalls, check_random_call, new_tensor_at_old_address,  # noqa: E402
                             random_seed)

SHAPES = [(1, 2, 2, 40, 40, 16), (2, 2, 1, 33, 47, 16), (1, 4, 2, 64, 64, 32), (2, 1, 1, 50, 21, 16)]
LIMITS = {torch.float32: {"out": 1e-4, "grad": 1e-4, "lse": 1e-4, "lse_rtol": 1e-5},
          torch.float16: {"out": 2e-3, "grad": 2e-2, "lse": 1e-3, "lse_rtol": 1e-3}}


def test_random_calls_match_reference():
    """30 calls over 8 random families (as the GPU test, at interpreter sizes, fp32 and fp16)."""
    for call in RandomCalls(random_seed(), "cpu", SHAPES, [torch.float32, torch.float16], families=8, count=30,
                            backward_share=0.3):
        check_random_call(call, LIMITS[call.family.dtype])
        del call   # its tensors are freed before the next call's are made


def test_packed_sequence_loop():
    """New doc_ids of one shape every step, the previous ones freed (their addresses are handed out
    again): every step matches the reference."""
    seq, dim = 128, 16
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, seq, dim, generator=gen) for _ in range(3))
    wrong = []
    for step in range(16):
        lengths = [[64, 64], [16] * 8, [100, 28], [32] * 4][step % 4]
        ids = torch.tensor([i for i, n in enumerate(lengths) for _ in range(n)], dtype=torch.int32)
        mask = K.and_masks(K.causal(), K.document(ids))
        error = (K.attention(q, k, v, mask_mod=mask) - K.reference.attention(q, k, v, mask_mod=mask)).abs().max()
        if error > 1e-4:
            wrong.append((step, lengths, float(error)))
        del ids, mask
    assert not wrong, f"steps with wrong results (step, lengths, max error): {wrong}"


def test_new_ids_at_an_old_address():
    """Attention, forward and backward, with new doc_ids at the address of earlier ones (a numpy buffer
    rewritten behind the version counter: no dependence on the allocator)."""
    seq = 64
    gen = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(1, 2, seq, 16, generator=gen) for _ in range(4))

    def errors(ids):
        mask = K.and_masks(K.causal(), K.document(ids))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = K.attention(*leaves, mask_mod=mask)
        ref = K.reference.attention(*ref_leaves, mask_mod=mask)
        torch.autograd.backward(out, dout)
        torch.autograd.backward(ref, dout)
        return [float((a - b).abs().max()) for a, b in zip([out.detach(), *(t.grad for t in leaves)],
                                                         [ref.detach(), *(t.grad for t in ref_leaves)])]

    first, second = new_tensor_at_old_address("shared", [0] * 32 + [1] * 32, [0] * 8 + [1] * 40 + [2] * 16,
                                              torch.int32, errors)
    assert max(first) <= 1e-4 and max(second) <= 1e-4, (first, second)


def test_inference_mode_calls():
    """Everything under ``torch.inference_mode()`` (serving): document ids, alibi slopes and block
    masks (ours, Flex's) made there have no version counter; the calls work, and ids written in
    place between two calls inside inference mode give the second call's result (nothing is served
    from a cache)."""
    seq = 64
    gen = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        q, k, v = (torch.randn(1, 2, seq, 16, generator=gen) for _ in range(3))
        ids = torch.tensor([0] * 32 + [1] * 32, dtype=torch.int32)
        slopes = torch.tensor([0.5, 0.25])
        mask, score = K.and_masks(K.causal(), K.document(ids)), K.alibi(slopes)
        errors = []
        for new_ids in ([0] * 32 + [1] * 32, [0] * 8 + [1] * 40 + [2] * 16):
            ids.copy_(torch.tensor(new_ids, dtype=torch.int32))   # in place: the version counter is absent
            for modifiers in ({"mask_mod": mask}, {"score_mod": score}, {"mask_mod": mask, "score_mod": score}):
                got = K.attention(q, k, v, **modifiers)
                errors.append(float((got - K.reference.attention(q, k, v, **modifiers)).abs().max()))
        built = K.build_block_mask(mask, 1, 2, seq, seq, block_m=32, block_n=16, device="cpu")
        got = K.attention(q, k, v, mask_mod=mask, block_mask=built)
        errors.append(float((got - K.reference.attention(q, k, v, mask_mod=mask)).abs().max()))
        flex = pytest.importorskip("torch.nn.attention.flex_attention")
        flex_mask = flex.create_block_mask(lambda b, h, qi, kv: qi >= kv, None, None, seq, seq, device="cpu",
                                           BLOCK_SIZE=16)
        got = K.attention(q, k, v, mask_mod=K.causal(), block_mask=flex_mask)
        errors.append(float((got - K.reference.attention(q, k, v, mask_mod=K.causal())).abs().max()))
    assert max(errors) <= 1e-4, errors
