"""GPU numerics of the attention backward vs autograd through the fp32 reference (bf16, relative
error <= 2e-2 per gradient), both tile-load paths (pointers, TMA descriptors), determinism of
dq_mode="separate", and the inline-PTX red and TMA reduce-add dQ variants.
Run on the device machine: ``pytest -m gpu tests/test_kernels_bwd_gpu.py``."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import tritonpatch.kernels as K
from tritonpatch.kernels import attention_bwd as B
from tritonpatch.kernels import attention_fwd as A
from tritonpatch.kernels.autograd import attention_with_grad
from attention_cases import MASKS, rel_err

pytestmark = pytest.mark.gpu
SEQ = 1100   # not a multiple of any tile: sequence-end paths


def make_inputs(batch, heads, kv_heads, seq, head_dim, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape_q, shape_kv = (batch, heads, seq, head_dim), (batch, kv_heads, seq, head_dim)
    q = torch.randn(shape_q, device="cuda", generator=gen, dtype=torch.bfloat16)
    k = torch.randn(shape_kv, device="cuda", generator=gen, dtype=torch.bfloat16)
    v = torch.randn(shape_kv, device="cuda", generator=gen, dtype=torch.bfloat16)
    dout = torch.randn(shape_q, device="cuda", generator=gen, dtype=torch.bfloat16)
    return q, k, v, dout


def reference_grads(q, k, v, dout, **kwargs):
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    K.reference.attention(*leaves, **kwargs).backward(dout.float())
    return [t.grad for t in leaves]


def fixed_config(dq_mode, head_dim, use_tma):
    """The first tuning candidates of both kernels, with the given tile-load path."""
    dkdv, dq = (dataclasses.replace(table[head_dim][0], use_tma=use_tma) for table in (B._DKDV_CONFIGS, B._DQ_CONFIGS))
    return B.BwdConfig(dq_mode, dkdv, dq if dq_mode == "separate" else None)


def backward(q, k, v, dout, dq_mode, head_dim, dq_write="atomic", use_tma=False, **kwargs):
    fwd_config = A.candidate_configs(head_dim, q.device)[0]
    out, lse = A.attention_forward(q, k, v, config=fwd_config, **kwargs)
    return B.attention_backward(q, k, v, out, lse, dout, dq_mode=dq_mode,
                                config=fixed_config(dq_mode, head_dim, use_tma), dq_write=dq_write, **kwargs)


def assert_grads_close(got, want, limit=2e-2):
    errors = {name: rel_err(g, w) for name, g, w in zip(("dq", "dk", "dv"), got, want)}
    assert all(e <= limit for e in errors.values()), errors


@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", list(MASKS))
def test_every_mask_matches_reference(name, head_dim, dq_mode):
    q, k, v, dout = make_inputs(2, 4, 4, SEQ, head_dim)
    mask_mod = MASKS[name](SEQ, q.device)
    got = backward(q, k, v, dout, dq_mode, head_dim, mask_mod=mask_mod)
    assert_grads_close(got, reference_grads(q, k, v, dout, mask_mod=mask_mod))


@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", ["causal", "sliding_window", "document"])
def test_tma_loads_match_reference(name, head_dim, dq_mode):
    """use_tma: Q/dO (dK/dV kernel) and K/V (dQ kernel) through descriptors; S=1100 ends inside a tile."""
    q, k, v, dout = make_inputs(2, 4, 4, SEQ, head_dim, seed=4)
    mask_mod = MASKS[name](SEQ, q.device)
    got = backward(q, k, v, dout, dq_mode, head_dim, use_tma=True, mask_mod=mask_mod)
    assert_grads_close(got, reference_grads(q, k, v, dout, mask_mod=mask_mod))


@pytest.mark.parametrize("score", ["alibi", "softcap"])
def test_score_mods_gqa_autograd_tuned(score):
    """Through AttentionFunction (tuned configs, dq_mode='auto'), GQA 8 -> 2 heads."""
    q, k, v, dout = make_inputs(2, 8, 2, 700, 128, seed=1)
    score_mod = K.alibi(K.alibi_slopes(8).to("cuda")) if score == "alibi" else K.softcap(20.0)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    attention_with_grad(*leaves, mask_mod=K.causal(), score_mod=score_mod, enable_gqa=True).backward(dout)
    want = reference_grads(q, k, v, dout, mask_mod=K.causal(), score_mod=score_mod, enable_gqa=True)
    assert_grads_close([t.grad for t in leaves], want)


@pytest.mark.parametrize("dq_write", ["red", "tma"])
@pytest.mark.parametrize("seq", [SEQ, SEQ - 37])                  # TMA clips the rows past the end
def test_other_dq_adds_match_reference(dq_write, seq):
    q, k, v, dout = make_inputs(2, 4, 4, seq, 64, seed=2)
    got = backward(q, k, v, dout, "atomic", 64, dq_write=dq_write, mask_mod=K.causal())
    assert_grads_close(got, reference_grads(q, k, v, dout, mask_mod=K.causal()))


def test_separate_is_bitwise_deterministic():
    q, k, v, dout = make_inputs(2, 8, 8, 2048, 64, seed=3)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = []
        for _ in range(3):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            attention_with_grad(*leaves, mask_mod=K.causal()).backward(dout)   # auto -> separate
            runs.append([t.grad for t in leaves])
    finally:
        torch.use_deterministic_algorithms(previous)
    assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("name", list(MASKS))
def test_warp_specialized_split_dq_matches_reference(name, heads, kv_heads):
    """The split dQ (partial tiles into fp32, then the warp-specialized full tiles) against the fp32
    reference, and against the one-kernel dQ with the same tiles (the same fp32 products, summed
    partial tiles first: equal up to the order of the sum)."""
    seq, gqa = 1024, heads != kv_heads
    q, k, v, dout = make_inputs(2, heads, kv_heads, seq, 128, seed=5)
    mask_mod = MASKS[name](seq, q.device)
    assert B.warp_specialize_problem(q, k, v, dout, None, None) is None
    out, lse = A.attention_forward(q, k, v, mask_mod=mask_mod, enable_gqa=gqa,
                                   config=A.candidate_configs(128, q.device)[0])
    results = {}
    for dq_config in (B.WARP_SPECIALIZED_DQ_CONFIG, B.SPLIT_PARTIAL_DQ_CONFIG):
        config = B.BwdConfig("separate", B._DKDV_CONFIGS[128][0], dq_config)
        results[dq_config] = B.attention_backward(q, k, v, out, lse, dout, mask_mod=mask_mod, config=config,
                                                  enable_gqa=gqa)
        replayed = B.attention_backward(q, k, v, out, lse, dout, mask_mod=mask_mod, config=config, enable_gqa=gqa)
        assert all(torch.equal(a, b) for a, b in zip(results[dq_config], replayed))   # the recorded launches
    split, one_kernel = results[B.WARP_SPECIALIZED_DQ_CONFIG], results[B.SPLIT_PARTIAL_DQ_CONFIG]
    assert_grads_close(split, reference_grads(q, k, v, dout, mask_mod=mask_mod, enable_gqa=gqa))
    assert rel_err(split[0], one_kernel[0]) <= 5e-3
    assert all(torch.equal(a, b) for a, b in zip(split[1:], one_kernel[1:]))   # dK, dV: the same kernel


def test_warp_specialized_split_dq_rejected_where_it_cannot_run():
    q, k, v, dout = make_inputs(1, 2, 2, 1000, 128)
    assert "multiples" in B.warp_specialize_problem(q, k, v, dout, None, None)
    assert "score_mod" in B.warp_specialize_problem(q, k, v, dout, K.softcap(5.0), None)
    out, lse = A.attention_forward(q, k, v, mask_mod=K.causal())
    config = B.BwdConfig("separate", B._DKDV_CONFIGS[128][0], B.WARP_SPECIALIZED_DQ_CONFIG)
    with pytest.raises(ValueError, match="warp-specialized dQ"):
        B.attention_backward(q, k, v, out, lse, dout, mask_mod=K.causal(), config=config)
