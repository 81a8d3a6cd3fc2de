"""The warp-specialized forward's preconditions on the CPU: which masks are shift-invariant (checked
by brute force), when the kernel is refused, and that it compiles for sm_90 into a producer and two
consumer warpgroups."""
from __future__ import annotations

import pytest
import torch
import triton

import tritonpatch.kernels as K
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import kernels as fwd_kernels
from tritonpatch.kernels.fwd import launch as fwd_launch
from tritonpatch.targets import compile_for_target

IDS = torch.tensor([0] * 40 + [1] * 60, dtype=torch.int32)
MASKS = {
    "none": K.allow_all(), "causal": K.causal(), "sliding_window": K.sliding_window(7),
    "causal&sliding": K.and_masks(K.causal(), K.sliding_window(3)), "prefix_lm": K.prefix_lm(10),
    "document": K.document(IDS), "causal|prefix": K.or_masks(K.causal(), K.prefix_lm(5)),
}


@pytest.mark.parametrize("name", list(MASKS))
def test_shift_invariance_flag_matches_brute_force(name):
    """A mask flagged shift-invariant gives the same answer with both indices shifted (what the
    warp-specialized kernel relies on); the others are seen to differ somewhere."""
    mask = MASKS[name]
    q = torch.arange(100)[:, None]
    kv = torch.arange(100)[None, :]
    b, h = torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    shifted_equal = all(torch.equal(mask(b, h, q[s:], kv[:, s:]), mask(b, h, q[s:] - s, kv[:, s:] - s))
                        for s in (1, 13, 50))
    assert mask.shift_invariant == shifted_equal


def test_warp_specialization_needs_a_hopper_gpu_and_a_shift_invariant_mask():
    q = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    assert "Hopper" in fwd_configs.warp_specialize_problem(q, q, q, K.causal(), None, None)
    with pytest.raises(ValueError, match="num_warps=4"):
        fwd_configs.FwdConfig(128, 128, 8, 2, True, warp_specialize=True)
    assert fwd_configs.WARP_SPECIALIZED_CONFIG.label() == "BM128-BN128-w4-s2-tma-ws"
    with pytest.raises(ValueError, match="warp_specialize=True"):
        fwd_configs.FwdConfig(128, 128, 4, 2, True, split=True)
    assert fwd_configs.SPLIT_CONFIG.label() == "BM128-BN128-w4-s2-tma-ws-split"


@pytest.mark.skipif(not triton.__version__.startswith("3.6."), reason="verified with Triton 3.6 only")
@pytest.mark.parametrize("name", ["none", "causal", "causal&sliding"])
def test_warp_specialized_variant_compiles_into_three_warpgroups(name):
    config, mask = fwd_configs.WARP_SPECIALIZED_CONFIG, MASKS[name]
    compiled = compile_for_target(fwd_kernels._attn_fwd_kernel, fwd_launch.kernel_signature(torch.bfloat16, 128, config, mask, None),
                                  fwd_launch.kernel_constexprs(128, config, mask, None), target="sm_90",
                                  num_warps=config.num_warps, num_stages=config.num_stages)
    assert compiled.asm["ttgir"].count("ttg.warp_specialize(") == 1
    assert compiled.metadata.num_warps == 12                      # 4 (producer) + 2 x 4 (consumers)
    assert "wgmma.mma_async" in compiled.asm["ptx"] and ".local" not in compiled.asm["ptx"]


@pytest.mark.skipif(not triton.__version__.startswith("3.6."), reason="verified with Triton 3.6 only")
@pytest.mark.parametrize("name", ["prefix_lm", "document"])
def test_split_passes_compile_for_any_mask(name):
    """The split's full-tile pass is the warp-specialized kernel without mask work (so any mask),
    its partial-tile pass the two-loop kernel resuming through TMA loads of Out."""
    mask = MASKS[name]
    full_pass = fwd_configs.WARP_SPECIALIZED_CONFIG
    first = compile_for_target(fwd_kernels._attn_fwd_kernel, fwd_launch.kernel_signature(torch.bfloat16, 128, full_pass, mask, None),
                               fwd_launch.kernel_constexprs(128, full_pass, mask, None, fwd_kernels.FULL_TILES), target="sm_90",
                               num_warps=4, num_stages=2)
    assert first.asm["ttgir"].count("ttg.warp_specialize(") == 1 and first.metadata.num_warps == 12
    second_config = fwd_configs.SPLIT_PARTIAL_CONFIG
    second = compile_for_target(fwd_kernels._attn_fwd_kernel,
                                fwd_launch.kernel_signature(torch.bfloat16, 128, second_config, mask, None),
                                fwd_launch.kernel_constexprs(128, second_config, mask, None, fwd_kernels.PARTIAL_TILES),
                                target="sm_90", num_warps=second_config.num_warps,
                                num_stages=second_config.num_stages)
    assert "warp_specialize" not in second.asm["ttgir"] and ".local" not in second.asm["ptx"]
