"""Launching the Gluon forward (:mod:`.gluon_kernel`): its host TMA descriptors, grid and launch
options, its compile-only signature, and when it can run a call (:func:`gluon_problem`)."""
from __future__ import annotations

import torch
import triton

from .._inputs import LOG2E, arg_types
from .._runtime.launch import LaunchPlans, pipeline_scope
from .._runtime.tma import gluon_descriptor_type, gluon_tile_descriptor, tma_compatible
from ..block_mask import BlockMask
from ..masks import MaskMod
from ..scores import ScoreMod
from .configs import GLUON_WG_ROWS as WG_ROWS
from .configs import FwdConfig, gluon_consumer_registers


def gluon_problem(q, k, v, mask_mod: MaskMod, score_mod: ScoreMod | None) -> str | None:
    """Why the Gluon forward cannot run this call (None: it can): it needs fp16/bf16, head dim 64 or 128,
    modifiers from the shipped factories (a ``custom_mask`` or ``custom_score`` function is Triton-language
    code that may build tensors without the layouts Gluon requires), TMA-compatible tensors (16-byte
    aligned bases and strides) and a Hopper GPU. Every supported Triton (3.6 to 3.9) builds it
    (:mod:`.._runtime.gluon_compat`)."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"needs float16 or bfloat16 (got {q.dtype})"
    if q.shape[-1] not in (64, 128):
        return f"supports head dims 64 and 128 (got {q.shape[-1]})"
    if mask_mod.portable_key() is None or (score_mod is not None and score_mod.portable_key() is None):
        return "takes masks and score modifiers of the shipped factories only (not custom_mask / custom_score)"
    if not tma_compatible(q, k, v):
        return "needs TMA-compatible tensors (unit stride in D, 16-byte aligned bases and other strides)"
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "needs a Hopper GPU (sm_90)"
    return None


def kernel_signature(dtype: torch.dtype, head_dim: int, config: FwdConfig, mask_mod: MaskMod,
                     score_mod: ScoreMod | None) -> dict:
    """Triton signature of ``_attn_fwd_gluon_kernel`` for compile-only use."""
    def desc(rows):
        return gluon_descriptor_type(dtype, rows, head_dim)

    sig = {"q_desc": desc(WG_ROWS), "k_desc": desc(config.block_n), "v_desc": desc(config.block_n),
           "o_desc": desc(WG_ROWS), "LSE": "*fp32", "stride_lb": "i32", "stride_lh": "i32",
           "partial_num": "*i32", "partial_ids": "*i32", "full_num": "*i32", "full_ids": "*i32"}
    sig.update({name: "i32" for name in ("stride_nb", "stride_nh", "stride_ib", "stride_ih", "stride_iq",
                                          "num_heads", "group_size", "q_len", "kv_len")})
    sig.update({"sm_scale": "fp32", "qk_scale": "fp32", "mask_args": arg_types(mask_mod.args),
                "score_args": arg_types(score_mod.args) if score_mod is not None else ()})
    return sig


def kernel_constexprs(head_dim: int, config: FwdConfig, mask_mod: MaskMod, score_mod: ScoreMod | None) -> dict:
    """Compile-time arguments of ``_attn_fwd_gluon_kernel``."""
    return {"MASK_FN": mask_mod.device_fn, "SCORE_FN": score_mod.device_fn if score_mod is not None else None,
            "HAS_SCORE": score_mod is not None, "NUM_WG": config.block_m // WG_ROWS, "BLOCK_N": config.block_n,
            "HEAD_DIM": head_dim, "STAGES": config.num_stages, "PINGPONG": config.pingpong,
            "CONSUMER_REGS": gluon_consumer_registers(config), "HEAD_SWIZZLE": config.head_swizzle}


def compile_spec(dtype: torch.dtype, head_dim: int, config: FwdConfig, mask_mod: MaskMod,
                 score_mod: ScoreMod | None = None):
    """``(fn, signature, constexprs, attrs)`` of the Gluon forward for compile-only use, as
    :func:`.launch.compile_spec` gives them; compile with ``config.compile_options()``."""
    from .gluon_kernel import _attn_fwd_gluon_kernel

    return (_attn_fwd_gluon_kernel, kernel_signature(dtype, head_dim, config, mask_mod, score_mod),
            kernel_constexprs(head_dim, config, mask_mod, score_mod), {})


_PLANS = LaunchPlans()


def launch(q, k, v, out, lse, block_mask: BlockMask, mask_mod: MaskMod, score_mod, scale, config: FwdConfig,
           warmup: bool = False, plan_key=None):
    """Launch the Gluon forward (or with ``warmup`` only compile it); ``plan_key`` as in
    :func:`.launch.launch`."""
    from .gluon_kernel import _attn_fwd_gluon_kernel

    tensors = (q, k, v, out, lse)
    if plan_key is not None and not warmup and _PLANS.replay(plan_key, tensors):
        return None
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    launch_args = (
        gluon_tile_descriptor(q, WG_ROWS), gluon_tile_descriptor(k, config.block_n),
        gluon_tile_descriptor(v, config.block_n), gluon_tile_descriptor(out, WG_ROWS), lse, lse.stride(0),
        lse.stride(1), *block_mask.kernel_arguments(batch, heads),
        heads, heads // kv_heads, q_len, kv_len, scale, scale * LOG2E,
        mask_mod.args, score_mod.args if score_mod is not None else ())
    kwargs = dict(kernel_constexprs(head_dim, config, mask_mod, score_mod), **config.compile_options())
    grid = (triton.cdiv(q_len, config.block_m), batch * heads)
    with pipeline_scope(config.pipeline):
        return _PLANS.launch(plan_key, _attn_fwd_gluon_kernel, grid, launch_args, kwargs, tensors, warmup)
