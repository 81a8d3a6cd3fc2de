"""Compile-only (sm_90a, no GPU) checks of the Gluon dK/dV kernel (the backward's Hopper kernel), on every
supported Triton: the properties its speed depends on (spills within measured budgets, no wgmma serialized
by ptxas, the ``setmaxnreg`` budgets, TMA loads and the dQ writer's TMA reduce-add), its config checks,
what it refuses, and the backward tuner offering it where it applies."""
from __future__ import annotations

import collections
import re

import pytest
import torch

import tritonpatch.kernels as K
from tritonpatch.inspection import disassemble, measure_resources
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels._runtime.launch import pipeline_scope
from tritonpatch.kernels.bwd import gluon_launch
from tritonpatch.targets import compile_for_target
from attention_cases import MASK_BIT_PACKING, spill_allowance

MODIFIERS = {"none": (K.allow_all(), None), "causal": (K.causal(), None), "causal+softcap": (K.causal(), K.softcap(30.0)),
             "document": (K.and_masks(K.causal(), K.document(torch.zeros(64, dtype=torch.int32))), None)}
CASES = [(d, m, add_dq) for d in (64, 128) for m in MODIFIERS for add_dq in (True, False)
         if add_dq or m == "causal"]

# Measured (bytes of spill stores and loads, Triton 3.6): at D=128 dK, dV (128 registers), S^T, dP^T and the
# dQ tile leave the loop-invariant wgmma descriptors and the mask's indices to local memory; softcap's
# tanh and its gradient add more. The tuner times the kernel against the Triton-language ones.
SPILL_BUDGET = {(128, "none", True): (264, 396), (128, "causal", True): (316, 476),
                (128, "causal+softcap", True): (944, 1112), (128, "document", True): (496, 656),
                (128, "causal", False): (64, 64), (64, "causal+softcap", True): (28, 60),
                (64, "document", True): (8, 40)}


def compile_dkdv(head_dim, modifiers, add_dq, dtype=torch.bfloat16, config=None):
    """The dK/dV kernel compiled for sm_90a: GLUON_CONFIGS[0] under Triton's defaults, or ``config`` through its
    Pipeline."""
    mask, score = MODIFIERS[modifiers]
    config = config or bwd_configs.GLUON_CONFIGS[0]
    fn, signature, constexprs, _ = gluon_launch.compile_spec(dtype, head_dim, config, mask, score, add_dq=add_dq,
                                                             mask_tile=(128, 128))
    with pipeline_scope(config.pipeline):
        return compile_for_target(fn, signature, constexprs, target="sm_90", **config.compile_options())


def test_no_slp_candidate_does_not_pack_masks_into_bit_vectors():
    """As the forward's candidates (tests/cpu/test_kernels_gluon.py): LLVM's SLP vectorizer packs the partial
    steps' mask into bit vectors under Triton's defaults (on every supported Triton, as
    ``slp_vectorizer_packs_masks`` says), and the ``+no-slp`` candidate compiles without it."""
    from tritonpatch import llvm
    from tritonpatch.kernels._runtime.triton_compat import slp_vectorizer_packs_masks

    packed = MASK_BIT_PACKING.findall(compile_dkdv(128, "causal", True).asm["ptx"])
    assert bool(packed) == slp_vectorizer_packs_masks("backward"), len(packed)
    if not llvm.available():
        pytest.skip("tritonpatch._native is not usable here (no Pipeline candidates)")
    unpacked = bwd_configs.gluon_candidates()[-1]
    assert unpacked.label() == "BM64-BN128-w4-s2-gluon+disable-lsr+no-slp"
    assert not MASK_BIT_PACKING.findall(compile_dkdv(128, "causal", True, config=unpacked).asm["ptx"])


@pytest.mark.parametrize("head_dim, modifiers, add_dq", CASES,
                         ids=[f"D{d}-{m}-{'dq' if a else 'nodq'}" for d, m, a in CASES])
def test_compiles_within_spill_budget_without_serialized_wgmma(head_dim, modifiers, add_dq):
    compiled = compile_dkdv(head_dim, modifiers, add_dq)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    # the dQ writer's bulk reduce-add, only where dQ is computed
    assert ("cp.reduce.async.bulk.tensor" in ptx) == add_dq
    assert ("UTMAREDG" in disassemble(compiled.asm["cubin"])) == add_dq
    resources = measure_resources(compiled.asm["cubin"], ptx, 90, (), compiled.metadata.shared)
    stores, loads = SPILL_BUDGET.get((head_dim, modifiers, add_dq), (0, 0))
    assert resources.spill_stores <= spill_allowance(stores), resources
    assert resources.spill_loads <= spill_allowance(loads), resources
    assert not [w for w in resources.warnings if re.search(r"C751\d", w)], resources.warnings
    assert resources.static_shared + resources.dynamic_shared <= 227 * 1024, resources
    # the consumer warpgroups raise their registers to 240, the loader's and writer's warpgroup drops to 32
    budgets = {int(n) for n in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)}
    assert {bwd_configs.GLUON_CONSUMER_REGISTERS, bwd_configs.GLUON_WORKER_REGISTERS} <= budgets, budgets


def test_fp16_compiles():
    ptx = compile_dkdv(128, "causal", True, torch.float16).asm["ptx"]
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in ptx


def test_config_checks():
    config = bwd_configs.gluon_config()
    assert config.label() == "BM64-BN128-w4-s2-gluon"
    assert config.compile_options() == {"num_warps": 4, "maxnreg": 168}
    assert (bwd_configs.GLUON_CONSUMER_REGISTERS, bwd_configs.GLUON_WORKER_REGISTERS) == (240, 32)
    for bad in (dict(block_m=128), dict(block_n=64), dict(use_tma=False), dict(num_warps=8)):
        fields = {**dict(block_m=64, block_n=128, num_warps=4, num_stages=2, use_tma=True, gluon=True), **bad}
        with pytest.raises(ValueError, match="a Gluon config has"):
            bwd_configs.KernelConfig(**fields)


def test_gluon_problem_names_what_the_kernel_cannot_run():
    q = torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16)
    strided = torch.zeros(1, 2, 64, 132, dtype=torch.bfloat16)[..., :128]   # rows of 264 bytes
    assert "float16 or bfloat16" in gluon_launch.gluon_problem(*[q.float()] * 4, K.causal(), None)
    assert "dout" in gluon_launch.gluon_problem(q, q, q, strided, K.causal(), None)
    assert "Hopper" in gluon_launch.gluon_problem(q, q, q, q, K.causal(), None)


def test_disable_lsr_candidate_compiles_through_its_pipeline_and_spills_less(monkeypatch, fresh_compiles):
    """The tuner's disable-lsr Gluon candidate, compiled as the launcher does (the JIT, no GPU): a kernel of its
    own in the JIT's cache (the Pipeline is in the key), different code, and at D=128 fewer spills than the
    plain candidate (Triton 3.6: 204 against 316 bytes of spill stores); the third candidate is it with ``+no-slp``."""
    from triton.runtime.driver import driver

    from tritonpatch import llvm
    from tritonpatch.kernels._call import BlockMasks
    from tritonpatch.kernels.bwd import launch as bwd_launch
    from tritonpatch.kernels.bwd.dq_adds import ATOMIC_ADD
    from tritonpatch.kernels.bwd.gluon_kernel import _attn_bwd_dkdv_gluon_kernel
    from tritonpatch.targets import CompileOnlyDriver

    if not llvm.available():
        pytest.skip("tritonpatch._native is not usable here (no disable-lsr candidate)")
    monkeypatch.setattr(driver, "_active", CompileOnlyDriver())
    monkeypatch.setattr(_attn_bwd_dkdv_gluon_kernel, "device_caches",
                        collections.defaultdict(_attn_bwd_dkdv_gluon_kernel.create_binder))
    q = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 256)
    buf = bwd_launch.Buffers(q, q, q, q, q, lse, None, K.causal(), None, 0.1, BlockMasks(None, K.causal(), q, q))
    plain, variant, unpacked = bwd_configs.gluon_candidates()
    assert plain == bwd_configs.GLUON_CONFIGS[0]
    assert (variant.pipeline_label, unpacked.pipeline_label) == ("disable-lsr", "disable-lsr+no-slp")
    for config in (plain, variant):
        buf.dkdv(config, torch.zeros(q.shape), ATOMIC_ADD, warmup=True)
    kernels = list(_attn_bwd_dkdv_gluon_kernel.device_caches[0][0].values())
    assert len(kernels) == 2 and kernels[0].asm["ptx"] != kernels[1].asm["ptx"]
    spills = [measure_resources(c.asm["cubin"], c.asm["ptx"], 90, (), c.metadata.shared).spill_stores for c in kernels]
    assert spills[1] < spills[0], spills


def test_explicit_gluon_config_on_a_call_it_cannot_run_is_an_error():
    q = torch.randn(1, 2, 64, 32)
    lse = torch.zeros(1, 2, 64)
    config = bwd_configs.BwdConfig("separate", bwd_configs.gluon_config(), bwd_configs.INTERPRETER_DQ)
    with pytest.raises(ValueError, match="the Gluon dK/dV kernel needs float16 or bfloat16"):
        K.attention_backward(q, q, q, q, lse, q, config=config)


def test_tuner_offers_the_gluon_candidates_where_they_apply(monkeypatch):
    """The Gluon candidates (plain and disable-lsr) join the dK/dV candidates where the call allows them (the
    device check stubbed: no GPU here), never the dQ ones, and they fit block masks of whole 64 x 128
    multiples only."""
    from tritonpatch.kernels._call import BlockMasks
    from tritonpatch.kernels.bwd import launch as bwd_launch
    from tritonpatch.kernels.bwd import tuner as bwd_tuner

    q = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 256)
    buf = bwd_launch.Buffers(q, q, q, q, q, lse, None, K.causal(), None, 0.1, BlockMasks(None, K.causal(), q, q))
    assert "Hopper" in buf.gluon_problem
    assert not [c for c in bwd_tuner.candidates(buf, None, "dkdv") if c.gluon]
    buf.gluon_problem = None   # as on Hopper
    assert [c for c in bwd_tuner.candidates(buf, None, "dkdv") if c.gluon] == bwd_configs.gluon_candidates()
    assert not [c for c in bwd_tuner.candidates(buf, None, "dq") if c.gluon]
    fits = K.build_block_mask(K.causal(), 1, 2, 256, 256, block_m=128, block_n=128, device="cpu")
    narrow = K.build_block_mask(K.causal(), 1, 2, 256, 256, block_m=128, block_n=64, device="cpu")
    assert [c for c in bwd_tuner.candidates(buf, fits, "dkdv") if c.gluon] == bwd_configs.gluon_candidates()
    assert not [c for c in bwd_tuner.candidates(buf, narrow, "dkdv") if c.gluon]
