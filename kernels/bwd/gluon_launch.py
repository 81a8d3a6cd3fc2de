"""Launching the Gluon dK/dV kernel (:mod:`.gluon_kernel`): its host TMA descriptors, grid and launch
options, its compile-only signature, and when it can run a call (:func:`gluon_problem`)."""
from __future__ import annotations

import torch
import triton

from .._inputs import ELEMENT, arg_types
from .._runtime.launch import LaunchPlans, pipeline_scope
from .._runtime.tma import gluon_descriptor_type, gluon_tile_descriptor, tma_compatible
from ..block_mask import TransposedBlockMask
from ..fwd.gluon_launch import gluon_problem as forward_gluon_problem
from ..masks import MaskMod
from ..scores import ScoreMod
from .arguments import modifier_constexprs, tile_list_args
from .configs import GLUON_CONSUMER_REGISTERS, GLUON_WG_KEYS, KernelConfig


def gluon_problem(q, k, v, dout, mask_mod: MaskMod, score_mod: ScoreMod | None) -> str | None:
    """Why the Gluon dK/dV kernel cannot run this call (None: it can): what the Gluon forward needs
    (:func:`..fwd.gluon_launch.gluon_problem`: fp16/bf16, head dim 64 or 128, the shipped factories'
    modifiers, TMA-compatible tensors, Hopper), dout TMA-compatible first."""
    if not tma_compatible(dout):
        return "needs a TMA-compatible dout (unit stride in D, 16-byte aligned base and other strides)"
    return forward_gluon_problem(q, k, v, mask_mod, score_mod)


def kernel_signature(dtype: torch.dtype, head_dim: int, config: KernelConfig, mask_mod: MaskMod,
                     score_mod: ScoreMod | None) -> dict:
    """Triton signature of ``_attn_bwd_dkdv_gluon_kernel`` for compile-only use."""
    elem = ELEMENT[dtype]
    rows_m, rows_n = config.block_m, config.block_n
    sig = {"q_desc": gluon_descriptor_type(dtype, rows_m, head_dim),
           "k_desc": gluon_descriptor_type(dtype, rows_n, head_dim),
           "v_desc": gluon_descriptor_type(dtype, rows_n, head_dim),
           "do_desc": gluon_descriptor_type(dtype, rows_m, head_dim),
           "dq_desc": gluon_descriptor_type(torch.float32, rows_m, head_dim),
           "DK": "*" + elem, "DV": "*" + elem, "LSE": "*fp32", "DELTA": "*fp32"}
    sig.update({name: "i32" for name in ("stride_dkb", "stride_dkh", "stride_dkn", "stride_lb", "stride_lh")})
    sig.update({"partial_num": "*i32", "partial_ids": "*i32", "full_num": "*i32", "full_ids": "*i32"})
    sig.update({name: "i32" for name in ("stride_nb", "stride_nh", "stride_ib", "stride_ih", "stride_in",
                                          "num_heads", "group_size", "q_len", "kv_len")})
    sig.update({"sm_scale": "fp32", "qk_scale": "fp32", "mask_args": arg_types(mask_mod.args),
                "score_args": arg_types(score_mod.args) if score_mod is not None else ()})
    return sig


def kernel_constexprs(head_dim: int, config: KernelConfig, mask_mod: MaskMod, score_mod: ScoreMod | None,
                      add_dq: bool, mask_tile: tuple) -> dict:
    """Compile-time arguments of ``_attn_bwd_dkdv_gluon_kernel``; ``mask_tile``: the block mask's
    ``(block_m, block_n)``."""
    return dict(modifier_constexprs(mask_mod, score_mod), ADD_DQ=add_dq, MASK_BLOCK_M=mask_tile[0],
                MASK_BLOCK_N=mask_tile[1], BLOCK_M=config.block_m, HEAD_DIM=head_dim,
                NUM_WG=config.block_n // GLUON_WG_KEYS, STAGES=config.num_stages,
                CONSUMER_REGS=GLUON_CONSUMER_REGISTERS)


def compile_spec(dtype: torch.dtype, head_dim: int, config: KernelConfig, mask_mod: MaskMod,
                 score_mod: ScoreMod | None = None, *, add_dq: bool = True, mask_tile: tuple | None = None):
    """``(fn, signature, constexprs, attrs)`` of the Gluon dK/dV kernel for compile-only use (as
    :func:`.launch.compile_spec` gives them); compile with ``config.compile_options()``."""
    from .gluon_kernel import _attn_bwd_dkdv_gluon_kernel

    mask_tile = mask_tile or (config.block_m, config.block_n)
    return (_attn_bwd_dkdv_gluon_kernel, kernel_signature(dtype, head_dim, config, mask_mod, score_mod),
            kernel_constexprs(head_dim, config, mask_mod, score_mod, add_dq, mask_tile), {})


_PLANS = LaunchPlans()


def launch_dkdv(q, k, v, dout, dk, dv, dq_acc, lse, delta, tmask: TransposedBlockMask, mask_mod, score_mod, scale,
                config: KernelConfig, warmup: bool = False, plan_key=None):
    """Launch the Gluon dK/dV kernel (or with ``warmup`` only compile it); ``dq_acc`` None: no dQ
    (separate mode), else the fp32 accumulator it adds dQ into."""
    from .gluon_kernel import _attn_bwd_dkdv_gluon_kernel

    tensors = (q, k, v, dout, dk, dv, dq_acc, lse, delta)
    key = None if plan_key is None else (plan_key, "dkdv-gluon", config, dq_acc is not None)
    if not warmup and _PLANS.replay(key, tensors):
        return
    # without dQ the accumulator's descriptor is never used: any fp32 [B, H, Sq, D] tensor names its type
    acc = dq_acc if dq_acc is not None else torch.empty((1, 1, config.block_m, q.shape[-1]), dtype=torch.float32,
                                                        device=q.device)
    args = (gluon_tile_descriptor(q, config.block_m), gluon_tile_descriptor(k, config.block_n),
            gluon_tile_descriptor(v, config.block_n), gluon_tile_descriptor(dout, config.block_m),
            gluon_tile_descriptor(acc, config.block_m), dk, dv, lse, delta,
            dk.stride(0), dk.stride(1), dk.stride(2), lse.stride(0), lse.stride(1),
            *tile_list_args(tmask.q_num_blocks, tmask.q_indices, tmask.full_q_num_blocks, tmask.full_q_indices,
                            q, k, mask_mod, score_mod, scale))
    kwargs = dict(kernel_constexprs(q.shape[-1], config, mask_mod, score_mod, dq_acc is not None,
                                    (tmask.block_m, tmask.block_n)), **config.compile_options())
    grid = (triton.cdiv(k.shape[2], config.block_n), q.shape[0] * k.shape[1])
    with pipeline_scope(config.pipeline):
        _PLANS.launch(key, _attn_bwd_dkdv_gluon_kernel, grid, args, kwargs, tensors, warmup)
