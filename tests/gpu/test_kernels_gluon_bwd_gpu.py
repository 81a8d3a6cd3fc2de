"""GPU numerics of the Gluon dK/dV kernel (the backward on Hopper) vs gradients through the fp32 reference:
every mask of the shared table at head dims 64 and 128 in both dq modes (atomic: dQ by the kernel's TMA
reduce-add; separate: the Triton-language dQ kernel beside it), GQA with Sq != Skv, ragged lengths, kv
blocks without a query, score modifiers and their gradients, fp16, transposed inputs, 3 buffers, repeatable
results in separate mode, and randomized calls with the kernel selected. Run on the device machine:
``pytest -m gpu tests/gpu/test_kernels_gluon_bwd_gpu.py``."""
from __future__ import annotations

import pytest
import torch

import tritonpatch.kernels as K
from tritonpatch.kernels.bwd import backward as bwd_backward
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd.gluon_launch import gluon_problem
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from attention_cases import (GPU_LIMITS, GPU_SHAPES, MASKS, RandomCalls, check_random_call, gluon_candidates_only,
                             random_seed, rel_err)

pytestmark = pytest.mark.gpu


def gluon_backward(dq_mode: str, head_dim: int, stages: int = 2) -> bwd_configs.BwdConfig:
    """The Gluon dK/dV kernel in ``dq_mode`` (separate: with the first Triton-language dQ candidate)."""
    if dq_mode == "atomic":
        return bwd_configs.BwdConfig("atomic", bwd_configs.gluon_config(stages))
    dq = [c for c in bwd_configs.DQ_CONFIGS[head_dim] if c.use_tma][0]
    return bwd_configs.BwdConfig("separate", bwd_configs.gluon_config(stages), dq)


def check_backward(q, k, v, config, mask=None, score=None, enable_gqa=False, limit=1e-2):
    """Gradients of the Gluon backward (given the reference's out and lse, so no forward is tuned) against
    autograd through the fp32 reference; returns them."""
    dout = torch.randn_like(q)
    problem = gluon_problem(q, k, v, dout, mask or K.allow_all(), score)
    if problem:
        pytest.skip(problem)
    out, lse = K.reference.attention(q, k, v, mask_mod=mask, score_mod=score, enable_gqa=enable_gqa, return_lse=True)
    grads = bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=mask, score_mod=score,
                                            enable_gqa=enable_gqa, config=config)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = K.reference.attention(*leaves, mask_mod=mask, score_mod=score, enable_gqa=enable_gqa)
    ref.backward(dout.float())
    for name, got, want in zip(("dq", "dk", "dv"), grads, leaves):
        assert torch.isfinite(got).all(), name
        assert rel_err(got, want.grad) <= limit, (name, rel_err(got, want.grad))
    return grads


@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", list(MASKS))
def test_masks_match_reference(name, head_dim, dq_mode):
    """A ragged length (1100: the last kv block and q tile are partial) with every mask."""
    seq, device = 1100, torch.device("cuda")
    q, k, v = (torch.randn(2, 4, seq, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    check_backward(q, k, v, gluon_backward(dq_mode, head_dim), MASKS[name](seq, device))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("groups", [2, 8])
def test_gqa_and_unequal_lengths(groups, head_dim):
    """dK/dV summed over each kv head's query heads; q tiles and kv blocks of different counts."""
    device = torch.device("cuda")
    q = torch.randn(2, 8, 700, head_dim, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 8 // groups, 1300, head_dim, device=device, dtype=torch.bfloat16) for _ in range(2))
    check_backward(q, k, v, gluon_backward("atomic", head_dim), K.causal(), enable_gqa=True)
    check_backward(q, k, v, gluon_backward("separate", head_dim), None, enable_gqa=True)


def test_kv_blocks_without_a_query():
    """Key padding of the first 300 keys: kv blocks no query attends to get zero dK/dV (a program with no
    step), and the rows without a key (lse -inf) give zero dQ."""
    device = torch.device("cuda")
    q, k, v = (torch.randn(2, 4, 1024, 128, device=device, dtype=torch.bfloat16) for _ in range(3))
    mask = K.and_masks(K.causal(), K.key_padding(torch.arange(1024, device=device) >= 300))
    dq, dk, dv = check_backward(q, k, v, gluon_backward("atomic", 128), mask)
    assert (dk[:, :, :300] == 0).all() and (dv[:, :, :300] == 0).all() and (dq[:, :, :300] == 0).all()


@pytest.mark.parametrize("score", ["alibi", "softcap"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_score_mods(score, head_dim):
    """The score modifiers and their gradient rules, in fp16."""
    device = torch.device("cuda")
    q, k, v = (torch.randn(2, 8, 900, head_dim, device=device, dtype=torch.float16) for _ in range(3))
    mod = K.alibi(K.alibi_slopes(8).to(device)) if score == "alibi" else K.softcap(20.0)
    check_backward(q, k, v, gluon_backward("atomic", head_dim), K.causal(), mod)


def test_transposed_inputs_single_tile_and_three_buffers():
    """Inputs as Hugging Face passes them ([B, S, H, D] transposed), a sequence shorter than one kv block,
    and 3 Q/dO buffers."""
    device = torch.device("cuda")
    q, k, v = (torch.randn(2, 300, 4, 128, device=device, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    check_backward(q, k, v, gluon_backward("atomic", 128), K.causal())
    q, k, v = (torch.randn(1, 2, 37, 64, device=device, dtype=torch.bfloat16) for _ in range(3))
    check_backward(q, k, v, gluon_backward("atomic", 64), K.causal())
    q, k, v = (torch.randn(2, 4, 1000, 128, device=device, dtype=torch.bfloat16) for _ in range(3))
    check_backward(q, k, v, gluon_backward("atomic", 128, stages=3), MASKS["sliding|prefix"](1000, device))


def test_separate_mode_is_repeatable():
    """In separate mode nothing is added atomically: runs give the same bits (and no race between the
    consumers, the loader and the writer shows up as a difference)."""
    device = torch.device("cuda")
    q, k, v, dout = (torch.randn(4, 16, 2048, 128, device=device, dtype=torch.bfloat16) for _ in range(4))
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=K.causal(), config=fwd_configs.GLUON_CONFIGS[128][0])
    config = gluon_backward("separate", 128)
    first = bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=K.causal(), config=config)
    for _ in range(3):
        again = bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=K.causal(), config=config)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_candidates_give_the_bits_of_tritons_defaults(head_dim):
    """The candidates' Pipelines change instruction selection and address arithmetic only (disable-lsr; and the
    SLP vectorizer off, ``+no-slp``, where it packs the masks into bit vectors): in separate mode each one's
    gradients are bitwise those of the same kernel under Triton's defaults (and match the reference)."""
    candidates = [c for c in bwd_configs.gluon_candidates() if c.pipeline is not None]
    if not candidates:
        pytest.skip("tritonpatch._native is not usable here (no Pipeline candidate)")
    device = torch.device("cuda")
    q, k, v = (torch.randn(2, 4, 1100, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    dq = [c for c in bwd_configs.DQ_CONFIGS[head_dim] if c.use_tma][0]
    mask = MASKS["sliding|prefix"](1100, device)
    torch.manual_seed(0)
    defaults = check_backward(q, k, v, bwd_configs.BwdConfig("separate", bwd_configs.GLUON_CONFIGS[0], dq), mask)
    for config in candidates:
        torch.manual_seed(0)   # the same dout
        grads = check_backward(q, k, v, bwd_configs.BwdConfig("separate", config, dq), mask)
        assert all(torch.equal(a, b) for a, b in zip(defaults, grads)), config.label()


@pytest.fixture
def gluon_selected(monkeypatch):
    """The backward tuner offers only the Gluon dK/dV candidates wherever they apply (the Triton-language
    ones elsewhere), with no earlier decision or resolved call kept."""
    from tritonpatch.kernels.bwd import tuner as bwd_tuner

    def forget():
        bwd_tuner.forget_tuned()
        bwd_backward.resolved_calls.clear()

    yield from gluon_candidates_only(monkeypatch, bwd_tuner, "candidates", forget)


def test_random_calls_with_gluon_selected(gluon_selected):
    """The randomized calls of tests/cpu/test_attention_random.py (fresh tensors, modifiers at reused
    addresses, written in place, every mask and score modifier, GQA, ragged, both dq modes) with the Gluon
    dK/dV kernel wherever it applies, every call with its backward: 120 calls against the fp32 reference."""
    for call in RandomCalls(random_seed(), "cuda", GPU_SHAPES, [torch.bfloat16, torch.float16], families=12,
                            count=120, backward_share=1.0):
        check_random_call(call, GPU_LIMITS)
        del call
