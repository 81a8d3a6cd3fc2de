"""Attention backward on the CPU: the interpreter suite (own process), sm_90 compile-only facts of
the backward kernels, dq_mode selection under torch's determinism switch, and input errors."""
from __future__ import annotations

import os
import re

import pytest
import torch
import triton
import triton.language as tl

import tritonpatch.kernels as K
from tritonpatch.kernels import block_mask as block_mask_module
from tritonpatch.kernels.bwd import backward as bwd_backward
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd import dq_adds as bwd_dq_adds
from tritonpatch.kernels.bwd import launch as bwd_launch
from tritonpatch.kernels.autograd import attention_with_grad
from tritonpatch.targets import parse_target
from attention_cases import run_interpreter_suite, spill_allowance



def test_interpreter_suite():
    """tests/interpret/test_kernels_bwd_interpret.py in its own TRITON_INTERPRET=1 process."""
    passed, skipped = run_interpreter_suite("test_kernels_bwd_interpret.py")
    assert passed > 0 and skipped == 0


# ---------------------------------------------------------------------------------------------
# Compile-only (sm_90): every tuned candidate compiles to wgmma without spills; dQ adds vectorize.
# ---------------------------------------------------------------------------------------------

def compile_sm90(kernel, dtype, head_dim, config, mask_mod, score_mod=None, dq_add=bwd_dq_adds.ATOMIC_ADD,
                 mask_tile=None):
    fn, signature, constexprs, attrs = bwd_launch.compile_spec(kernel, dtype, head_dim, config, mask_mod, score_mod,
                                                      dq_add=dq_add, mask_tile=mask_tile)
    from triton.compiler import ASTSource

    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                          target=parse_target("sm_90"),
                          options={"num_warps": config.num_warps, "num_stages": config.num_stages})


def reduction_ops(ptx: str) -> dict:
    ops = re.findall(r"\b((?:red|atom)\.global\.[\w.]+)", ptx)
    return {op: ops.count(op) for op in set(ops)}


CANDIDATES = [("dkdv", d, c) for d, cs in bwd_configs.DKDV_CONFIGS.items() for c in cs] + \
             [("dq", d, c) for d, cs in bwd_configs.DQ_CONFIGS.items() for c in cs]
# Measured exceptions (bytes of spill stores/loads on Triton 3.6; dK/dV with the atomic dQ): FlexAttention's
# D=128 dK/dV tile spills 136 bytes at 3 stages (112 at 2), the D=128 dQ BM128-BN128 tile 28, and both were
# still the fastest in the H200 sweep (docs/history.md#attention-backward).
SPILL_BUDGET = {("dkdv", 128, "BM64-BN128-w8-s3"): 160, ("dkdv", 128, "BM64-BN128-w8-s2"): 128,
                ("dq", 128, "BM128-BN128-w8-s2-tma"): 32}


@pytest.mark.parametrize("kernel, head_dim, config", CANDIDATES, ids=lambda x: getattr(x, "label", lambda: x)())
def test_tuned_candidates_compile_for_sm90_within_spill_budget(kernel, head_dim, config):
    from tritonpatch.inspection import measure_resources

    compiled = compile_sm90(kernel, torch.bfloat16, head_dim, config, K.causal())
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    resources = measure_resources(compiled.asm["cubin"], ptx, 90, (), compiled.metadata.shared)
    # 3.9: D=128 BM32-BN128 spills 16 bytes, BM64-BN128 180-204 instead of 112-136
    allowed = spill_allowance(SPILL_BUDGET.get((kernel, head_dim, config.label()), 0))
    assert resources.spill_stores <= allowed and resources.spill_loads <= allowed, resources
    ops = reduction_ops(ptx)
    if kernel == "dkdv":
        # tl.atomic_add(sem="relaxed") on 16-byte aligned rows: only 4-wide vector atomics (3.9 emits red
        # for an unused result, 3.6 atom)
        assert ops and all(re.fullmatch(r"(atom|red)\.global\.gpu\.relaxed\.add\.v4\.f32", op) for op in ops), ops
    else:
        assert not ops, ops   # the separate dQ kernel writes plain stores


def test_dq_add_variants_compile():
    config = bwd_configs.DKDV_CONFIGS[64][0]
    adds = {"none": None, "red": bwd_dq_adds.RED_ADD, "tma": bwd_dq_adds.TMA_ADD}
    compiled = {w: compile_sm90("dkdv", torch.float16, 64, config, K.causal(), dq_add=add) for w, add in adds.items()}
    by_write = {w: reduction_ops(c.asm["ptx"]) for w, c in compiled.items()}
    assert by_write["none"] == {} and by_write["tma"] == {}
    assert set(by_write["red"]) == {"red.global.add.f32"}, by_write["red"]
    # the TMA unit's bulk reduce-add, one per dQ tile
    assert "cp.reduce.async.bulk.tensor" in compiled["tma"].asm["ptx"] and ".add" in compiled["tma"].asm["ptx"]


def test_score_mods_and_coarse_block_masks_compile():
    config = bwd_configs.DKDV_CONFIGS[128][0]
    for score_mod in (K.alibi(K.alibi_slopes(4)), K.softcap(30.0)):
        for kernel, cfg in (("dkdv", config), ("dq", bwd_configs.DQ_CONFIGS[128][0])):
            ptx = compile_sm90(kernel, torch.bfloat16, 128, cfg, K.sliding_window(256), score_mod,
                               mask_tile=(128, 128)).asm["ptx"]
            assert "wgmma.mma_async" in ptx


# ---------------------------------------------------------------------------------------------
# dq_mode selection and errors (no kernel runs)
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def deterministic():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)


def test_dq_mode_selection():
    assert [bwd_configs.choose_dq_mode(m) for m in ("separate", "atomic", "auto")] == ["separate", "atomic", "auto"]
    with pytest.raises(ValueError, match="dq_mode must be one of"):
        bwd_configs.choose_dq_mode("fast")


def test_deterministic_algorithms_force_separate(deterministic):
    assert bwd_configs.choose_dq_mode("auto") == "separate"
    assert bwd_configs.choose_dq_mode("separate") == "separate"
    with pytest.raises(RuntimeError, match="use_deterministic_algorithms"):
        bwd_configs.choose_dq_mode("atomic")


def grad_inputs(dtype=torch.float16):
    return [torch.zeros(1, 2, 8, 16, dtype=dtype, requires_grad=True) for _ in range(3)]


def test_score_mod_without_gradient_rule_is_rejected_at_call_time():
    @triton.jit
    def squash(score, b, h, q_idx, kv_idx):
        return score * tl.sigmoid(score)

    score_mod = K.custom_score(squash, lambda s, b, h, q, kv: s * torch.sigmoid(s), name="squash")
    with pytest.raises(NotImplementedError, match="score_mod 'squash' has no gradient rule"):
        attention_with_grad(*grad_inputs(), score_mod=score_mod)


def test_determinism_error_at_call_time(deterministic):
    with pytest.raises(RuntimeError, match="dq_mode='atomic'"):
        attention_with_grad(*grad_inputs(), mask_mod=K.causal(), dq_mode="atomic")


@pytest.mark.parametrize("change, message", [
    ({"out": torch.zeros(1, 2, 9, 16, dtype=torch.float16)}, "out must match q"),
    ({"dout": torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16)}, "dout must match q"),
    ({"lse": torch.zeros(1, 2, 8, dtype=torch.float16)}, "lse must be float32"),
    ({"dq_mode": "quick"}, "dq_mode must be one of"),
    ({"mask_mod": K.document(torch.zeros(6, dtype=torch.int32, device="meta"))},
     r"document\(doc_ids\): doc_ids has shape \(6,\), the attention of B = 1, Sq = Skv = 8 needs"),
    ({"score_mod": K.alibi(torch.ones(3, device="meta"))}, r"alibi\(slopes\): slopes has shape \(3,\).*H = 2"),
    ({"mask_mod": K.document(torch.zeros(8, dtype=torch.int32))},
     r"document\(doc_ids\): a tensor argument is on cpu, the attention runs on meta"),
])
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="checks run before the device check")
def test_backward_input_errors(change, message):
    q, k, v = (torch.zeros(1, 2, 8, 16, dtype=torch.float16, device="meta") for _ in range(3))
    args = {"out": torch.zeros_like(q), "lse": torch.zeros(1, 2, 8, device="meta"), "dout": torch.zeros_like(q)}
    kwargs = {}
    for name, value in change.items():
        if name in args:
            args[name] = value.to("meta")
        else:
            kwargs[name] = value
    with pytest.raises((ValueError, TypeError), match=message):
        bwd_backward.attention_backward(q, k, v, args["out"], args["lse"], args["dout"], **kwargs)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="checks run before the device check")
@pytest.mark.parametrize("make, error, message", [
    (lambda c: bwd_configs.BwdConfig("separate", c), ValueError, r"needs the dQ kernel's config"),
    (lambda c: bwd_configs.BwdConfig("atomic", c, c), ValueError, "leave dq=None"),
    (lambda c: bwd_configs.BwdConfig("auto", c), ValueError, "dq_mode must be 'atomic' or 'separate'"),
    (lambda c: bwd_configs.BwdConfig("atomic", "BM64"), TypeError, "must be KernelConfig"),
])
def test_inconsistent_backward_configs_are_refused_when_made(make, error, message):
    with pytest.raises(error, match=message):
        make(bwd_configs.KernelConfig(32, 32, 4, 1))


def test_tma_config_on_unaligned_rows_is_rejected():
    q = torch.zeros(1, 2, 8, 17, dtype=torch.float16, device="meta")[..., :16]   # 34-byte row stride
    k, v = (torch.zeros(1, 2, 8, 16, dtype=torch.float16, device="meta") for _ in range(2))
    tma = bwd_configs.KernelConfig(16, 16, 4, 1, use_tma=True)
    with pytest.raises(ValueError, match="loads tiles through TMA"):
        bwd_backward.attention_backward(q, k, v, torch.zeros_like(q), torch.zeros(1, 2, 8, device="meta"), torch.zeros_like(q),
                             config=bwd_configs.BwdConfig("separate", tma, tma))


def test_transposed_block_mask_follows_the_index_tensors():
    """Cached per index tensors by object and version: the custom op's per-call BlockMask over the same
    tensors hits; tensors written in place are transposed anew."""
    built = K.build_block_mask(K.sliding_window(20), 1, 1, 64, 64, block_m=16, block_n=16, device="cpu")
    first = block_mask_module.transpose_block_mask(built)
    rewrapped = K.BlockMask(built.kv_num_blocks, built.kv_indices, built.full_kv_num_blocks, built.full_kv_indices,
                            16, 16, 64, 64)
    assert block_mask_module.transpose_block_mask(rewrapped) is first
    built.full_kv_num_blocks.zero_()                                  # every full tile dropped, in place
    again = block_mask_module.transpose_block_mask(built)
    classes = K.BlockMask(again.q_num_blocks, again.q_indices, again.full_q_num_blocks, again.full_q_indices,
                          16, 16, 64, 64).tile_classes()
    assert torch.equal(classes, built.tile_classes().transpose(-1, -2))
