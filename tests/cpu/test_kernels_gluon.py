"""Compile-only (sm_90a, no GPU) checks of the Gluon forward: every candidate the tuner may pick, on
every supported Triton, has the properties its speed depends on — no spills, no wgmma serialized by
ptxas (warnings C7510-C7517), the register budgets ``setmaxnreg`` gives each partition, TMA loads, and
two wgmma groups in flight in each consumer loop (``S_j`` with ``P_{j-1} V_{j-1}``)."""
from __future__ import annotations

import re

import pytest
import torch

import tritonpatch.kernels as K
from tritonpatch.inspection import disassemble, measure_resources, wgmma_overlap
from tritonpatch.kernels._runtime.launch import pipeline_scope
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import launch as fwd_launch
from tritonpatch.kernels.fwd.gluon_launch import gluon_problem
from tritonpatch.kernels.fwd.gluon_launch import kernel_constexprs as gluon_constexprs
from tritonpatch.targets import compile_for_target
from attention_cases import MASK_BIT_PACKING, spill_allowance

MODIFIERS = {"causal": (K.causal(), None), "sliding+softcap": (K.sliding_window(256), K.softcap(30.0)),
             "document": (K.and_masks(K.causal(), K.document(torch.zeros(64, dtype=torch.int32))), None)}
# every candidate the tuner times (the disable-lsr variant included) with the causal mask; the other modifiers
# on the first candidate of each head dim
CASES = [(d, c, "causal") for d in fwd_configs.GLUON_CONFIGS for c in fwd_configs.gluon_candidates(d)]
CASES += [(d, fwd_configs.gluon_candidates(d)[0], m) for d in fwd_configs.GLUON_CONFIGS for m in MODIFIERS
          if m != "causal"]


# Measured exceptions (bytes of spill stores and loads): three consumer warpgroups over 128-key tiles at D=64 hold
# S (64 registers), P and O (32 each) in 160 registers; ptxas may keep one or two probabilities per step in local
# memory (3,264 / 3,244 B of stores when P's conversion sat beside the next S, D=128 softcap 652 B). The budgets
# are what Triton 3.6's defaults spill (44 / 36 B); the candidates' +no-slp compile spills nothing there, Triton
# 3.9 16-24 B.
SPILL_BUDGET = {(64, "BM192-BN128-w4-s2-gluon", "causal"): (44, 44),
                (64, "BM192-BN128-w4-s3-gluon", "causal"): (36, 36),
                (64, "BM192-BN128-w4-s2-gluon-pp", "causal"): (44, 44)}


def compile_gluon(config, head_dim, mask, score, dtype=torch.bfloat16):
    fn, signature, constexprs, _ = fwd_launch.compile_spec(dtype, head_dim, config, mask, score)
    with pipeline_scope(config.pipeline):
        return compile_for_target(fn, signature, constexprs, target="sm_90", aligned_pointers=True,
                                  **config.compile_options())


@pytest.mark.parametrize("head_dim, config, modifiers", CASES, ids=[f"D{d}-{c.label()}-{m}" for d, c, m in CASES])
def test_candidates_compile_without_spills_or_serialized_wgmma(head_dim, config, modifiers):
    mask, score = MODIFIERS[modifiers]
    compiled = compile_gluon(config, head_dim, mask, score)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    resources = measure_resources(compiled.asm["cubin"], ptx, 90, (), compiled.metadata.shared)
    stores, loads = SPILL_BUDGET.get((head_dim, config.label(), modifiers), (0, 0))
    assert resources.spill_stores <= spill_allowance(stores), resources
    assert resources.spill_loads <= spill_allowance(loads), resources
    assert not [w for w in resources.warnings if re.search(r"C751\d", w)], resources.warnings
    assert resources.static_shared + resources.dynamic_shared <= 227 * 1024, resources
    # each consumer warpgroup raises its registers to the budget, the producer's warpgroup drops to 24
    budgets = {int(n) for n in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)}
    assert {fwd_configs.gluon_consumer_registers(config), 24} <= budgets, budgets
    # two consumer loops (full tiles, partial tiles) per consumer warpgroup keep S_j and P_{j-1} V_{j-1} in flight
    consumers = config.block_m // fwd_configs.GLUON_WG_ROWS
    assert len(wgmma_overlap(disassemble(compiled.asm["cubin"]))) == 2 * consumers


def test_partial_tile_masks_are_not_packed_into_bit_vectors():
    """Triton 3.6's LLVM SLP vectorizer packs a partial tile's mask (one boolean per score) into ``<64 x i1>``
    vectors, which become 16-bit shifts and ors (957 SASS instructions in the partial-tile loop instead of 758,
    D=64 causal). The candidates compile without it on every Triton, and only Triton 3.6's defaults pack
    (what ``slp_vectorizer_packs_masks`` says: the fix applies where it is needed)."""
    from tritonpatch import llvm
    from tritonpatch.kernels._runtime.triton_compat import slp_vectorizer_packs_masks

    defaults = fwd_configs.GLUON_CONFIGS[64][0]
    packed = MASK_BIT_PACKING.findall(compile_gluon(defaults, 64, K.causal(), None).asm["ptx"])
    assert bool(packed) == slp_vectorizer_packs_masks("forward"), len(packed)
    if not llvm.available():
        pytest.skip("tritonpatch._native is not usable here (the candidates compile under Triton's defaults)")
    candidate = fwd_configs.gluon_candidates(64)[0]
    assert candidate.label() == defaults.label() + ("+no-slp" if packed else "")
    assert not MASK_BIT_PACKING.findall(compile_gluon(candidate, 64, K.causal(), None).asm["ptx"])


def test_fp16_compiles():
    config = fwd_configs.GLUON_CONFIGS[128][0]
    ptx = compile_gluon(config, 128, K.causal(), None, torch.float16).asm["ptx"]
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in ptx


def test_config_checks():
    with pytest.raises(ValueError, match="block_m 64, 128 or 192"):
        fwd_configs.FwdConfig(96, 64, 4, 2, use_tma=True, gluon=True)
    with pytest.raises(ValueError, match="two or three of them"):
        fwd_configs.gluon_config(64, 64, 2, pingpong=True)
    with pytest.raises(ValueError, match="up to 4 for a Gluon config"):
        fwd_configs.FwdConfig(64, 64, 4, 2, use_tma=True, programs_per_sm=2)
    one_consumer = fwd_configs.gluon_config(64, 64, 2, programs_per_sm=3)
    assert one_consumer.label() == "BM64-BN64-w4-s2-gluon-x3"
    assert one_consumer.compile_options()["maxnreg"] == 80 and fwd_configs.gluon_consumer_registers(one_consumer) == 136
    alone = fwd_configs.gluon_config(64, 64, 2)   # one consumer per program: never more than setmaxnreg's 240
    assert alone.compile_options()["maxnreg"] == 128 and fwd_configs.gluon_consumer_registers(alone) == 232
    with pytest.raises(ValueError, match="at most 65535"):
        fwd_configs.gluon_config(128, 128, 2, head_swizzle=1 << 16)
    swizzled = fwd_configs.gluon_config(128, 128, 2, head_swizzle=8)
    assert gluon_constexprs(64, swizzled, K.causal(), None)["HEAD_SWIZZLE"] == 8
    with pytest.raises(ValueError, match="use_tma=True"):
        fwd_configs.FwdConfig(128, 128, 4, 2, gluon=True)
    with pytest.raises(ValueError, match="needs gluon=True"):
        fwd_configs.FwdConfig(128, 128, 4, 2, use_tma=True, pingpong=True)
    with pytest.raises(ValueError, match="head_swizzle .* needs gluon=True"):
        fwd_configs.FwdConfig(128, 128, 4, 2, use_tma=True, head_swizzle=4)
    with pytest.raises(ValueError, match="positive group of heads"):
        fwd_configs.gluon_config(128, 128, 2, head_swizzle=-1)
    assert fwd_configs.gluon_config(192, 128, 2, True, head_swizzle=8).label() == "BM192-BN128-w4-s2-gluon-pp-hs8"
    assert fwd_configs.GLUON_CONFIGS[128][0].compile_options() == {"num_warps": 4, "maxnreg": 168}
    assert fwd_configs.gluon_consumer_registers(fwd_configs.GLUON_CONFIGS[64][1]) == 160


def test_wgmma_overlap_counts_exponentials_under_the_wait():
    sass = """
        /*0100*/  HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR16].tnspB, R88, gsb0 ;
        /*0110*/  WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0120*/  MUFU.EX2 R3, R4 ;
        /*0130*/  MUFU.EX2 R5, R6 ;
        /*0140*/  WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0150*/  MUFU.EX2 R7, R8 ;
        /*0160*/  WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0170*/  WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0180*/  WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
    """
    assert wgmma_overlap(sass) == [2, 0]
    assert wgmma_overlap("MUFU.EX2 R1, R2 ;") == []


def test_gluon_problem_names_what_the_kernel_cannot_run():
    from attention_cases import head_bias_dev, key_padding_dev

    q = torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16)
    custom_mask = K.custom_mask(key_padding_dev, lambda b, h, qi, kv, n: kv < n[b], (torch.tensor([64]),))
    custom_score = K.custom_score(head_bias_dev, lambda s, b, h, qi, kv, bias: s + bias[h], (torch.zeros(2),))
    assert "float16 or bfloat16" in gluon_problem(q.float(), q.float(), q.float(), K.causal(), None)
    small = torch.zeros(1, 2, 64, 32, dtype=torch.bfloat16)
    assert "head dims 64 and 128" in gluon_problem(small, small, small, K.causal(), None)
    assert "shipped factories" in gluon_problem(q, q, q, custom_mask, None)
    assert "shipped factories" in gluon_problem(q, q, q, K.causal(), custom_score)
    strided = torch.zeros(1, 2, 64, 132, dtype=torch.bfloat16)[..., :128]   # rows of 264 bytes
    assert "TMA-compatible" in gluon_problem(strided, strided, strided, K.causal(), K.softcap(20.0))
    assert "Hopper" in gluon_problem(q, q, q, K.causal(), K.alibi(torch.ones(2)))


def test_tuner_offers_the_gluon_candidates_where_they_apply(monkeypatch):
    """With the device checks stubbed (no GPU here): the head dim's Gluon candidates join the timed set
    when gluon_problem finds nothing against the call, none do for a custom mask, and a block mask
    keeps only the candidates of its tiles."""
    from attention_cases import key_padding_dev
    from tritonpatch.kernels.fwd import tuner as fwd_tuner

    monkeypatch.setattr(fwd_tuner, "candidate_configs", lambda head_dim, device: [fwd_configs.INTERPRETER_CONFIG])
    def as_on_hopper(q, k, v, mask, score):   # every check but the GPU's (the last one)
        problem = gluon_problem(q, k, v, mask, score)
        return None if problem == "needs a Hopper GPU (sm_90)" else problem

    monkeypatch.setattr(fwd_tuner, "gluon_problem", as_on_hopper)
    q = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    offered = fwd_tuner.tuning_candidates(q, q, q, K.causal(), None, None, True)
    assert [c for c in offered if c.gluon] == fwd_configs.gluon_candidates(128)
    assert not [c for c in fwd_tuner.tuning_candidates(q, q, q, K.causal(), None, None, False) if c.gluon]
    custom = K.custom_mask(key_padding_dev, lambda b, h, qi, kv, n: kv < n[b], (torch.tensor([64]),))
    assert not [c for c in fwd_tuner.tuning_candidates(q, q, q, custom, None, None, True) if c.gluon]
    tiles = K.build_block_mask(K.causal(), 1, 2, 256, 256, block_m=128, block_n=128, device="cpu")
    q64 = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    with_mask = fwd_tuner.tuning_candidates(q64, q64, q64, K.causal(), None, tiles, True)
    of_its_tiles = [c for c in fwd_configs.gluon_candidates(64) if (c.block_m, c.block_n) == (128, 128)]
    assert of_its_tiles and len(of_its_tiles) < len(fwd_configs.gluon_candidates(64))
    assert {c.label() for c in with_mask if c.gluon} == {c.label() for c in of_its_tiles}
