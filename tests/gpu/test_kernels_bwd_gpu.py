"""GPU numerics of the attention backward vs autograd through the fp32 reference (bf16, relative
error <= 2e-2 per gradient), both tile-load paths (pointers, TMA descriptors), determinism of
dq_mode="separate", and the inline-PTX red and TMA reduce-add dQ variants.
Run on the device machine: ``pytest -m gpu tests/gpu/test_kernels_bwd_gpu.py``."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import tritonpatch.kernels as K
from tritonpatch.kernels.bwd import backward as bwd_backward
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd import dq_adds as bwd_dq_adds
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from tritonpatch.kernels.autograd import attention_with_grad
from attention_cases import MASKS, rel_err
from index_probe import IndexProbe

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


def fixed_config(dq_mode, head_dim, use_tma, dq_add=bwd_dq_adds.ATOMIC_ADD):
    """The first tuning candidates of both kernels, with the given tile-load path and dQ add."""
    dkdv, dq = (dataclasses.replace(table[head_dim][0], use_tma=use_tma)
                for table in (bwd_configs.DKDV_CONFIGS, bwd_configs.DQ_CONFIGS))
    return bwd_configs.BwdConfig(dq_mode, dkdv, dq if dq_mode == "separate" else None, dq_add)


def backward(q, k, v, dout, dq_mode, head_dim, dq_add=bwd_dq_adds.ATOMIC_ADD, use_tma=False, **kwargs):
    fwd_config = fwd_configs.candidate_configs(head_dim, q.device)[0]
    out, lse = fwd_forward.attention_forward(q, k, v, config=fwd_config, **kwargs)
    return bwd_backward.attention_backward(q, k, v, out, lse, dout, dq_mode=dq_mode,
                                config=fixed_config(dq_mode, head_dim, use_tma, dq_add), **kwargs)


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


@pytest.mark.parametrize("use_tma", [False, True])
@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
def test_score_mod_and_its_gradient_never_see_a_position_past_the_ends(dq_mode, use_tma):
    """A score_mod (or its gradient) reading a per-key table would read past its end otherwise."""
    q, k, v, dout = make_inputs(2, 4, 4, SEQ, 64, seed=5)
    probe = IndexProbe("cuda")
    with probe.gradient_rule():
        got = backward(q, k, v, dout, dq_mode, 64, use_tma=use_tma, mask_mod=K.causal(), score_mod=probe.score_mod)
    assert_grads_close(got, reference_grads(q, k, v, dout, mask_mod=K.causal()))
    assert probe.seen() == {"score": (SEQ - 1, SEQ - 1), "gradient": (SEQ - 1, SEQ - 1)}


@pytest.mark.parametrize("score", ["alibi", "softcap"])
def test_score_mods_gqa_autograd_tuned(score):
    """Through AttentionFunction (tuned configs, dq_mode='auto'), GQA 8 -> 2 heads."""
    q, k, v, dout = make_inputs(2, 8, 2, 700, 128, seed=1)
    score_mod = K.alibi(K.alibi_slopes(8).to("cuda")) if score == "alibi" else K.softcap(20.0)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    attention_with_grad(*leaves, mask_mod=K.causal(), score_mod=score_mod, enable_gqa=True).backward(dout)
    want = reference_grads(q, k, v, dout, mask_mod=K.causal(), score_mod=score_mod, enable_gqa=True)
    assert_grads_close([t.grad for t in leaves], want)


@pytest.mark.parametrize("dq_add", [bwd_dq_adds.RED_ADD, bwd_dq_adds.TMA_ADD], ids=["red", "tma"])
@pytest.mark.parametrize("seq", [SEQ, SEQ - 37])                  # TMA clips the rows past the end
def test_other_dq_adds_match_reference(dq_add, seq):
    q, k, v, dout = make_inputs(2, 4, 4, seq, 64, seed=2)
    got = backward(q, k, v, dout, "atomic", 64, dq_add=dq_add, mask_mod=K.causal())
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


def test_inductor_trains_with_a_prebuilt_block_mask_and_refuses_a_stale_one():
    """torch.compile (Inductor, CUDA), forward and backward, with a causal document mask whose block mask
    was built under inference_mode: right against the fp32 reference while the ids are those it was built
    from; refused once the ids are written after the build; right again with a block mask built anew."""
    torch._dynamo.reset()
    q, k, v, dout = make_inputs(1, 4, 4, SEQ, 64, seed=4)
    ids = (torch.arange(SEQ, device="cuda") // 300).to(torch.int32)
    mask = K.and_masks(K.causal(), K.document(ids))
    with torch.inference_mode():
        built = {"block_mask": K.build_block_mask(mask, 1, 4, SEQ, SEQ, device="cuda")}
    run = torch.compile(lambda a, b, c: K.attention(a, b, c, mask_mod=mask, block_mask=built["block_mask"]))

    def check():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = run(*leaves)
        out.backward(dout)
        assert rel_err(out, K.reference.attention(q, k, v, mask_mod=mask)) <= 1e-2
        assert_grads_close([t.grad for t in leaves], reference_grads(q, k, v, dout, mask_mod=mask))

    check()
    ids[SEQ // 2:] += 1
    with pytest.raises(ValueError, match="block_mask was built from .* with other arguments, or before"):
        run(q, k, v)
    built["block_mask"] = K.build_block_mask(mask, 1, 4, SEQ, SEQ, device="cuda")
    check()
