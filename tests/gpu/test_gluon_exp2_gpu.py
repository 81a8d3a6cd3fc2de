"""GPU checks of the softmax exponentials shared between MUFU.EX2 and a polynomial
(``kernels/fwd/gluon_exp2.py``): elementwise against float64 ``exp2`` on the values a softmax produces
(-inf, NaN, subnormal results, the row maximum's 0), and the Gluon forward with the polynomial against the
fp32 reference on every mask, rows without keys and a score modifier."""
from __future__ import annotations

import pytest
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import tritonpatch.kernels as K
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from tritonpatch.kernels.fwd.gluon_exp2 import exp2_shared
from attention_cases import MASKS, rel_err

pytestmark = pytest.mark.gpu

BLOCK = 1024


@gluon.jit
def _exp2_both(X, SHARED, PLAIN, POLY_OF_4: gl.constexpr, BLOCK: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    x = gl.load(X + offs)
    gl.store(SHARED + offs, exp2_shared(x, POLY_OF_4))
    gl.store(PLAIN + offs, gl.exp2(x))


def softmax_arguments(device):
    """Arguments as the softmax makes them: mostly in [-30, 0], some down to -130 (subnormal and zero
    results), and the special values at fixed places."""
    gen = torch.Generator().manual_seed(7)
    x = -torch.rand(64 * BLOCK, generator=gen) * 30
    x[::5] = -torch.rand(x[::5].shape, generator=gen) * 130
    special = torch.tensor([float("-inf"), float("nan"), 0.0, -0.0, -1e-30, -126.0, -126.5, -126.75, -127.0,
                            -127.25, -149.0, -1000.0, 1e-7, 0.25, 0.5, -0.5])
    for position in range(4):   # each special value in each of the 4 places of a pack
        start = position * 4 * special.numel() + position
        x[start:start + 4 * special.numel():4] = special
    return x.to(device)


@pytest.mark.parametrize("poly_of_4", [1, 2])
def test_shared_exp2_elementwise(poly_of_4):
    device = torch.device("cuda")
    x = softmax_arguments(device)
    shared, plain = torch.empty_like(x), torch.empty_like(x)
    _exp2_both[(x.numel() // BLOCK,)](x, shared, plain, poly_of_4, BLOCK, num_warps=4)
    exact = torch.exp2(x.double())
    by_mufu = (torch.arange(x.numel(), device=device) % 4) < 4 - poly_of_4
    # the elements left to MUFU.EX2 are gl.exp2's bits (NaN where it is NaN)
    assert torch.equal(shared[by_mufu].nan_to_num(7.0), plain[by_mufu].nan_to_num(7.0))
    poly, poly_exact = shared[~by_mufu].double(), exact[~by_mufu]
    assert (poly[poly_exact.isnan()].isnan()).all() and not poly[~poly_exact.isnan()].isnan().any()
    assert (poly[poly_exact == 0] == 0).all()                 # -inf (and the far tail) give exactly 0
    normal = poly_exact >= 2.0 ** -126
    assert ((poly[normal] / poly_exact[normal] - 1).abs().max() <= 8e-5)
    assert ((poly[~normal] - poly_exact[~normal]).abs().nan_to_num(0.0).max() <= 2.0 ** -126)
    assert (poly[~poly.isnan()] >= 0).all()


def exp2_config(block_m, poly_of_4):
    return fwd_configs.gluon_config(block_m, 128, 2, exp2_poly_of_4=poly_of_4)


def check_forward(q, k, v, config, mask=None, score=None):
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask, score_mod=score, config=config)
    ref, ref_lse = K.reference.attention(q, k, v, mask_mod=mask, score_mod=score, return_lse=True)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) <= 1e-2
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-3)
    return out, lse


@pytest.mark.parametrize("poly_of_4", [1, 2])
@pytest.mark.parametrize("head_dim, block_m", [(64, 128), (64, 192), (128, 128)])
@pytest.mark.parametrize("name", list(MASKS))
def test_forward_with_polynomial_exp2_matches_reference(name, head_dim, block_m, poly_of_4):
    seq, device = 1100, torch.device("cuda")
    q, k, v = (torch.randn(2, 4, seq, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    check_forward(q, k, v, exp2_config(block_m, poly_of_4), MASKS[name](seq, device))


@pytest.mark.parametrize("poly_of_4", [1, 2])
def test_rows_without_keys_stay_zero(poly_of_4):
    """Causal & key padding of the first 300 keys: rows without a key give output 0 and log-sum-exp -inf
    (their exponentials are all of -inf, which the polynomial maps to exactly 0)."""
    device = torch.device("cuda")
    q, k, v = (torch.randn(2, 4, 1024, 64, device=device, dtype=torch.bfloat16) for _ in range(3))
    mask = K.and_masks(K.causal(), K.key_padding(torch.arange(1024, device=device) >= 300))
    out, lse = check_forward(q, k, v, exp2_config(128, poly_of_4), mask)
    assert (out[:, :, :300] == 0).all() and (lse[:, :, :300] == float("-inf")).all()


def test_score_modifier_with_polynomial_exp2():
    device = torch.device("cuda")
    q, k, v = (torch.randn(2, 8, 900, 64, device=device, dtype=torch.float16) for _ in range(3))
    check_forward(q, k, v, exp2_config(128, 1), K.causal(), K.softcap(20.0))
