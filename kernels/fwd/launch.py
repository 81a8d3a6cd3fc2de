"""Launching the forward kernel: its compile-only signature and constexprs (``tritonpatch.targets``,
tests, inspection) and the launcher, which replays a recorded launch where it can."""
from __future__ import annotations

import torch
import triton

from .._inputs import ELEMENT, LOG2E, arg_types
from .._runtime.launch import LaunchPlans, pipeline_scope
from .._runtime.tma import tile_descriptor
from .._runtime.triton_compat import device_allocator
from ..block_mask import BlockMask
from ..masks import MaskMod
from ..scores import ScoreMod
from . import gluon_launch
from .configs import SPLIT_PARTIAL_CONFIG, FwdConfig
from .kernels import ALL_TILES, FULL_TILES, PARTIAL_TILES, _attn_fwd_kernel


def kernel_signature(dtype: torch.dtype, head_dim: int, config: FwdConfig, mask_mod: MaskMod,
                     score_mod: ScoreMod | None) -> dict:
    """Triton signature of ``_attn_fwd_kernel`` for compile-only use (``tritonpatch.targets``)."""
    elem = ELEMENT[dtype]
    if config.use_tma and not config.warp_specialize:
        q_desc = f"tensordesc<{elem}[1, 1, {config.block_m}, {head_dim}]>"
        kv_desc = f"tensordesc<{elem}[1, 1, {config.block_n}, {head_dim}]>"
        sig = {"Q": q_desc, "K": kv_desc, "V": kv_desc, "Out": q_desc, "LSE": "*fp32"}
    else:
        sig = {"Q": f"*{elem}", "K": f"*{elem}", "V": f"*{elem}", "Out": f"*{elem}", "LSE": "*fp32"}
    ints = ["stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn",
            "stride_vb", "stride_vh", "stride_vn", "stride_ob", "stride_oh", "stride_om", "stride_lb", "stride_lh",
            "stride_nb", "stride_nh", "stride_ib", "stride_ih", "stride_iq", "num_heads", "group_size",
            "q_len", "kv_len"]
    sig.update({name: "i32" for name in ints})
    sig.update({"stride_qd": "constexpr", "stride_kd": "constexpr", "stride_vd": "constexpr", "stride_od": "constexpr"})
    sig.update({"partial_num": "*i32", "partial_ids": "*i32", "full_num": "*i32", "full_ids": "*i32",
                "sm_scale": "fp32", "qk_scale": "fp32",
                "mask_args": arg_types(mask_mod.args),
                "score_args": arg_types(score_mod.args) if score_mod is not None else ()})
    return sig


def kernel_constexprs(head_dim: int, config: FwdConfig, mask_mod: MaskMod, score_mod: ScoreMod | None,
                      tiles: int = ALL_TILES) -> dict:
    """Compile-time arguments of ``_attn_fwd_kernel`` (contiguous last dims) for one pass (``tiles``)."""
    return {"stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1,
            "MASK_FN": mask_mod.device_fn, "SCORE_FN": score_mod.device_fn if score_mod is not None else None,
            "HAS_SCORE": score_mod is not None, "USE_TMA": config.use_tma,
            "WARP_SPECIALIZE": config.warp_specialize, "BLOCK_M": config.block_m,
            "BLOCK_N": config.block_n, "HEAD_DIM": head_dim, "TILES": tiles}


_PLANS = LaunchPlans()


def launch(q, k, v, out, lse, block_mask: BlockMask, mask_mod: MaskMod, score_mod, scale, config: FwdConfig,
           warmup: bool = False, plan_key=None):
    """Launch the forward kernel (both passes of a split config), or with ``warmup`` only compile it
    (returns the (last) compiled kernel, a future inside ``parallel_compiles``). ``plan_key``: replay
    the launches recorded under this key (see :class:`LaunchPlans`), or record these."""
    if config.gluon:
        return gluon_launch.launch(q, k, v, out, lse, block_mask, mask_mod, score_mod, scale, config, warmup,
                                   plan_key)
    if not config.split:
        return launch_pass(q, k, v, out, lse, block_mask, mask_mod, score_mod, scale, config, ALL_TILES, warmup,
                           plan_key)
    # the first pass is the warp-specialized kernel of this config (``split`` is not read per pass)
    launch_pass(q, k, v, out, lse, block_mask, mask_mod, score_mod, scale, config, FULL_TILES, warmup,
                None if plan_key is None else (plan_key, FULL_TILES))
    return launch_pass(q, k, v, out, lse, block_mask, mask_mod, score_mod, scale, SPLIT_PARTIAL_CONFIG,
                       PARTIAL_TILES, warmup, None if plan_key is None else (plan_key, PARTIAL_TILES))


def launch_pass(q, k, v, out, lse, block_mask: BlockMask, mask_mod: MaskMod, score_mod, scale, config: FwdConfig,
                tiles: int, warmup: bool, plan_key):
    """One launch of ``_attn_fwd_kernel`` over the ``tiles`` of the block mask."""
    tensors = (q, k, v, out, lse)
    if plan_key is not None and not warmup:
        with device_allocator(config.warp_specialize):
            if _PLANS.replay(plan_key, tensors):
                return None
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    mask_args = mask_mod.args
    score_args = score_mod.args if score_mod is not None else ()
    grid = (triton.cdiv(q_len, config.block_m), batch * heads)
    if config.use_tma and not config.warp_specialize:
        q_t, k_t, v_t, out_t = (tile_descriptor(q, config.block_m), tile_descriptor(k, config.block_n),
                                tile_descriptor(v, config.block_n), tile_descriptor(out, config.block_m))
    else:
        q_t, k_t, v_t, out_t = q, k, v, out
    launch_args = (
        q_t, k_t, v_t, out_t, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), lse.stride(0), lse.stride(1),
        *block_mask.kernel_arguments(batch, heads),
        heads, heads // kv_heads, q_len, kv_len, scale, scale * LOG2E, mask_args, score_args)
    kernel_kwargs = dict(MASK_FN=mask_mod.device_fn, SCORE_FN=score_mod.device_fn if score_mod else None,
                         HAS_SCORE=score_mod is not None, USE_TMA=config.use_tma,
                         WARP_SPECIALIZE=config.warp_specialize, BLOCK_M=config.block_m,
                         BLOCK_N=config.block_n, HEAD_DIM=head_dim, TILES=tiles, **config.compile_options())
    with device_allocator(config.warp_specialize), pipeline_scope(config.pipeline):
        return _PLANS.launch(plan_key, _attn_fwd_kernel, grid, launch_args, kernel_kwargs, tensors, warmup)


def compile_spec(dtype: torch.dtype, head_dim: int, config: FwdConfig, mask_mod: MaskMod,
                 score_mod: ScoreMod | None = None, tiles: int = ALL_TILES):
    """``(fn, signature, constexprs, attrs)`` of the forward kernel for compile-only use (contiguous
    last dims), as :func:`tritonpatch.targets.compile_for_target` and ``triton.compile`` take them;
    compile with ``config.compile_options()``. A Gluon config gives the Gluon kernel's (``tiles`` does
    not apply)."""
    if config.gluon:
        return gluon_launch.compile_spec(dtype, head_dim, config, mask_mod, score_mod)
    return (_attn_fwd_kernel, kernel_signature(dtype, head_dim, config, mask_mod, score_mod),
            kernel_constexprs(head_dim, config, mask_mod, score_mod, tiles), {})
