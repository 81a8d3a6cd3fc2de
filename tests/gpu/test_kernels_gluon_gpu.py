"""GPU numerics of the Gluon forward (Hopper) vs the fp32 reference: every mask of the shared table,
head dims 64 and 128, 1, 2 and 3 consumer warpgroups (1 to 3 programs per SM), with and without ping-pong,
head-grouped program order, GQA, Sq != Skv and
ragged lengths, rows without keys, loops without tiles, score modifiers, fp16. Run on the device
machine: ``pytest -m gpu tests/gpu/test_kernels_gluon_gpu.py``."""
from __future__ import annotations

import dataclasses
import unittest.mock

import pytest
import torch

import tritonpatch.kernels as K
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from tritonpatch.kernels.fwd.gluon_launch import gluon_problem
from attention_cases import (GPU_LIMITS, GPU_SHAPES, MASKS, RandomCalls, check_random_call, gluon_candidates_only,
                             random_seed, rel_err)

pytestmark = pytest.mark.gpu


def gluon_config(block_m=128, block_n=128, stages=2, pingpong=False):
    return fwd_configs.gluon_config(block_m, block_n, stages, pingpong)


def check_forward(q, k, v, config, mask=None, score=None, enable_gqa=False):
    problem = gluon_problem(q, k, v, mask or K.allow_all(), score)
    if problem:
        pytest.skip(problem)
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask, score_mod=score, enable_gqa=enable_gqa,
                                             config=config)
    ref, ref_lse = K.reference.attention(q, k, v, mask_mod=mask, score_mod=score, enable_gqa=enable_gqa,
                                         return_lse=True)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) <= 1e-2
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("pingpong", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", list(MASKS))
def test_masks_match_reference(name, head_dim, pingpong):
    """A ragged length (1100: the last q-block and kv tile are partial) with every mask."""
    seq, device = 1100, torch.device("cuda")
    q, k, v = (torch.randn(2, 4, seq, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    check_forward(q, k, v, gluon_config(pingpong=pingpong), MASKS[name](seq, device))


@pytest.mark.parametrize("pingpong", [False, True])
@pytest.mark.parametrize("block_m, block_n, stages", [(128, 128, 3), (128, 64, 2), (192, 128, 2), (192, 128, 3),
                                                      (192, 64, 3)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_tile_shapes_and_stages(head_dim, block_m, block_n, stages, pingpong):
    """2 or 3 consumer warpgroups, kv tiles of 64 or 128, 2 or 3 buffers (those that fit shared memory)."""
    if head_dim == 128 and block_m == 192:
        pytest.skip("160 registers per consumer spill at D=128")
    seq, device = 1000, torch.device("cuda")
    q, k, v = (torch.randn(2, 3, seq, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    check_forward(q, k, v, gluon_config(block_m, block_n, stages, pingpong), MASKS["sliding|prefix"](seq, device))


@pytest.mark.parametrize("pingpong", [False, True])
def test_loops_without_tiles_and_rows_without_keys(pingpong):
    """No mask on tile-multiple lengths (no partial tile: the second loop runs no tile, so no turn), and
    causal & key padding of the first 300 keys (q-blocks without a tile; rows without a key: output 0,
    log-sum-exp -inf)."""
    device = torch.device("cuda")
    q, k, v = (torch.randn(2, 4, 1024, 128, device=device, dtype=torch.bfloat16) for _ in range(3))
    check_forward(q, k, v, gluon_config(pingpong=pingpong), None)
    mask = K.and_masks(K.causal(), K.key_padding(torch.arange(1024, device=device) >= 300))
    check_forward(q, k, v, gluon_config(pingpong=pingpong), mask)
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=gluon_config(pingpong=pingpong))
    assert (out[:, :, :300] == 0).all() and (lse[:, :, :300] == float("-inf")).all()


@pytest.mark.parametrize("groups", [2, 8])
def test_gqa_and_unequal_lengths(groups):
    device = torch.device("cuda")
    q = torch.randn(2, 8, 700, 128, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 8 // groups, 1300, 128, device=device, dtype=torch.bfloat16) for _ in range(2))
    check_forward(q, k, v, gluon_config(), K.causal(), enable_gqa=True)
    check_forward(q, k, v, gluon_config(), None, enable_gqa=True)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_disable_lsr_candidate_gives_the_plain_candidates_bits(head_dim):
    """The tuner's disable-lsr candidate changes address arithmetic only: bitwise the plain candidate's output
    and log-sum-exp (and both match the reference)."""
    candidates = fwd_configs.gluon_candidates(head_dim)
    if not [c for c in candidates if c.pipeline is not None]:
        pytest.skip("tritonpatch._native is not usable here (no disable-lsr candidate)")
    plain, variant = candidates[0], candidates[-1]
    seq, device = 1100, torch.device("cuda")
    q, k, v = (torch.randn(2, 4, seq, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    mask = MASKS["sliding|prefix"](seq, device)
    for config in (plain, variant):
        check_forward(q, k, v, config, mask)
    first, again = (fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=c) for c in (plain, variant))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.parametrize("head_dim", [64, 128])
def test_candidates_without_mask_bit_packing_give_triton_defaults_bits(head_dim):
    """Where the candidates compile with LLVM's SLP vectorizer off (Triton 3.6, whose SLP packs the partial
    tiles' masks into bit vectors), each one's output and log-sum-exp are bitwise those of the same config
    under Triton's defaults: the option changes instruction selection, not arithmetic."""
    changed = [c for c in fwd_configs.gluon_candidates(head_dim)
               if c.pipeline is not None and dict(c.pipeline.llvm).get("vectorize-slp") is False]
    if not changed:
        pytest.skip("the candidates compile under Triton's defaults here (no mask bit packing to avoid)")
    seq, device = 1100, torch.device("cuda")
    q, k, v = (torch.randn(2, 4, seq, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    mask = MASKS["sliding|prefix"](seq, device)
    for config in changed[:3]:
        defaults = dataclasses.replace(config, pipeline=None, pipeline_label="")
        first, again = (fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=c) for c in (config, defaults))
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1]), config.label()


@pytest.mark.parametrize("block_n, stages, programs", [(64, 2, 3), (64, 3, 3), (128, 2, 2), (64, 2, 2)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_one_consumer_warpgroup_programs_sharing_an_sm(head_dim, block_n, stages, programs):
    """64-row programs of one consumer warpgroup, 2 or 3 to an SM (their register budget), every mask kind
    of the shared table's combination, a ragged length; repeatable bit for bit."""
    if head_dim == 128 and programs == 3:
        pytest.skip("80 registers per thread are too few for D=128 (ptxas refuses)")
    config = fwd_configs.gluon_config(64, block_n, stages, programs_per_sm=programs)
    seq, device = 1100, torch.device("cuda")
    q, k, v = (torch.randn(2, 3, seq, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    check_forward(q, k, v, config, MASKS["sliding|prefix"](seq, device))
    check_forward(q, k, v, config, K.causal())
    first, again = (fwd_forward.attention_forward(q, k, v, mask_mod=K.causal(), config=config) for _ in range(2))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["causal+softcap", "alibi", "sliding+gqa", "document+block_mask"])
def test_one_consumer_candidate_with_modifiers(case, dtype):
    """The D=64 tuner candidate BM64-BN64-s2-x3 with score modifiers, GQA, a user block mask of its tiles
    and fp16, on a ragged length."""
    device, seq = torch.device("cuda"), 777
    config = fwd_configs.gluon_config(64, 64, 2, programs_per_sm=3)
    assert config in fwd_configs.GLUON_CONFIGS[64]
    doc_ids = torch.randint(0, 3, (seq,), device=device).sort().values
    mask, score, gqa = {"causal+softcap": (K.causal(), K.softcap(20.0), False),
                        "alibi": (None, K.alibi(K.alibi_slopes(8).to(device)), False),
                        "sliding+gqa": (K.sliding_window(200), None, True),
                        "document+block_mask": (K.and_masks(K.causal(), K.document(doc_ids)), None, False)}[case]
    q = torch.randn(2, 8, seq, 64, device=device, dtype=dtype)
    k, v = (torch.randn(2, 2 if gqa else 8, seq, 64, device=device, dtype=dtype) for _ in range(2))
    block_mask = K.build_block_mask(mask, 2, 8, seq, seq, block_m=64, block_n=64, device=device) \
        if case == "document+block_mask" else None
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask, score_mod=score, block_mask=block_mask,
                                             enable_gqa=gqa, config=config)
    ref, ref_lse = K.reference.attention(q, k, v, mask_mod=mask, score_mod=score, enable_gqa=gqa, return_lse=True)
    assert rel_err(out, ref) <= 1e-2
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("head_swizzle", [4, 7, 16])
@pytest.mark.parametrize("block_m", [128, 192])
def test_head_swizzle_gives_the_head_after_head_bits(block_m, head_swizzle):
    """The program order of groups of heads (30 batch-heads: the last group holds 2 heads of 4, 2 of 7, 14 of
    16) only reorders programs: each output and log-sum-exp bit is the plain order's, so no program is
    skipped or run twice (the outputs start as NaN), with a ragged causal length and GQA."""
    device = torch.device("cuda")
    q = torch.randn(3, 10, 1000, 64, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(3, 5, 1000, 64, device=device, dtype=torch.bfloat16) for _ in range(2))
    plain = fwd_configs.gluon_config(block_m, 128, 2)
    swizzled = fwd_configs.gluon_config(block_m, 128, 2, head_swizzle=head_swizzle)
    check_forward(q, k, v, swizzled, K.causal(), enable_gqa=True)
    with unittest.mock.patch.object(torch, "empty_like", lambda t, **kw: torch.full_like(t, float("nan"), **kw)):
        first, again = (fwd_forward.attention_forward(q, k, v, mask_mod=K.causal(), enable_gqa=True, config=c)
                        for c in (plain, swizzled))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.parametrize("score", ["alibi", "softcap"])
def test_score_mods(score):
    device = torch.device("cuda")
    q, k, v = (torch.randn(2, 8, 900, 128, device=device, dtype=torch.float16) for _ in range(3))
    mod = K.alibi(K.alibi_slopes(8).to(device)) if score == "alibi" else K.softcap(20.0)
    check_forward(q, k, v, gluon_config(), K.causal(), mod)


def test_transposed_inputs_and_single_tile():
    """Inputs as Hugging Face passes them ([B, S, H, D] transposed) and a sequence shorter than a tile."""
    device = torch.device("cuda")
    q, k, v = (torch.randn(2, 300, 4, 128, device=device, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    check_forward(q, k, v, gluon_config(), K.causal())
    q, k, v = (torch.randn(1, 2, 37, 64, device=device, dtype=torch.bfloat16) for _ in range(3))
    check_forward(q, k, v, gluon_config(), K.causal())


@pytest.mark.parametrize("pingpong", [False, True])
def test_repeatable(pingpong):
    """Runs give the same bits (no race between the warpgroups and the producer)."""
    device = torch.device("cuda")
    q, k, v = (torch.randn(4, 16, 2048, 128, device=device, dtype=torch.bfloat16) for _ in range(3))
    config = gluon_config(pingpong=pingpong)
    first, first_lse = fwd_forward.attention_forward(q, k, v, mask_mod=K.causal(), config=config)
    for _ in range(3):
        again, again_lse = fwd_forward.attention_forward(q, k, v, mask_mod=K.causal(), config=config)
        assert torch.equal(first, again) and torch.equal(first_lse, again_lse)
    assert rel_err(first, K.reference.attention(q, k, v, mask_mod=K.causal())) <= 1e-2


@pytest.fixture
def gluon_selected(monkeypatch):
    """The forward tuner offers only the Gluon candidates wherever they apply (the Triton-language ones
    elsewhere), with no earlier decision or resolved call kept."""
    from tritonpatch.kernels.fwd import tuner as fwd_tuner

    def forget():
        fwd_tuner.forget_tuned()
        fwd_forward.resolved_calls.clear()

    yield from gluon_candidates_only(monkeypatch, fwd_tuner, "tuning_candidates", forget)


def test_random_calls_with_gluon_selected(gluon_selected):
    """The randomized calls of tests/cpu/test_attention_random.py (fresh tensors, modifiers at reused
    addresses, written in place, every mask and score modifier, GQA, ragged, backward on half) with the
    Gluon forward wherever it applies: 150 calls against the fp32 reference."""
    for call in RandomCalls(random_seed(), "cuda", GPU_SHAPES, [torch.bfloat16, torch.float16], families=12,
                            count=150):
        check_random_call(call, GPU_LIMITS)
        del call
