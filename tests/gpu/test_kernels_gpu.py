"""GPU numerics of the attention forward vs the fp32 reference (bf16, relative error <= 1e-2).
Run on the device machine: ``pytest -m gpu tests/gpu/test_kernels_gpu.py``."""
from __future__ import annotations

import pytest
import torch
import triton

import tritonpatch.kernels as K
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from attention_cases import MASKS, forward_candidates, rel_err
from index_probe import IndexProbe

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("use_tma", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", list(MASKS))
def test_masks_match_reference(name, head_dim, use_tma):
    seq, device = 1100, torch.device("cuda")
    q, k, v = (torch.randn(2, 4, seq, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    mask = MASKS[name](seq, device)
    config = fwd_configs.FwdConfig(128, 64, 8 if head_dim == 128 else 4, 3, use_tma)
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=config)
    ref, ref_lse = K.reference.attention(q, k, v, mask_mod=mask, return_lse=True)
    assert rel_err(out, ref) <= 1e-2
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("use_tma", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_score_mod_never_sees_a_position_past_the_ends(head_dim, use_tma):
    """A score_mod reading a per-key table would read past its end otherwise (1100 queries, 1037 keys)."""
    device, probe = torch.device("cuda"), IndexProbe("cuda")
    q = torch.randn(2, 4, 1100, head_dim, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 4, 1037, head_dim, device=device, dtype=torch.bfloat16) for _ in range(2))
    config = fwd_configs.FwdConfig(128, 64, 8 if head_dim == 128 else 4, 3, use_tma)
    out = fwd_forward.attention_forward(q, k, v, mask_mod=K.causal(), score_mod=probe.score_mod, config=config)[0]
    assert rel_err(out, K.reference.attention(q, k, v, mask_mod=K.causal())) <= 1e-2
    assert probe.seen()["score"] == (1099, 1036)


CANDIDATES, CANDIDATE_IDS = forward_candidates()


@pytest.mark.parametrize("head_dim, config", CANDIDATES, ids=CANDIDATE_IDS)
def test_every_tuner_candidate_matches_reference(head_dim, config):
    """Each config the tuner may pick, on a mask with full and partial tiles and a ragged end."""
    if config.use_tma and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs Hopper")
    seq, device = 1100, torch.device("cuda")
    q, k, v = (torch.randn(2, 4, seq, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    mask = MASKS["sliding|prefix"](seq, device)
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=config)
    ref, ref_lse = K.reference.attention(q, k, v, mask_mod=mask, return_lse=True)
    assert rel_err(out, ref) <= 1e-2
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("score", ["alibi", "softcap"])
def test_score_mods_and_gqa_tuned(score):
    device = torch.device("cuda")
    q = torch.randn(2, 8, 700, 128, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 900, 128, device=device, dtype=torch.bfloat16) for _ in range(2))
    mod = K.alibi(K.alibi_slopes(8).to(device)) if score == "alibi" else K.softcap(20.0)
    out = K.attention(q, k, v, mask_mod=K.causal(), score_mod=mod, enable_gqa=True)
    ref = K.reference.attention(q, k, v, mask_mod=K.causal(), score_mod=mod, enable_gqa=True)
    assert rel_err(out, ref) <= 1e-2


def test_torch_compile_graph():
    device = torch.device("cuda")
    q, k, v = (torch.randn(1, 4, 512, 64, device=device, dtype=torch.float16) for _ in range(3))
    mask = K.sliding_window(100)
    compiled = torch.compile(lambda a, b, c: K.attention(a, b, c, mask_mod=mask).sum(-1), fullgraph=True)
    assert rel_err(compiled(q, k, v), K.reference.attention(q, k, v, mask_mod=mask).float().sum(-1)) <= 1e-2


@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("variant", ["warp-specialized", "split"])
def test_warp_specialized_variants_match_reference(variant, name, groups):
    """The warp-specialized D=128 kernel (Triton 3.6, Hopper; shift-invariant masks) and its split form
    (full tiles warp-specialized, then the partial tiles resuming from its output; any mask) against the
    fp32 reference and the two-loop kernel; GQA included. Skips where a variant does not apply (its
    eligibility is the test's)."""
    device = torch.device("cuda")
    seq = 1024
    q = torch.randn(2, 8, seq, 128, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 8 // groups, seq, 128, device=device, dtype=torch.bfloat16) for _ in range(2))
    mask = MASKS[name](seq, device) or K.allow_all()
    config = fwd_configs.SPLIT_CONFIG if variant == "split" else fwd_configs.WARP_SPECIALIZED_CONFIG
    problem = fwd_configs.warp_specialize_problem(q, k, v, mask, None, None, split=config.split)
    if problem:
        pytest.skip(problem)
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask, enable_gqa=groups > 1, config=config)
    ref, ref_lse = K.reference.attention(q, k, v, mask_mod=mask, enable_gqa=groups > 1, return_lse=True)
    assert rel_err(out, ref) <= 1e-2
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-3)
    two_loops, _ = fwd_forward.attention_forward(q, k, v, mask_mod=mask, enable_gqa=groups > 1,
                                       config=fwd_configs.SPLIT_PARTIAL_CONFIG)
    assert rel_err(out, two_loops) <= 1e-2


def test_warp_specialized_config_is_refused_where_it_would_be_wrong():
    """A prefix-LM mask is not shift-invariant: refused with that reason on Triton 3.6; on any other
    Triton the kernel is refused first for the version it was verified with."""
    device = torch.device("cuda")
    q, k, v = (torch.randn(1, 2, 1024, 128, device=device, dtype=torch.bfloat16) for _ in range(3))
    reason = "shift-invariant" if triton.__version__.startswith("3.6.") else "verified with Triton 3.6 only"
    with pytest.raises(ValueError, match=reason):
        fwd_forward.attention_forward(q, k, v, mask_mod=K.prefix_lm(100), config=fwd_configs.WARP_SPECIALIZED_CONFIG)

