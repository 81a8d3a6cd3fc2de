"""GPU: replayed launches (TRITONPATCH_FAST_LAUNCH, the default) give bitwise the results of full
launches (TRITONPATCH_FAST_LAUNCH=0), call after call with fresh inputs, forward and backward, for the
pointer, TMA and warp-specialized kernels and (tuned, where the tuner picks them) the Gluon kernels; a
document mask whose ids change in place and an input with another alignment are not served by a stale plan.
Run on the device machine: ``pytest -m gpu tests/gpu/test_launch_replay_gpu.py``."""
from __future__ import annotations

import pytest
import torch

import tritonpatch.kernels as K
from tritonpatch.kernels._runtime.launch import LaunchPlans
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from tritonpatch.kernels.fwd import tuner as fwd_tuner
from attention_cases import MASKS, doc_ids, rel_err

pytestmark = pytest.mark.gpu
SEQ = 1024


@pytest.fixture
def count_replays(monkeypatch):
    """How many launches were replayed (the plans of every launcher: Triton-language and Gluon, forward
    and backward)."""
    counter = {"replays": 0}
    original = LaunchPlans.replay

    def replay(plans, key, tensors):
        done = original(plans, key, tensors)
        counter["replays"] += done
        return done

    monkeypatch.setattr(LaunchPlans, "replay", replay)
    return counter


def fresh_inputs(seed, head_dim, seq=SEQ, heads=4):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(2, heads, seq, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
            for _ in range(4)]


def fwd_bwd(q, k, v, dout, dq_mode, **kwargs):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = K.attention(*leaves, return_lse=True, dq_mode=dq_mode, **kwargs)
    out.backward(dout)
    return [out, lse] + [t.grad for t in leaves]


@pytest.mark.parametrize("config", ["tuned", "pointers", "warp-specialized", "split"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", ["causal", "document", "sliding|prefix"])
def test_replays_equal_full_launches(name, head_dim, config, count_replays, monkeypatch):
    mask = MASKS[name](SEQ, "cuda")
    if config == "warp-specialized":
        if head_dim != 128 or name != "causal":
            pytest.skip("the warp-specialized kernel runs shift-invariant masks at D=128")
        fwd_config = fwd_configs.WARP_SPECIALIZED_CONFIG
    elif config == "split":
        if head_dim != 128:
            pytest.skip("the split runs at D=128")
        fwd_config = fwd_configs.SPLIT_CONFIG
    else:
        fwd_config = None if config == "tuned" else fwd_configs.FwdConfig(128, 64, 8 if head_dim == 128 else 4, 2)
    if fwd_config is not None and fwd_config.warp_specialize:
        q, k, v, _ = fresh_inputs(0, head_dim)
        problem = fwd_configs.warp_specialize_problem(q, k, v, mask, None, None, split=fwd_config.split)
        if problem:                                  # e.g. another Triton than 3.6: the kernel refuses
            pytest.skip(f"the warp-specialized kernel {problem}")
    for seed in range(3):
        q, k, v, dout = fresh_inputs(seed, head_dim)
        monkeypatch.delenv("TRITONPATCH_FAST_LAUNCH", raising=False)
        count_replays["replays"] = 0   # (the tuner replays its candidates' launches too)
        fast = fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=fwd_config)
        used = fwd_config or fwd_tuner.tuned_configs()[fwd_tuner.tuning_key(q, k, v, mask, None, None)]
        if seed:                                                           # the first call records
            assert count_replays["replays"] == (2 if used.split else 1)
        monkeypatch.setenv("TRITONPATCH_FAST_LAUNCH", "0")
        full = fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=fwd_config)
        assert all(torch.equal(a, b) for a, b in zip(fast, full))
    if config != "tuned":
        return
    for dq_mode in ("separate", "atomic"):
        for seed in range(3):
            q, k, v, dout = fresh_inputs(seed, head_dim)
            monkeypatch.delenv("TRITONPATCH_FAST_LAUNCH", raising=False)
            fast = fwd_bwd(q, k, v, dout, dq_mode, mask_mod=mask)
            monkeypatch.setenv("TRITONPATCH_FAST_LAUNCH", "0")
            full = fwd_bwd(q, k, v, dout, dq_mode, mask_mod=mask)
            exact = fast if dq_mode == "separate" else fast[:2] + fast[3:]   # atomic dQ: order of fp32 adds
            assert all(torch.equal(a, b) for a, b in zip(exact, full if dq_mode == "separate"
                                                          else full[:2] + full[3:]))
            assert rel_err(fast[2], full[2]) < 1e-3
    assert count_replays["replays"] > 0


def test_changed_document_ids_and_alignment_are_not_replayed_stale():
    ids = doc_ids(SEQ, "cuda")
    mask = K.and_masks(K.causal(), K.document(ids))     # int32 contiguous ids: the mask holds this tensor
    q, k, v, _ = fresh_inputs(0, 64)
    first = fwd_forward.attention_forward(q, k, v, mask_mod=mask)[0]
    fwd_forward.attention_forward(q, k, v, mask_mod=mask)                        # now replayed
    ids.copy_(ids.roll(300))                                           # the same mask object, new documents
    again = fwd_forward.attention_forward(q, k, v, mask_mod=mask)[0]
    assert not torch.equal(first, again)
    assert rel_err(again, K.reference.attention(q.float(), k.float(), v.float(), mask_mod=mask)) < 1e-2
    ids.copy_(ids.roll(-300))
    shifted = torch.empty(q.numel() + 8, device="cuda", dtype=q.dtype)[8:].view(q.shape)   # 16-byte aligned
    odd = torch.empty(q.numel() + 1, device="cuda", dtype=q.dtype)[1:].view(q.shape)       # 2-byte aligned
    shifted.copy_(q)
    odd.copy_(q)
    assert torch.equal(fwd_forward.attention_forward(shifted, k, v, mask_mod=mask)[0], first)   # replayed, new address
    assert rel_err(fwd_forward.attention_forward(odd, k, v, mask_mod=mask)[0], first) < 1e-2    # tuned anew: no TMA
