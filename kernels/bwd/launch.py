"""Launching the backward kernels: the launchers (which replay a recorded launch where they can),
the buffers of one backward call, one backward run with a resolved :class:`.configs.BwdConfig`,
and the kernels' compile-only descriptions (``tritonpatch.targets``, tests, inspection)."""
from __future__ import annotations

import functools

import torch
import triton

from .._inputs import ELEMENT, arg_types
from .._runtime.launch import LaunchPlans, pipeline_scope
from .._runtime.tma import tile_descriptor, tma_compatible
from ..block_mask import BlockMask, TransposedBlockMask, transpose_block_mask
from ..masks import MaskMod
from ..scores import ScoreMod
from . import gluon_launch
from .arguments import modifier_constexprs, tile_list_args
from .configs import PREPROCESS_BLOCK_M, BwdConfig, KernelConfig
from .dq_adds import ATOMIC_ADD, DqAdd
from .kernels import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel, _preprocess_kernel


# The launchers below replay the launch recorded under (plan_key, kernel, config) when there is one
# (see LaunchPlans; plan_key comes from attention_backward's call key), else build the arguments.
_PLANS = LaunchPlans()


def launch_preprocess(out, dout, delta, dlse, dq_acc, plan_key=None):
    tensors = (out, dout, delta, dlse, dq_acc)
    key = None if plan_key is None else (plan_key, "preprocess", dq_acc is not None)
    if _PLANS.replay(key, tensors):
        return
    batch, heads, q_len, head_dim = out.shape
    zero = dq_acc is not None
    acc = dq_acc if zero else delta   # unused pointer when not zeroing
    acc_strides = dq_acc.stride()[:3] if zero else (0, 0, 0)
    grid = (triton.cdiv(q_len, PREPROCESS_BLOCK_M), batch * heads)
    args = (out, dout, delta, dlse if dlse is not None else delta, acc,
            *out.stride(), *dout.stride(), delta.stride(0), delta.stride(1), *acc_strides, heads, q_len)
    kwargs = dict(HAS_DLSE=dlse is not None, ZERO_DQ=zero, BLOCK_M=PREPROCESS_BLOCK_M, HEAD_DIM=head_dim,
                  num_warps=4)
    _PLANS.launch(key, _preprocess_kernel, grid, args, kwargs, tensors)


def launch_dkdv(q, k, v, dout, dk, dv, dq_acc, lse, delta, tmask: TransposedBlockMask, mask_mod, score_mod,
                scale, config: KernelConfig, dq_add: DqAdd | None, warmup: bool = False, plan_key=None):
    """Launch the dK/dV kernel; ``dq_add`` None: no dQ (separate mode), else how it adds dQ into ``dq_acc``."""
    tensors = (q, k, v, dout, dk, dv, dq_acc, lse, delta)
    key = None if plan_key is None else (plan_key, "dkdv", config, dq_add)
    if not warmup and _PLANS.replay(key, tensors):
        return
    acc = dq_acc if dq_acc is not None else delta   # never written without a dq_add
    if dq_add is not None and dq_add.descriptor:
        acc = tile_descriptor(dq_acc, config.block_m)
    acc_strides = dq_acc.stride()[:3] if dq_acc is not None else (0, 0, 0)
    q_in, dout_in = ((tile_descriptor(q, config.block_m), tile_descriptor(dout, config.block_m)) if config.use_tma
                     else (q, dout))
    args = (q_in, k, v, dout_in, dk, dv, acc, lse, delta,
            *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *acc_strides,
            lse.stride(0), lse.stride(1),
            *tile_list_args(tmask.q_num_blocks, tmask.q_indices, tmask.full_q_num_blocks, tmask.full_q_indices,
                             q, k, mask_mod, score_mod, scale))
    kwargs = dict(modifier_constexprs(mask_mod, score_mod), DQ_ADD=None if dq_add is None else dq_add.fn,
                  ADD_DQ=dq_add is not None, USE_TMA=config.use_tma,
                  MASK_BLOCK_N=tmask.block_n, SUB_M=tmask.block_m // config.block_m, BLOCK_M=config.block_m,
                  BLOCK_N=config.block_n, HEAD_DIM=q.shape[-1], num_warps=config.num_warps,
                  num_stages=config.num_stages)
    grid = (triton.cdiv(k.shape[2], config.block_n), q.shape[0] * k.shape[1])
    with pipeline_scope(config.pipeline):
        _PLANS.launch(key, _attn_bwd_dkdv_kernel, grid, args, kwargs, tensors, warmup)


def launch_dq(q, k, v, out, dout, dq, lse, delta, dlse, block_mask: BlockMask, mask_mod, score_mod, scale,
              config: KernelConfig, warmup: bool = False, plan_key=None):
    tensors = (q, k, v, out, dout, dq, lse, delta, dlse)
    key = None if plan_key is None else (plan_key, "dq", config)
    if not warmup and _PLANS.replay(key, tensors):
        return
    k_in, v_in = ((tile_descriptor(k, config.block_n), tile_descriptor(v, config.block_n)) if config.use_tma
                  else (k, v))
    args = (q, k_in, v_in, out, dout, dq, lse, delta, dlse if dlse is not None else delta,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(), *dout.stride(), *dq.stride(),
            lse.stride(0), lse.stride(1),
            *tile_list_args(block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks,
                             block_mask.full_kv_indices, q, k, mask_mod, score_mod, scale))
    kwargs = dict(modifier_constexprs(mask_mod, score_mod), HAS_DLSE=dlse is not None, USE_TMA=config.use_tma,
                  MASK_BLOCK_M=block_mask.block_m, SUB_N=block_mask.block_n // config.block_n,
                  BLOCK_M=config.block_m, BLOCK_N=config.block_n, HEAD_DIM=q.shape[-1], num_warps=config.num_warps,
                  num_stages=config.num_stages)
    grid = (triton.cdiv(q.shape[2], config.block_m), q.shape[0] * q.shape[1])
    with pipeline_scope(config.pipeline):
        _PLANS.launch(key, _attn_bwd_dq_kernel, grid, args, kwargs, tensors, warmup)


class Buffers:
    """Inputs and outputs of one backward call (the tuner reuses them as scratch). ``plan_key``: the
    call's replay key; each kernel's plan is kept under it with the kernel's config."""

    def __init__(self, q, k, v, out, dout, lse, dlse, mask_mod, score_mod, scale, masks_for, plan_key=None):
        self.q, self.k, self.v, self.out, self.dout, self.lse, self.dlse = q, k, v, out, dout, lse, dlse
        self.mask_mod, self.score_mod, self.scale, self.masks_for = mask_mod, score_mod, scale, masks_for
        self.plan_key = plan_key
        self.dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        self.dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        self.delta = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)

    @functools.cached_property
    def tma_ok(self) -> bool:
        """Whether the tensors TMA candidates load through descriptors allow it."""
        return tma_compatible(self.q, self.k, self.v, self.dout)

    @functools.cached_property
    def gluon_problem(self) -> str | None:
        """Why the Gluon dK/dV kernel cannot run this call (None: it can)."""
        return gluon_launch.gluon_problem(self.q, self.k, self.v, self.dout, self.mask_mod, self.score_mod)

    def dkdv(self, config: KernelConfig, dq_acc, dq_add: DqAdd | None, warmup: bool = False):
        """The dK/dV kernel of ``config`` (the Gluon one adds dQ its own way: ``dq_add`` only says whether)."""
        if config.gluon:
            gluon_launch.launch_dkdv(self.q, self.k, self.v, self.dout, self.dk, self.dv,
                                     dq_acc if dq_add is not None else None, self.lse, self.delta,
                                     transpose_block_mask(self.masks_for(config)), self.mask_mod, self.score_mod,
                                     self.scale, config, warmup, self.plan_key)
            return
        launch_dkdv(self.q, self.k, self.v, self.dout, self.dk, self.dv, dq_acc, self.lse, self.delta,
                    transpose_block_mask(self.masks_for(config)), self.mask_mod, self.score_mod, self.scale, config,
                    dq_add, warmup, self.plan_key)

    def dq(self, config: KernelConfig, dq, warmup: bool = False):
        launch_dq(self.q, self.k, self.v, self.out, self.dout, dq, self.lse, self.delta, self.dlse,
                  self.masks_for(config), self.mask_mod, self.score_mod, self.scale, config, warmup, self.plan_key)


def run(buf: Buffers, config: BwdConfig) -> torch.Tensor:
    """One backward with a resolved config; fills buf.dk/buf.dv and returns dq."""
    if config.dq_mode == "atomic":
        dq_acc = torch.empty(buf.q.shape, dtype=torch.float32, device=buf.q.device)
        launch_preprocess(buf.out, buf.dout, buf.delta, buf.dlse, dq_acc, buf.plan_key)   # delta; zeroes dq_acc
        buf.dkdv(config.dkdv, dq_acc, config.dq_add)
        return dq_acc.to(buf.q.dtype)
    dq = torch.empty_like(buf.q, memory_format=torch.contiguous_format)
    buf.dq(config.dq, dq)                                                    # also computes delta
    buf.dkdv(config.dkdv, None, None)
    return dq


def compile_spec(kernel: str, dtype: torch.dtype, head_dim: int, config: KernelConfig, mask_mod: MaskMod,
                 score_mod: ScoreMod | None = None, *, dq_add: DqAdd | None = ATOMIC_ADD,
                 mask_tile: tuple | None = None):
    """``(fn, signature, constexprs, attrs)`` of the ``"dkdv"`` or ``"dq"`` kernel for compile-only use:
    contiguous last dims, and ``attrs`` marking what a launch on ``[B, H, S, D]`` tensors with S a
    multiple of 16 specializes as 16-divisible (pointers, row/head/batch strides, lengths), which is
    what lets ``tl.atomic_add`` vectorize. ``dq_add``: the dK/dV kernel's dQ add (None: no dQ, as in
    separate mode); ``mask_tile``: the block mask's ``(block_m, block_n)``."""
    mask_m, mask_n = mask_tile or (config.block_m, config.block_n)
    elem = ELEMENT[dtype]
    if kernel == "dkdv":
        fn = _attn_bwd_dkdv_kernel
        pointers = {"Q": elem, "K": elem, "V": elem, "DO": elem, "DK": elem, "DV": elem, "DQ_ACC": "fp32",
                    "LSE": "fp32", "DELTA": "fp32"}
        groups = ["q", "k", "v", "do", "dk"]
        extra = ["stride_qab", "stride_qah", "stride_qam", "stride_in"]
        specific = {"DQ_ADD": None if dq_add is None else dq_add.fn, "ADD_DQ": dq_add is not None,
                    "MASK_BLOCK_N": mask_n, "SUB_M": mask_m // config.block_m}
    elif kernel == "dq":
        fn = _attn_bwd_dq_kernel
        pointers = {"Q": elem, "K": elem, "V": elem, "O": elem, "DO": elem, "DQ": elem, "LSE": "fp32",
                    "DELTA": "fp32", "DLSE": "fp32"}
        groups = ["q", "k", "v", "o", "do", "dq"]
        extra = ["stride_iq"]
        specific = {"HAS_DLSE": False, "MASK_BLOCK_M": mask_m, "SUB_N": mask_n // config.block_n}
    else:
        raise ValueError(f"kernel must be 'dkdv' or 'dq', got {kernel!r}")
    signature = {name: "*" + t for name, t in pointers.items()}
    if kernel == "dkdv" and dq_add is not None and dq_add.descriptor:
        signature["DQ_ACC"] = f"tensordesc<fp32[1, 1, {config.block_m}, {head_dim}]>"
    if config.use_tma:   # the looped-over tiles come through TMA descriptors
        rows = config.block_m if kernel == "dkdv" else config.block_n
        for name in ("Q", "DO") if kernel == "dkdv" else ("K", "V"):
            signature[name] = f"tensordesc<{elem}[1, 1, {rows}, {head_dim}]>"
    constexprs = {}
    for g in groups:
        row = "n" if g in ("k", "v", "dk") else "m"
        signature.update({f"stride_{g}b": "i32", f"stride_{g}h": "i32", f"stride_{g}{row}": "i32"})
        constexprs[f"stride_{g}d"] = 1
    signature.update({name: "i32" for name in ["stride_lb", "stride_lh", "stride_nb", "stride_nh", "stride_ib",
                                               "stride_ih", "num_heads", "group_size", "q_len", "kv_len"] + extra})
    signature.update({"partial_num": "*i32", "partial_ids": "*i32", "full_num": "*i32", "full_ids": "*i32",
                      "sm_scale": "fp32", "qk_scale": "fp32",
                      "mask_args": arg_types(mask_mod.args),
                      "score_args": arg_types(score_mod.args) if score_mod is not None else ()})
    constexprs.update(specific)
    constexprs.update(modifier_constexprs(mask_mod, score_mod), USE_TMA=config.use_tma, BLOCK_M=config.block_m,
                      BLOCK_N=config.block_n, HEAD_DIM=head_dim)
    for name in constexprs:
        signature[name] = "constexpr"
    params = fn.arg_names
    aligned = [i for i, name in enumerate(params) if str(signature[name]).startswith("*")
               or (name.startswith("stride_") and name[-1] in "bhmn" and name != "stride_in")
               or name in ("q_len", "kv_len")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    return fn, signature, constexprs, attrs
