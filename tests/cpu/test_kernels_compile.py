"""Compile-only (sm_90, no GPU) checks of every attention kernel variant: head dims, dtypes, masks,
score mods, pointer and TMA load paths."""
from __future__ import annotations

import re

import pytest
import torch

import tritonpatch.kernels as K
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import kernels as fwd_kernels
from tritonpatch.kernels.fwd import launch as fwd_launch
from tritonpatch.kernels import _inputs as kernel_inputs
from tritonpatch.kernels.block_mask import _classify_tiles_kernel
from tritonpatch.targets import compile_for_target
from attention_cases import forward_candidates, spill_allowance

IDS = torch.zeros(64, dtype=torch.int32)
MODIFIERS = {
    "none": (K.allow_all(), None),
    "causal": (K.causal(), None),
    "prefix_lm": (K.prefix_lm(100), None),
    "sliding_window": (K.sliding_window(256), None),
    "document": (K.document(IDS), None),
    "causal&document": (K.and_masks(K.causal(), K.document(IDS)), None),
    "sliding|prefix": (K.or_masks(K.sliding_window(8), K.prefix_lm(16)), None),
    "causal+alibi": (K.causal(), K.alibi(torch.ones(4))),
    "softcap": (K.allow_all(), K.softcap(30.0)),
}
# every modifier once; head dim, dtype and load path rotate so each of those values is covered too
VARIANTS = [(name, (64, 128)[i % 2], (torch.float16, torch.bfloat16)[(i // 2) % 2], bool(i % 3 == 0))
            for i, name in enumerate(MODIFIERS)]
VARIANTS += [("causal", d, dt, tma) for d in (64, 128) for dt in (torch.float16, torch.bfloat16)
             for tma in (False, True) if ("causal", d, dt, tma) not in VARIANTS]


def compile_forward(config, head_dim, dtype, mask, score=None):
    return compile_for_target(fwd_kernels._attn_fwd_kernel, fwd_launch.kernel_signature(dtype, head_dim, config, mask, score),
                              fwd_launch.kernel_constexprs(head_dim, config, mask, score), target="sm_90",
                              **config.compile_options())


def compile_variant(name, head_dim, dtype, use_tma):
    mask, score = MODIFIERS[name]
    return compile_forward(fwd_configs.FwdConfig(128, 64, 8 if head_dim == 128 else 4, 3, use_tma), head_dim, dtype, mask, score)


@pytest.mark.parametrize("name, head_dim, dtype, use_tma", VARIANTS,
                         ids=[f"{n}-D{d}-{str(dt)[6:]}-{'tma' if t else 'ptr'}" for n, d, dt, t in VARIANTS])
def test_forward_variant_compiles_to_wgmma(name, head_dim, dtype, use_tma):
    compiled = compile_variant(name, head_dim, dtype, use_tma)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx, "Hopper matmuls must use wgmma"
    assert ("cp.async.bulk.tensor" in ptx) == use_tma
    assert ".local" not in ptx, "no stack frame (spills to local memory)"
    assert compiled.metadata.shared <= 227 * 1024


CANDIDATES, CANDIDATE_IDS = forward_candidates()
# Measured exception (bytes of spill stores/loads, Triton 3.6): the causal D=64 winner spills with the sliding
# window's two-sided mask in its partial loop (none with causal), and the tuner times it as it is.
SPILL_BUDGET = {(64, "BM128-BN128-w4-s3-tma"): 128}


@pytest.mark.parametrize("head_dim, config", CANDIDATES, ids=CANDIDATE_IDS)
def test_tuned_candidates_compile_for_sm90_without_spills(head_dim, config):
    """Every forward config the Hopper tuner may pick (sliding window: mask work in the partial loop)."""
    from tritonpatch.inspection import measure_resources

    compiled = compile_forward(config, head_dim, torch.bfloat16, K.sliding_window(1024))
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    resources = measure_resources(compiled.asm["cubin"], ptx, 90, (), compiled.metadata.shared)
    allowed = spill_allowance(SPILL_BUDGET.get((head_dim, config.label()), 0))
    assert resources.spill_stores <= allowed and resources.spill_loads <= allowed, resources
    assert resources.registers <= (config.max_registers or 255), resources   # the cap reaches ptxas
    assert resources.static_shared + resources.dynamic_shared <= 227 * 1024, resources


def test_full_tiles_loop_has_no_mask_work():
    """Two kv loops; only the partial-tile one compares q and kv indices (causal: one cmpi sge on them)."""
    ttir = compile_variant("causal", 64, torch.float16, False).asm["ttir"]
    loops = re.findall(r"scf\.for .*?\n(.*?)\n\s+scf\.yield", ttir, flags=re.S)
    assert len(loops) == 2
    compares = [len(re.findall(r"arith\.cmpi (?:sge|slt)", body)) for body in loops]
    assert 0 in compares and max(compares) >= 1


def test_tile_classifier_compiles():
    mask = K.and_masks(K.causal(), K.document(IDS))
    sig = {"classes": "*i8", "stride_cb": "i32", "stride_ch": "i32", "stride_cq": "i32",
           "mask_args": kernel_inputs.arg_types(mask.args), "q_len": "i32", "kv_len": "i32", "num_kv_blocks": "i32",
           "num_heads": "i32"}
    compiled = compile_for_target(_classify_tiles_kernel, sig, {"MASK_FN": mask.device_fn, "BLOCK_M": 128,
                                                                "BLOCK_N": 64}, target="sm_90", num_warps=4)
    assert "st.global" in compiled.asm["ptx"]


def test_mask_parameters_are_runtime_arguments():
    """Changing a window or prefix reuses the same device function (no recompile)."""
    assert K.sliding_window(64).device_fn is K.sliding_window(1024).device_fn
    assert K.and_masks(K.causal(), K.prefix_lm(3)).device_fn is K.and_masks(K.causal(), K.prefix_lm(9)).device_fn
    assert K.causal().device_fn is not K.prefix_lm(3).device_fn


def test_parallel_compiles_hook_tritonpatch_in_before_the_first_submit(monkeypatch):
    """A candidate that starts compiling before tritonpatch is hooked in does not take the LLVM-option
    scope, so it can run while another candidate's Pipeline has disable-lsr applied process-wide and be
    built (and cached) with it; seen on Triton 3.9 under load. parallel_compiles installs first."""
    import tritonpatch
    from tritonpatch.kernels._runtime.launch import parallel_compiles

    was_installed = tritonpatch.installed()
    tritonpatch.uninstall()
    monkeypatch.setenv("TRITONPATCH_COMPILE_THREADS", "2")
    try:
        with parallel_compiles():
            assert tritonpatch.installed()
    finally:
        if not was_installed:
            tritonpatch.uninstall()


