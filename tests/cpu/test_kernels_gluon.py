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
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import launch as fwd_launch
from tritonpatch.targets import compile_for_target
from attention_cases import spill_allowance

MODIFIERS = {"causal": (K.causal(), None), "sliding+softcap": (K.sliding_window(256), K.softcap(30.0)),
             "document": (K.and_masks(K.causal(), K.document(torch.zeros(64, dtype=torch.int32))), None)}
# every candidate with the causal mask; the other modifiers on the first candidate of each head dim
CASES = [(d, c, "causal") for d, configs in fwd_configs.GLUON_CONFIGS.items() for c in configs]
CASES += [(d, configs[0], m) for d, configs in fwd_configs.GLUON_CONFIGS.items() for m in MODIFIERS if m != "causal"]


# Measured exceptions (bytes of spill stores and loads, Triton 3.6): at D=128 softcap's tanh in both loops, and
# the document mask's two id loads per tile, do not fit 240 registers next to S, O and P; the tuner times the
# Gluon candidates against the Triton-language ones.
SPILL_BUDGET = {(128, "sliding+softcap"): (652, 820), (128, "document"): (32, 52)}


def compile_gluon(config, head_dim, mask, score, dtype=torch.bfloat16):
    fn, signature, constexprs, _ = fwd_launch.compile_spec(dtype, head_dim, config, mask, score)
    return compile_for_target(fn, signature, constexprs, target="sm_90", aligned_pointers=True,
                              **config.compile_options())


@pytest.mark.parametrize("head_dim, config, modifiers", CASES, ids=[f"D{d}-{c.label()}-{m}" for d, c, m in CASES])
def test_candidates_compile_without_spills_or_serialized_wgmma(head_dim, config, modifiers):
    mask, score = MODIFIERS[modifiers]
    compiled = compile_gluon(config, head_dim, mask, score)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    resources = measure_resources(compiled.asm["cubin"], ptx, 90, (), compiled.metadata.shared)
    stores, loads = SPILL_BUDGET.get((head_dim, modifiers), (0, 0))
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


def test_fp16_compiles():
    config = fwd_configs.GLUON_CONFIGS[128][0]
    ptx = compile_gluon(config, 128, K.causal(), None, torch.float16).asm["ptx"]
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in ptx


def test_config_checks():
    with pytest.raises(ValueError, match="block_m 128 or 192"):
        fwd_configs.FwdConfig(64, 64, 4, 2, use_tma=True, gluon=True)
    with pytest.raises(ValueError, match="use_tma=True"):
        fwd_configs.FwdConfig(128, 128, 4, 2, gluon=True)
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
