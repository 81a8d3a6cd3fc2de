"""Block-sparse attention backward in Triton: kernels, transposed block mask, launcher and tuner.

Given the forward's output ``O`` and natural-log log-sum-exp ``lse`` (fp32, ``[B, H, Sq]``):

* **dK/dV kernel**, one program per (kv tile, batch, kv head). It walks the q tiles of the
  *transposed* block mask (for its kv block: full q blocks without mask work, partial ones with it,
  empty ones never) and, for GQA, every query head of its group, so dK/dV are reduced across the
  shared heads in registers. Per q tile it recomputes ``P^T = exp(S^T - lse)`` and accumulates
  ``dV += P^T dO`` and ``dK += dS^T Q`` with ``dS = P * (dO V^T - delta)``.
* **dQ**: either ``dq_mode="atomic"`` (the same kernel adds ``dS K`` into an fp32 buffer with
  ``tl.atomic_add``, relaxed order: fewest FLOPs, not bitwise reproducible), or
  ``dq_mode="separate"`` (a dQ kernel over q tiles walks the forward-orientation block mask;
  deterministic, recomputes ``S`` and ``dP``). ``"auto"`` times both on the first call per shape
  and keeps the faster (:func:`choose_dq_mode`).
* **delta** = ``rowsum(dO * O)`` (minus ``dlse`` when the lse output gets a gradient): in separate
  mode it is fused into the dQ kernel, which runs first and stores delta for the dK/dV kernel; in
  atomic mode a small preprocessing kernel computes it and zeroes the fp32 dQ buffer in one pass.

A ``score_mod`` needs a gradient rule (:data:`SCORE_GRADIENTS`): ``alibi`` adds a constant (rule:
identity), ``softcap`` has ``d(c·tanh(x/c))/dx = 1 - (y/c)^2``. Others are rejected at call time.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import _tuning_cache
from ._launch import (LaunchPlans, LRUCache, fastest, interpreting, parallel_compiles, pipeline_scope,
                      pipeline_variants, replay_key)
from .attention_fwd import load_kv_tile, tile_descriptor, tma_compatible, validate_inputs
from .block_mask import BlockMask, block_mask_from_classes, build_block_mask
from .masks import MaskMod, ScoreMod, allow_all, alibi, launch_key, softcap

LOG2E = 1.4426950408889634

# dq_write values of the dK/dV kernel: ATOMIC (tl.atomic_add, relaxed), TMA (a tensor descriptor's
# atomic_add: the TMA unit's bulk reduce-add, cp.reduce.async.bulk.tensor, Hopper+) and RED (scalar
# inline-PTX red.global.add.f32 straight from the MMA layout, the report's inline-asm variant) are
# correct; NONE (separate mode; as a benchmark bound it also drops the dQ matmul), DISCARD (dQ
# computed, never written: the cost of the write alone) and STORE (racy, wrong) exist for
# scripts/bench_bwd_atomic.py.
DQ_NONE, DQ_ATOMIC, DQ_STORE, DQ_RED, DQ_DISCARD, DQ_TMA = 0, 1, 2, 3, 4, 5
DQ_WRITE_NAMES = {"none": DQ_NONE, "atomic": DQ_ATOMIC, "store": DQ_STORE, "red": DQ_RED, "discard": DQ_DISCARD,
                  "tma": DQ_TMA}


# ---------------------------------------------------------------------------------------------
# Gradient rules of the shipped score modifiers: d(loss)/d(score_in) from d(loss)/d(score_out).
# ---------------------------------------------------------------------------------------------

@triton.jit
def _alibi_grad(ds, score_out, b, h, q_idx, kv_idx, args):
    return ds


@triton.jit
def _softcap_grad(ds, score_out, b, h, q_idx, kv_idx, args):
    t = score_out / args[0]
    return ds * (1.0 - t * t)


# Keyed by the modifier's device function (shared by every instance of a factory), not its name.
SCORE_GRADIENTS = {
    alibi(torch.ones(1)).device_fn: _alibi_grad,
    softcap(1.0).device_fn: _softcap_grad,
}


def score_gradient(score_mod: ScoreMod | None):
    """The gradient rule for ``score_mod`` (None for no score_mod); a clear error if it has none."""
    if score_mod is None:
        return None
    if not isinstance(score_mod, ScoreMod):
        raise TypeError("attention backward: score_mod must come from tritonpatch.kernels (alibi(), softcap())")
    rule = SCORE_GRADIENTS.get(score_mod.device_fn)
    if rule is None:
        raise NotImplementedError(
            f"attention backward: score_mod {score_mod.name!r} has no gradient rule; the backward supports "
            "alibi() and softcap(). Register one in tritonpatch.kernels.attention_bwd.SCORE_GRADIENTS "
            "(a @triton.jit fn(ds, score_out, b, h, q_idx, kv_idx, args) -> ds_in), or detach the inputs")
    return rule


# ---------------------------------------------------------------------------------------------
# Transposed block mask: per kv block, the q blocks that are full / partial.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class TransposedBlockMask:
    """For every kv block, the partial and full q blocks (index tensors ``[Bm, Hm, NKV, NQ]``)."""

    q_num_blocks: torch.Tensor
    q_indices: torch.Tensor
    full_q_num_blocks: torch.Tensor
    full_q_indices: torch.Tensor
    block_m: int
    block_n: int


_transposed_cache = LRUCache(64)   # BlockMask.launch_key() -> its TransposedBlockMask


def transpose_block_mask(block_mask: BlockMask) -> TransposedBlockMask:
    """Swap the roles of q and kv blocks. Tiles crossing the end of the queries are demoted to
    partial (the dK/dV kernel's full-tile loop has no bounds checks). Cached per index tensors (by
    object and version: a custom op's per-call BlockMask over the same tensors hits, tensors written
    in place miss)."""
    key = block_mask.launch_key()
    cached = _transposed_cache.get(key)
    if cached is None:
        classes = block_mask.tile_classes().transpose(-1, -2)
        swapped = block_mask_from_classes(classes, block_mask.block_n, block_mask.block_m,
                                          block_mask.kv_len, block_mask.q_len)
        cached = TransposedBlockMask(swapped.kv_num_blocks, swapped.kv_indices, swapped.full_kv_num_blocks,
                                     swapped.full_kv_indices, block_mask.block_m, block_mask.block_n)
        _transposed_cache.put(key, cached)
    return cached


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------

@triton.jit
def _preprocess_kernel(O, DO, DELTA, DLSE, DQ_ACC,
                       stride_ob, stride_oh, stride_om, stride_od,
                       stride_dob, stride_doh, stride_dom, stride_dod,
                       stride_lb, stride_lh, stride_qab, stride_qah, stride_qam,
                       num_heads, q_len, HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr,
                       BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """delta = rowsum(dO * O) (- dlse); zeroes the fp32 dQ accumulator rows in the same pass."""
    bh = tl.program_id(1)
    b = bh // num_heads
    h = bh % num_heads
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < q_len
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=row_ok[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    row_off = b * stride_lb + h * stride_lh + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLSE + row_off, mask=row_ok, other=0.0)
    tl.store(DELTA + row_off, delta, mask=row_ok)
    if ZERO_DQ:
        tl.store(DQ_ACC + b * stride_qab + h * stride_qah + offs_m[:, None] * stride_qam + offs_d[None, :],
                 tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32), mask=row_ok[:, None])


@triton.jit
def _red_add_f32(pointers, values):
    """``*pointers += values`` by scalar inline-PTX ``red.global.add.f32`` (no layout conversion):
    the report's inline-asm variant, kept for scripts/bench_bwd_atomic.py."""
    tl.inline_asm_elementwise("red.global.add.f32 [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,f",
                              [pointers.to(tl.int64, bitcast=True), values], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_src, do_src, lse_src, delta_src, dq_src, stride_qm, stride_qd, stride_dom, stride_dod,
                stride_dqm, num_tiles, tile_ids, b, h, kv_idx, q_len, kv_len, sm_scale, qk_scale, mask_args, score_args,
                MASK_FN: tl.constexpr, SCORE_FN: tl.constexpr, SCORE_GRAD_FN: tl.constexpr, APPLY_MASK: tl.constexpr,
                HAS_SCORE: tl.constexpr, DQ_WRITE: tl.constexpr, USE_TMA: tl.constexpr, SUB_M: tl.constexpr,
                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Accumulate dK, dV of one kv tile over the q tiles ``tile_ids[:num_tiles]`` (each a mask block of
    ``SUB_M * BLOCK_M`` rows, walked ``BLOCK_M`` rows at a time). Works on transposed scores
    ``S^T [BLOCK_N, BLOCK_M]`` so that dK/dV accumulate without transposing the accumulators.
    With USE_TMA, q_src / do_src are 4-D tensor descriptors of all of Q / dO (the TMA unit
    zero-fills rows past the end); otherwise pointers to this (batch, head)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_col = kv_idx[:, None]
    for t in range(0, num_tiles * SUB_M):
        start_m = tl.load(tile_ids + t // SUB_M) * (SUB_M * BLOCK_M) + (t % SUB_M) * BLOCK_M
        q_rows = start_m + offs_m
        if USE_TMA:
            q = q_src.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
            do = do_src.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        else:
            q_ptrs = q_src + q_rows[:, None] * stride_qm + offs_d[None, :] * stride_qd
            do_ptrs = do_src + q_rows[:, None] * stride_dom + offs_d[None, :] * stride_dod
            if APPLY_MASK:
                q = tl.load(q_ptrs, mask=(q_rows < q_len)[:, None], other=0.0)
                do = tl.load(do_ptrs, mask=(q_rows < q_len)[:, None], other=0.0)
            else:
                q = tl.load(q_ptrs)
                do = tl.load(do_ptrs)
        if APPLY_MASK:
            lse = tl.load(lse_src + q_rows, mask=q_rows < q_len, other=0.0)
            delta = tl.load(delta_src + q_rows, mask=q_rows < q_len, other=0.0)
        else:
            lse = tl.load(lse_src + q_rows)
            delta = tl.load(delta_src + q_rows)
        s = tl.dot(k, tl.trans(q))                          # S^T [BLOCK_N, BLOCK_M], unscaled
        q_safe = tl.minimum(q_rows, q_len - 1)[None, :]
        if HAS_SCORE:
            s = SCORE_FN(s * sm_scale, b, h, q_safe, kv_col, score_args)
            p = tl.math.exp2(s * 1.4426950408889634 - (lse * 1.4426950408889634)[None, :])
        else:
            p = tl.math.exp2(s * qk_scale - (lse * 1.4426950408889634)[None, :])
        if APPLY_MASK:
            keep = MASK_FN(b, h, q_safe, tl.minimum(kv_col, kv_len - 1), mask_args)
            keep = keep & (q_rows < q_len)[None, :] & (kv_col < kv_len)
            p = tl.where(keep, p, 0.0)
        dv = tl.dot(p.to(do.dtype), do, dv)
        dp = tl.dot(v, tl.trans(do))                        # dP^T [BLOCK_N, BLOCK_M]
        ds = p * (dp - delta[None, :])
        if HAS_SCORE:
            ds = SCORE_GRAD_FN(ds, s, b, h, q_safe, kv_col, score_args)
        ds = ds.to(q.dtype)
        dk = tl.dot(ds, q, dk)
        if DQ_WRITE == 5:   # dq_src: a [B, H, S, D] descriptor; the TMA unit clips rows past the end
            dq = tl.dot(tl.trans(ds), k) * sm_scale
            dq_src.atomic_add([b, h, start_m, 0], dq.reshape(1, 1, BLOCK_M, HEAD_DIM))
        elif DQ_WRITE != 0:
            dq = tl.dot(tl.trans(ds), k) * sm_scale         # [BLOCK_M, HEAD_DIM] fp32
            dq_ptrs = dq_src + q_rows[:, None] * stride_dqm + offs_d[None, :]
            if DQ_WRITE == 4:
                if q_len < 0:                               # never true: keeps the dQ matmul alive
                    tl.store(dq_ptrs, dq)
            elif DQ_WRITE == 1:
                if APPLY_MASK:
                    tl.atomic_add(dq_ptrs, dq, mask=(q_rows < q_len)[:, None], sem="relaxed")
                else:
                    tl.atomic_add(dq_ptrs, dq, sem="relaxed")
            elif DQ_WRITE == 2:
                tl.store(dq_ptrs, dq, mask=(q_rows < q_len)[:, None])
            else:   # rows past the end add zero to the last row instead of writing out of bounds
                safe_ptrs = dq_src + tl.minimum(q_rows, q_len - 1)[:, None] * stride_dqm + offs_d[None, :]
                _red_add_f32(safe_ptrs, tl.where((q_rows < q_len)[:, None], dq, 0.0))
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(Q, K, V, DO, DK, DV, DQ_ACC, LSE, DELTA,
                          stride_qb, stride_qh, stride_qm, stride_qd,
                          stride_kb, stride_kh, stride_kn, stride_kd,
                          stride_vb, stride_vh, stride_vn, stride_vd,
                          stride_dob, stride_doh, stride_dom, stride_dod,
                          stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                          stride_qab, stride_qah, stride_qam,
                          stride_lb, stride_lh,
                          partial_num, partial_ids, full_num, full_ids,
                          stride_nb, stride_nh, stride_ib, stride_ih, stride_in,
                          num_heads, group_size, q_len, kv_len, sm_scale, qk_scale, mask_args, score_args,
                          MASK_FN: tl.constexpr, SCORE_FN: tl.constexpr, SCORE_GRAD_FN: tl.constexpr,
                          HAS_SCORE: tl.constexpr, DQ_WRITE: tl.constexpr, USE_TMA: tl.constexpr,
                          MASK_BLOCK_N: tl.constexpr, SUB_M: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One program per (kv tile, batch * kv head); loops over the ``group_size`` query heads (GQA).
    With USE_TMA, Q and DO are 4-D tensor descriptors (``[1, 1, BLOCK_M, HEAD_DIM]`` blocks)."""
    n_tile = tl.program_id(0)
    bkv = tl.program_id(1)
    kv_heads = num_heads // group_size
    b = bkv // kv_heads
    kv_h = bkv % kv_heads
    kv_idx = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_ok = (kv_idx < kv_len)[:, None]
    k = tl.load(K + b * stride_kb + kv_h * stride_kh + kv_idx[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=kv_ok, other=0.0)
    v = tl.load(V + b * stride_vb + kv_h * stride_vh + kv_idx[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=kv_ok, other=0.0)
    mask_block = (n_tile * BLOCK_N) // MASK_BLOCK_N
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for g in range(0, group_size):
        h = kv_h * group_size + g
        if USE_TMA:
            q_src = Q
            do_src = DO
        else:
            q_src = Q + b * stride_qb + h * stride_qh
            do_src = DO + b * stride_dob + h * stride_doh
        lse_src = LSE + b * stride_lb + h * stride_lh
        delta_src = DELTA + b * stride_lb + h * stride_lh
        if DQ_WRITE == 5:
            dq_src = DQ_ACC                                  # a tensor descriptor over all of dQ
        else:
            dq_src = DQ_ACC + b * stride_qab + h * stride_qah
        num_off = b * stride_nb + h * stride_nh + mask_block
        ids_off = b * stride_ib + h * stride_ih + mask_block * stride_in
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_src, do_src, lse_src, delta_src, dq_src, stride_qm, stride_qd,
                             stride_dom, stride_dod, stride_qam, tl.load(full_num + num_off), full_ids + ids_off,
                             b, h, kv_idx, q_len, kv_len, sm_scale, qk_scale, mask_args, score_args,
                             MASK_FN, SCORE_FN, SCORE_GRAD_FN, False, HAS_SCORE, DQ_WRITE, USE_TMA, SUB_M, BLOCK_M,
                             HEAD_DIM)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_src, do_src, lse_src, delta_src, dq_src, stride_qm, stride_qd,
                             stride_dom, stride_dod, stride_qam, tl.load(partial_num + num_off),
                             partial_ids + ids_off, b, h, kv_idx, q_len, kv_len, sm_scale, qk_scale, mask_args,
                             score_args, MASK_FN, SCORE_FN, SCORE_GRAD_FN, True, HAS_SCORE, DQ_WRITE, USE_TMA,
                             SUB_M, BLOCK_M, HEAD_DIM)
    out_off = b * stride_dkb + kv_h * stride_dkh + kv_idx[:, None] * stride_dkn + offs_d[None, :] * stride_dkd
    tl.store(DK + out_off, (dk * sm_scale).to(k.dtype), mask=kv_ok)
    tl.store(DV + out_off, dv.to(v.dtype), mask=kv_ok)


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd, num_tiles, tile_ids,
              b, h, kv_h, q_idx, kv_len, sm_scale, qk_scale, mask_args, score_args,
              MASK_FN: tl.constexpr, SCORE_FN: tl.constexpr, SCORE_GRAD_FN: tl.constexpr, APPLY_MASK: tl.constexpr,
              HAS_SCORE: tl.constexpr, USE_TMA: tl.constexpr, SUB_N: tl.constexpr, BLOCK_N: tl.constexpr,
              HEAD_DIM: tl.constexpr):
    """Accumulate dQ of one q tile over the kv tiles ``tile_ids[:num_tiles]`` (mask blocks of
    ``SUB_N * BLOCK_N`` keys, walked ``BLOCK_N`` at a time). K^T and V^T tiles come from
    :func:`load_kv_tile` (TMA descriptors or pointers, as in the forward)."""
    offs_n = tl.arange(0, BLOCK_N)
    for t in range(0, num_tiles * SUB_N):
        start_n = tl.load(tile_ids + t // SUB_N) * (SUB_N * BLOCK_N) + (t % SUB_N) * BLOCK_N
        kv_idx = start_n + offs_n
        kt, v = load_kv_tile(k_src, v_src, b, kv_h, start_n, kv_idx, kv_len, stride_kn, stride_kd, stride_vn,
                              stride_vd, APPLY_MASK, USE_TMA, BLOCK_N, HEAD_DIM)
        vt = tl.trans(v)
        s = tl.dot(q, kt)
        kv_safe = tl.minimum(kv_idx, kv_len - 1)[None, :]
        if HAS_SCORE:
            s = SCORE_FN(s * sm_scale, b, h, q_idx, kv_safe, score_args)
            p = tl.math.exp2(s * 1.4426950408889634 - lse2[:, None])
        else:
            p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if APPLY_MASK:
            keep = MASK_FN(b, h, q_idx, kv_safe, mask_args) & (kv_idx < kv_len)[None, :]
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, vt)
        ds = p * (dp - delta[:, None])
        if HAS_SCORE:
            ds = SCORE_GRAD_FN(ds, s, b, h, q_idx, kv_safe, score_args)
        dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(Q, K, V, O, DO, DQ, LSE, DELTA, DLSE,
                        stride_qb, stride_qh, stride_qm, stride_qd,
                        stride_kb, stride_kh, stride_kn, stride_kd,
                        stride_vb, stride_vh, stride_vn, stride_vd,
                        stride_ob, stride_oh, stride_om, stride_od,
                        stride_dob, stride_doh, stride_dom, stride_dod,
                        stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                        stride_lb, stride_lh,
                        partial_num, partial_ids, full_num, full_ids,
                        stride_nb, stride_nh, stride_ib, stride_ih, stride_iq,
                        num_heads, group_size, q_len, kv_len, sm_scale, qk_scale, mask_args, score_args,
                        MASK_FN: tl.constexpr, SCORE_FN: tl.constexpr, SCORE_GRAD_FN: tl.constexpr,
                        HAS_SCORE: tl.constexpr, HAS_DLSE: tl.constexpr, USE_TMA: tl.constexpr,
                        MASK_BLOCK_M: tl.constexpr, SUB_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        HEAD_DIM: tl.constexpr):
    """One program per (q tile, batch * head). Computes delta = rowsum(dO * O) (- dlse) itself and
    stores it for the dK/dV kernel that runs next (the fused preprocessing). With USE_TMA, K and V
    are 4-D tensor descriptors (``[1, 1, BLOCK_N, HEAD_DIM]`` blocks)."""
    m_tile = tl.num_programs(0) - 1 - tl.program_id(0)   # causal-like masks: heaviest tiles first
    bh = tl.program_id(1)
    b = bh // num_heads
    h = bh % num_heads
    kv_h = h // group_size
    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < q_len
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=row_ok[:, None], other=0.0)
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=row_ok[:, None], other=0.0)
    row_off = b * stride_lb + h * stride_lh + offs_m
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if HAS_DLSE:
        delta -= tl.load(DLSE + row_off, mask=row_ok, other=0.0)
    tl.store(DELTA + row_off, delta, mask=row_ok)
    lse2 = tl.load(LSE + row_off, mask=row_ok, other=0.0) * 1.4426950408889634
    q_idx = tl.minimum(offs_m, q_len - 1)[:, None]
    if USE_TMA:
        k_src = K
        v_src = V
    else:
        k_src = K + b * stride_kb + kv_h * stride_kh
        v_src = V + b * stride_vb + kv_h * stride_vh
    mask_block = (m_tile * BLOCK_M) // MASK_BLOCK_M
    num_off = b * stride_nb + h * stride_nh + mask_block
    ids_off = b * stride_ib + h * stride_ih + mask_block * stride_iq
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    dq = _dq_tiles(dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                   tl.load(full_num + num_off), full_ids + ids_off, b, h, kv_h, q_idx, kv_len, sm_scale, qk_scale,
                   mask_args, score_args, MASK_FN, SCORE_FN, SCORE_GRAD_FN, False, HAS_SCORE, USE_TMA, SUB_N, BLOCK_N,
                   HEAD_DIM)
    dq = _dq_tiles(dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                   tl.load(partial_num + num_off), partial_ids + ids_off, b, h, kv_h, q_idx, kv_len, sm_scale,
                   qk_scale, mask_args, score_args, MASK_FN, SCORE_FN, SCORE_GRAD_FN, True, HAS_SCORE, USE_TMA, SUB_N,
                   BLOCK_N, HEAD_DIM)
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             (dq * sm_scale).to(q.dtype), mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Configs and tuning
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch options of one backward kernel (block_m: q rows, block_n: keys)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    use_tma: bool = False   # the looped-over tiles (dK/dV: Q, dO; dQ: K, V) through TMA descriptors (Hopper+)
    pipeline: object = None   # a tritonpatch.Pipeline (None: Triton's defaults)
    pipeline_label: str = ""

    def label(self) -> str:
        tma = "-tma" if self.use_tma else ""
        pipe = f"+{self.pipeline_label}" if self.pipeline is not None else ""
        return f"BM{self.block_m}-BN{self.block_n}-w{self.num_warps}-s{self.num_stages}{tma}{pipe}"


# Hopper candidates. dK/dV: a wide kv tile (the accumulators) walked by narrow q steps; dQ: the
# mirror image. Timed on the first call per shape (plus disable-lsr on the first); kept small because
# every candidate compiles. Order and members from the H200 sweeps of scripts/bench_attention.py
# (--mode fwd_bwd --sweep; docs/history.md#attention-backward). All compile for sm_90 without register
# spills (ptxas -v) except at D=128 the dK/dV BM64-BN128 tile (FlexAttention's; 16-136 bytes) and the
# dQ BM128-BN128 tile (28 bytes), the fastest of the sweep all the same (by 15% and 3%).
_DKDV_CONFIGS = {
    64: [KernelConfig(64, 64, 4, 2, use_tma=True), KernelConfig(64, 64, 4, 2), KernelConfig(32, 64, 4, 3)],
    128: [KernelConfig(64, 128, 8, 3), KernelConfig(64, 128, 8, 2), KernelConfig(32, 128, 8, 2)],
}
_DQ_CONFIGS = {
    64: [KernelConfig(64, 64, 4, 3, use_tma=True), KernelConfig(64, 64, 4, 2), KernelConfig(128, 64, 8, 2)],
    128: [KernelConfig(128, 128, 8, 2, use_tma=True), KernelConfig(128, 64, 8, 3, use_tma=True),
          KernelConfig(128, 64, 8, 2, use_tma=True)],
}
_INTERPRETER_DKDV = KernelConfig(16, 32, 4, 1)
_INTERPRETER_DQ = KernelConfig(32, 16, 4, 1)
_PREPROCESS_BLOCK_M = 64


def candidate_configs(kernel: str, head_dim: int, device: torch.device) -> list:
    """Configs the tuner tries for ``kernel`` ("dkdv" or "dq")."""
    if device.type == "cpu":
        return [_INTERPRETER_DKDV if kernel == "dkdv" else _INTERPRETER_DQ]
    table = _DKDV_CONFIGS if kernel == "dkdv" else _DQ_CONFIGS
    configs = list(table.get(head_dim) or [KernelConfig(32, 64, 4, 2)])
    if torch.cuda.get_device_capability(device)[0] < 9:   # TMA descriptors need Hopper or newer
        configs = [c for c in configs if not c.use_tma] or [KernelConfig(32, 64, 4, 2)]
    return configs + pipeline_variants(configs[:1])


def _fitting(configs: list, block_mask: BlockMask | None) -> list:
    """Configs whose tiles subdivide the given block mask's tiles (all of them without one)."""
    if block_mask is None:
        return configs
    fit = [c for c in configs if block_mask.block_m % c.block_m == 0 and block_mask.block_n % c.block_n == 0]
    if fit:
        return fit
    base = configs[0]
    return [KernelConfig(math.gcd(block_mask.block_m, base.block_m), math.gcd(block_mask.block_n, base.block_n),
                         base.num_warps, base.num_stages)]


# ---------------------------------------------------------------------------------------------
# dq_mode selection
# ---------------------------------------------------------------------------------------------

DQ_MODES = ("auto", "atomic", "separate")


def choose_dq_mode(dq_mode: str) -> str:
    """Validate ``dq_mode`` and apply torch's determinism switch: with
    ``torch.use_deterministic_algorithms(True)`` ``"auto"`` becomes ``"separate"`` and an explicit
    ``"atomic"`` is an error. ``"auto"`` otherwise stays ``"auto"``: the tuner times both modes on
    the first call per shape and keeps the faster (on H200, D=64 causal, they were within 2% of
    each other from N=4096 up: docs/benchmarks/attention_bwd.md)."""
    if dq_mode not in DQ_MODES:
        raise ValueError(f"attention backward: dq_mode must be one of {DQ_MODES}, got {dq_mode!r}")
    if torch.are_deterministic_algorithms_enabled():
        if dq_mode == "atomic":
            raise RuntimeError("attention backward: dq_mode='atomic' accumulates dQ with floating-point atomics "
                               "and is not deterministic, but torch.use_deterministic_algorithms(True) is on; use "
                               "dq_mode='separate' or 'auto'")
        return "separate"
    return dq_mode


# ---------------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------------

def _expanded(num: torch.Tensor, ids: torch.Tensor, batch: int, heads: int):
    expand = (batch, heads, num.shape[-1])
    return num.expand(expand), ids.expand(expand + (ids.shape[-1],))


def _tile_list_args(partial_num, partial_ids, full_num, full_ids, q, k, mask_mod, score_mod, scale) -> tuple:
    """The arguments both backward kernels take after their tensors' strides: the tile lists (expanded
    to ``[B, H, ...]``) and their strides, sizes, scales and the modifiers' runtime arguments."""
    batch, heads, q_len = q.shape[:3]
    kv_heads, kv_len = k.shape[1], k.shape[2]
    partial_num, partial_ids = _expanded(partial_num, partial_ids, batch, heads)
    full_num, full_ids = _expanded(full_num, full_ids, batch, heads)
    return (partial_num, partial_ids, full_num, full_ids,
            partial_num.stride(0), partial_num.stride(1), partial_ids.stride(0), partial_ids.stride(1),
            partial_ids.stride(2),
            heads, heads // kv_heads, q_len, kv_len, scale, scale * LOG2E,
            mask_mod.args, score_mod.args if score_mod is not None else ())


def _modifier_constexprs(mask_mod: MaskMod, score_mod: ScoreMod | None) -> dict:
    return dict(MASK_FN=mask_mod.device_fn, SCORE_FN=score_mod.device_fn if score_mod is not None else None,
                SCORE_GRAD_FN=score_gradient(score_mod), HAS_SCORE=score_mod is not None)


# The launchers below replay the launch recorded under (plan_key, kernel, config) when there is one
# (see LaunchPlans; plan_key comes from attention_backward's call key), else build the arguments.
_PLANS = LaunchPlans()


def _launch_preprocess(out, dout, delta, dlse, dq_acc, plan_key=None):
    tensors = (out, dout, delta, dlse, dq_acc)
    key = None if plan_key is None else (plan_key, "preprocess", dq_acc is not None)
    if _PLANS.replay(key, tensors):
        return
    batch, heads, q_len, head_dim = out.shape
    zero = dq_acc is not None
    acc = dq_acc if zero else delta   # unused pointer when not zeroing
    acc_strides = dq_acc.stride()[:3] if zero else (0, 0, 0)
    grid = (triton.cdiv(q_len, _PREPROCESS_BLOCK_M), batch * heads)
    args = (out, dout, delta, dlse if dlse is not None else delta, acc,
            *out.stride(), *dout.stride(), delta.stride(0), delta.stride(1), *acc_strides, heads, q_len)
    kwargs = dict(HAS_DLSE=dlse is not None, ZERO_DQ=zero, BLOCK_M=_PREPROCESS_BLOCK_M, HEAD_DIM=head_dim,
                  num_warps=4)
    _PLANS.launch(key, _preprocess_kernel, grid, args, kwargs, tensors)


def _launch_dkdv(q, k, v, dout, dk, dv, dq_acc, lse, delta, tmask: TransposedBlockMask, mask_mod, score_mod,
                 scale, config: KernelConfig, dq_write: int, warmup: bool = False, plan_key=None):
    tensors = (q, k, v, dout, dk, dv, dq_acc, lse, delta)
    key = None if plan_key is None else (plan_key, "dkdv", config, dq_write)
    if not warmup and _PLANS.replay(key, tensors):
        return
    acc = dq_acc if dq_acc is not None else delta   # never written when dq_write == DQ_NONE
    if dq_write == DQ_TMA:
        acc = tile_descriptor(dq_acc, config.block_m)
    acc_strides = dq_acc.stride()[:3] if dq_acc is not None else (0, 0, 0)
    q_in, dout_in = ((tile_descriptor(q, config.block_m), tile_descriptor(dout, config.block_m)) if config.use_tma
                     else (q, dout))
    args = (q_in, k, v, dout_in, dk, dv, acc, lse, delta,
            *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *acc_strides,
            lse.stride(0), lse.stride(1),
            *_tile_list_args(tmask.q_num_blocks, tmask.q_indices, tmask.full_q_num_blocks, tmask.full_q_indices,
                             q, k, mask_mod, score_mod, scale))
    kwargs = dict(_modifier_constexprs(mask_mod, score_mod), DQ_WRITE=dq_write, USE_TMA=config.use_tma,
                  MASK_BLOCK_N=tmask.block_n, SUB_M=tmask.block_m // config.block_m, BLOCK_M=config.block_m,
                  BLOCK_N=config.block_n, HEAD_DIM=q.shape[-1], num_warps=config.num_warps,
                  num_stages=config.num_stages)
    grid = (triton.cdiv(k.shape[2], config.block_n), q.shape[0] * k.shape[1])
    with pipeline_scope(config.pipeline):
        _PLANS.launch(key, _attn_bwd_dkdv_kernel, grid, args, kwargs, tensors, warmup)


def _launch_dq(q, k, v, out, dout, dq, lse, delta, dlse, block_mask: BlockMask, mask_mod, score_mod, scale,
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
            *_tile_list_args(block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks,
                             block_mask.full_kv_indices, q, k, mask_mod, score_mod, scale))
    kwargs = dict(_modifier_constexprs(mask_mod, score_mod), HAS_DLSE=dlse is not None, USE_TMA=config.use_tma,
                  MASK_BLOCK_M=block_mask.block_m, SUB_N=block_mask.block_n // config.block_n,
                  BLOCK_M=config.block_m, BLOCK_N=config.block_n, HEAD_DIM=q.shape[-1], num_warps=config.num_warps,
                  num_stages=config.num_stages)
    grid = (triton.cdiv(q.shape[2], config.block_m), q.shape[0] * q.shape[1])
    with pipeline_scope(config.pipeline):
        _PLANS.launch(key, _attn_bwd_dq_kernel, grid, args, kwargs, tensors, warmup)


@dataclass(frozen=True)
class BwdConfig:
    """The backward's resolved choices: dq mode and the two kernels' configs (dq: separate mode only)."""

    dq_mode: str
    dkdv: KernelConfig
    dq: KernelConfig | None = None

    def label(self) -> str:
        dq = f" dq[{self.dq.label()}]" if self.dq is not None else ""
        return f"{self.dq_mode}: dkdv[{self.dkdv.label()}]{dq}"


_tuned: dict = {}


def tuned_configs() -> dict:
    """The winning backward configs per tuning key so far (for benchmarks and reports)."""
    return dict(_tuned)


def _tuning_key(q, k, mask_mod, score_mod, block_mask, dq_mode, tma_ok: bool) -> tuple:
    return (tuple(q.shape), tuple(k.shape), q.dtype, str(q.device), tma_ok, mask_mod.structure,
            None if score_mod is None else score_mod.name,
            None if block_mask is None else (block_mask.block_m, block_mask.block_n), dq_mode)


def tuned_config(q, k, *, v=None, dout=None, mask_mod: MaskMod | None = None, score_mod: ScoreMod | None = None,
                 block_mask: BlockMask | None = None, dq_mode: str = "atomic") -> BwdConfig | None:
    """The config the tuner picked for these inputs and (resolved) ``dq_mode``; None before the first call.
    ``v``, ``dout``: needed only when they may not be TMA-compatible while ``q``, ``k`` are."""
    mask_mod = allow_all() if mask_mod is None else mask_mod
    tma_ok = tma_compatible(*(t for t in (q, k, v, dout) if t is not None))
    return _tuned.get(_tuning_key(q, k, mask_mod, score_mod, block_mask, dq_mode, tma_ok))


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def attention_backward(q, k, v, out, lse, dout, *, dlse=None, mask_mod: MaskMod | None = None,
                       score_mod: ScoreMod | None = None, block_mask: BlockMask | None = None,
                       scale: float | None = None, enable_gqa: bool = False, dq_mode: str = "auto",
                       config: BwdConfig | None = None, dq_write: str = "atomic"):
    """Gradients ``(dq, dk, dv)`` of :func:`tritonpatch.kernels.attention` given its ``out`` and
    natural-log ``lse`` and the output gradient ``dout`` (``dlse``: optional gradient of ``lse``).

    ``dq_mode``: ``"atomic"``, ``"separate"`` (deterministic) or ``"auto"`` (the faster, timed per
    shape; see :func:`choose_dq_mode`).
    ``config``: fixed :class:`BwdConfig` (None tunes once per shape). ``dq_write`` is for
    ``scripts/bench_bwd_atomic.py``: in atomic mode ``"red"`` adds dQ with scalar inline-PTX
    ``red.global.add.f32`` (correct); ``"none"``, ``"discard"`` and ``"store"`` give a
    **wrong dq** (no dQ matmul; dQ computed but not written; racy plain stores).

    As in the forward, a call with the key of an earlier one skips the checks and the tuner lookup
    and replays the earlier call's launches with its own tensors."""
    key = _call_key(q, k, v, out, lse, dout, dlse, mask_mod, score_mod, block_mask, scale, enable_gqa, dq_mode,
                    config, dq_write)
    resolved = _resolved_calls.get(key) if key is not None else None
    if resolved is None:
        resolved = _resolve(q, k, v, out, lse, dout, dlse, mask_mod, score_mod, block_mask, scale, enable_gqa,
                            dq_mode, config, dq_write, key)
        if key is not None:
            _resolved_calls.put(key, resolved)
    config, masks_for, mask_mod, scale = resolved
    q, k, v, out, dout = (_contiguous(t) for t in (q, k, v, out, dout))
    lse = lse.contiguous()
    dlse = dlse.contiguous() if dlse is not None else None
    buffers = _Buffers(q, k, v, out, dout, lse, dlse, mask_mod, score_mod, scale, masks_for, plan_key=key)
    dq = _run(buffers, config, DQ_WRITE_NAMES[dq_write])
    return dq, buffers.dk, buffers.dv


_resolved_calls = LRUCache(64)   # replay key -> (config, masks_for, mask_mod, scale) of a checked call


def _call_key(q, k, v, out, lse, dout, dlse, mask_mod, score_mod, block_mask, scale, enable_gqa, dq_mode, config,
              dq_write):
    """The replay key of a backward call (:func:`replay_key`); None where the checks would reject the
    arguments or where the call copies an input (a replay would pass the copy it recorded)."""
    tensors = (q, k, v, out, lse, dout, dlse)
    if not (all(isinstance(t, torch.Tensor) for t in tensors if t is not None) and isinstance(lse, torch.Tensor)
            and isinstance(mask_mod, (MaskMod, type(None))) and isinstance(score_mod, (ScoreMod, type(None)))
            and isinstance(block_mask, (BlockMask, type(None)))):
        return None
    if any(t.stride(-1) != 1 for t in (q, k, v, out, dout)) or not lse.is_contiguous() \
            or (dlse is not None and not dlse.is_contiguous()):
        return None
    return replay_key(tensors, launch_key(mask_mod), launch_key(score_mod),
                      None if block_mask is None else block_mask.launch_key(), scale, enable_gqa, dq_mode,
                      config, dq_write, torch.are_deterministic_algorithms_enabled())


def _resolve(q, k, v, out, lse, dout, dlse, mask_mod, score_mod, block_mask, scale, enable_gqa, dq_mode, config,
             dq_write, key=None):
    """Check a backward call and settle what it runs: ``(config, masks_for, mask_mod, scale)``;
    ``masks_for(kernel_config)`` keeps the block masks it builds. ``key``: the call's replay key (the
    tuner times replayed launches, as the forward's)."""
    validate_inputs(q, k, v, enable_gqa)
    batch, heads, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    mask_mod = allow_all() if mask_mod is None else mask_mod
    if not isinstance(mask_mod, MaskMod):
        raise TypeError("attention backward: mask_mod must come from tritonpatch.kernels masks (causal(), ...)")
    score_gradient(score_mod)   # rejects a score_mod without a gradient rule before any work
    for modifier in (mask_mod, score_mod):
        if modifier is not None:
            modifier.check_problem(batch, heads, q_len, kv_len, q.device)
    if dq_write not in DQ_WRITE_NAMES:
        raise ValueError(f"attention backward: dq_write must be one of {sorted(DQ_WRITE_NAMES)}, got {dq_write!r}")
    for name, t, shape in (("out", out, q.shape), ("dout", dout, q.shape)):
        if tuple(t.shape) != tuple(q.shape) or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"attention backward: {name} must match q ({tuple(shape)}, {q.dtype}, {q.device}); "
                             f"got {tuple(t.shape)}, {t.dtype}, {t.device}")
    for name, t in (("lse", lse), ("dlse", dlse)):
        if t is not None and (tuple(t.shape) != (batch, heads, q_len) or t.dtype != torch.float32):
            raise ValueError(f"attention backward: {name} must be float32 of shape {(batch, heads, q_len)}, got "
                             f"{t.dtype} {tuple(t.shape)}")
    if block_mask is not None and (block_mask.q_len, block_mask.kv_len) != (q_len, kv_len):
        raise ValueError(f"attention backward: block_mask was built for (Sq, Skv) = ({block_mask.q_len}, "
                         f"{block_mask.kv_len}), inputs have ({q_len}, {kv_len})")
    if config is not None and config.dq_mode == "atomic" and torch.are_deterministic_algorithms_enabled():
        choose_dq_mode("atomic")   # raises the determinism error
    uses_tma = config is not None and any(c is not None and c.use_tma for c in (config.dkdv, config.dq))
    if uses_tma and not tma_compatible(*(_contiguous(t) for t in (q, k, v, dout))):
        raise ValueError(f"attention backward: config {config.label()} loads tiles through TMA, which needs "
                         "16-byte aligned base addresses and strides; use a config without use_tma")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    masks = {}

    def masks_for(kernel_config: KernelConfig) -> BlockMask:
        tiles = (kernel_config.block_m, kernel_config.block_n)
        if tiles not in masks:
            masks[tiles] = block_mask if block_mask is not None else build_block_mask(
                mask_mod, batch, heads, q_len, kv_len, block_m=tiles[0], block_n=tiles[1], device=q.device)
        return masks[tiles]

    if config is None:
        q, k, v, out, dout = (_contiguous(t) for t in (q, k, v, out, dout))
        buffers = _Buffers(q, k, v, out, dout, lse.contiguous(), dlse.contiguous() if dlse is not None else None,
                           mask_mod, score_mod, scale, masks_for, plan_key=key)   # time replayed launches
        config = _tune(buffers, block_mask, choose_dq_mode(dq_mode))
    return config, masks_for, mask_mod, scale


class _Buffers:
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

    def dkdv(self, config: KernelConfig, dq_acc, dq_write: int, warmup: bool = False):
        _launch_dkdv(self.q, self.k, self.v, self.dout, self.dk, self.dv, dq_acc, self.lse, self.delta,
                     transpose_block_mask(self.masks_for(config)), self.mask_mod, self.score_mod, self.scale, config,
                     dq_write, warmup, self.plan_key)

    def dq(self, config: KernelConfig, dq, warmup: bool = False):
        _launch_dq(self.q, self.k, self.v, self.out, self.dout, dq, self.lse, self.delta, self.dlse,
                   self.masks_for(config), self.mask_mod, self.score_mod, self.scale, config, warmup, self.plan_key)


def _run(buf: _Buffers, config: BwdConfig, dq_write: int) -> torch.Tensor:
    """One backward with a resolved config; fills buf.dk/buf.dv and returns dq."""
    if config.dq_mode == "atomic":
        dq_acc = torch.empty(buf.q.shape, dtype=torch.float32, device=buf.q.device)
        _launch_preprocess(buf.out, buf.dout, buf.delta, buf.dlse, dq_acc, buf.plan_key)   # delta; zeroes dq_acc
        buf.dkdv(config.dkdv, dq_acc, dq_write)
        return dq_acc.to(buf.q.dtype)
    dq = torch.empty_like(buf.q, memory_format=torch.contiguous_format)
    buf.dq(config.dq, dq)                                                    # also computes delta
    buf.dkdv(config.dkdv, None, DQ_NONE)
    return dq


def _tune(buf: _Buffers, block_mask, dq_mode: str, precompile: bool = True) -> BwdConfig:
    """The fastest config for this shape and ``dq_mode``; for ``"auto"`` the faster of the tuned
    atomic and separate configs, timed end to end (the interpreter, which times nothing, takes
    separate). Cached per tuning key, in memory and (for the shipped modifiers) on disk.
    ``precompile=False``: the caller has compiled the candidates already ("auto", for both modes)."""
    key = _tuning_key(buf.q, buf.k, buf.mask_mod, buf.score_mod, block_mask, dq_mode, buf.tma_ok)
    if key in _tuned:
        return _tuned[key]
    disk_key = None if interpreting() else _tuning_cache.tuning_key(
        "attention_bwd", buf.q, buf.k, buf.mask_mod, buf.score_mod, block_mask, dq_mode=dq_mode, tma=buf.tma_ok,
        code=[kernel.cache_key for kernel in (_attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel, _preprocess_kernel)])
    config = _stored_config(_tuning_cache.lookup(disk_key), buf, block_mask)
    if config is None:
        if precompile:
            _compile_candidates(buf, block_mask, ("separate", "atomic") if dq_mode == "auto" else (dq_mode,))
        if dq_mode == "auto":
            configs = [_tune(buf, block_mask, mode, precompile=False) for mode in ("separate", "atomic")]
            config = fastest(configs, lambda c: _run(buf, c, DQ_ATOMIC), "attention backward")
        else:
            config = _tune_mode(buf, block_mask, dq_mode)
        _tuning_cache.remember(disk_key, {"dq_mode": config.dq_mode, "dkdv": config.dkdv.label(),
                                          "dq": config.dq.label() if config.dq is not None else None})
    _tuned[key] = config
    return config


def _stored_config(decision: dict | None, buf: _Buffers, block_mask) -> BwdConfig | None:
    """A decision from the disk cache as a BwdConfig, if its configs are still candidates."""
    if not decision:
        return None
    dkdv = _tuning_cache.by_label(_candidates(buf, block_mask, "dkdv"), decision.get("dkdv"))
    if dkdv is None:
        return None
    if decision.get("dq_mode") == "atomic":
        return BwdConfig("atomic", dkdv)
    dq = _tuning_cache.by_label(_candidates(buf, block_mask, "dq"), decision.get("dq"))
    return BwdConfig("separate", dkdv, dq) if decision.get("dq_mode") == "separate" and dq is not None else None


def _candidates(buf: _Buffers, block_mask, kernel: str) -> list:
    """The configs the tuner times for ``kernel`` on these inputs."""
    configs = candidate_configs(kernel, buf.q.shape[-1], buf.q.device)
    return _fitting([c for c in configs if buf.tma_ok or not c.use_tma], block_mask)


def _compile_candidates(buf: _Buffers, block_mask, dq_modes: tuple) -> None:
    """Compile every kernel the tuner is about to time for ``dq_modes``, in parallel."""
    if interpreting():
        return
    dq_acc = torch.empty(buf.q.shape, dtype=torch.float32, device=buf.q.device) if "atomic" in dq_modes else None
    with parallel_compiles():
        for mode in dq_modes:
            for config in _candidates(buf, block_mask, "dkdv"):
                buf.dkdv(config, dq_acc if mode == "atomic" else None, DQ_ATOMIC if mode == "atomic" else DQ_NONE,
                         warmup=True)
        if "separate" in dq_modes:
            dq = torch.empty_like(buf.q, memory_format=torch.contiguous_format)
            for config in _candidates(buf, block_mask, "dq"):
                buf.dq(config, dq, warmup=True)


def _tune_mode(buf: _Buffers, block_mask, dq_mode: str) -> BwdConfig:
    dkdv_candidates = _candidates(buf, block_mask, "dkdv")
    what = "attention backward"
    if dq_mode == "atomic":
        dq_acc = torch.zeros(buf.q.shape, dtype=torch.float32, device=buf.q.device)
        _launch_preprocess(buf.out, buf.dout, buf.delta, buf.dlse, None)
        return BwdConfig("atomic", fastest(dkdv_candidates, lambda c: buf.dkdv(c, dq_acc, DQ_ATOMIC), what))
    dq = torch.empty_like(buf.q, memory_format=torch.contiguous_format)   # as _run allocates it
    best_dq = fastest(_candidates(buf, block_mask, "dq"), lambda c: buf.dq(c, dq), what)
    return BwdConfig("separate", fastest(dkdv_candidates, lambda c: buf.dkdv(c, None, DQ_NONE), what), best_dq)


# ---------------------------------------------------------------------------------------------
# Compile-only descriptions (tritonpatch.targets.compile_for_target, tests, inspection)
# ---------------------------------------------------------------------------------------------

_ELEMENT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _arg_type(arg) -> str:
    if isinstance(arg, torch.Tensor):
        return "*" + {torch.int32: "i32", torch.int64: "i64", torch.float32: "fp32"}[arg.dtype]
    return "i32" if isinstance(arg, int) and not isinstance(arg, bool) else "fp32"


def compile_spec(kernel: str, dtype: torch.dtype, head_dim: int, config: KernelConfig, mask_mod: MaskMod,
                 score_mod: ScoreMod | None = None, *, dq_write: str = "atomic", mask_tile: tuple | None = None):
    """``(fn, signature, constexprs, attrs)`` of the ``"dkdv"`` or ``"dq"`` kernel for compile-only use:
    contiguous last dims, and ``attrs`` marking what a launch on ``[B, H, S, D]`` tensors with S a
    multiple of 16 specializes as 16-divisible (pointers, row/head/batch strides, lengths), which is
    what lets ``tl.atomic_add`` vectorize. ``mask_tile``: the block mask's ``(block_m, block_n)``."""
    mask_m, mask_n = mask_tile or (config.block_m, config.block_n)
    elem = _ELEMENT[dtype]
    if kernel == "dkdv":
        fn = _attn_bwd_dkdv_kernel
        pointers = {"Q": elem, "K": elem, "V": elem, "DO": elem, "DK": elem, "DV": elem, "DQ_ACC": "fp32",
                    "LSE": "fp32", "DELTA": "fp32"}
        groups = ["q", "k", "v", "do", "dk"]
        extra = ["stride_qab", "stride_qah", "stride_qam", "stride_in"]
        specific = {"DQ_WRITE": DQ_WRITE_NAMES[dq_write], "MASK_BLOCK_N": mask_n, "SUB_M": mask_m // config.block_m}
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
    if kernel == "dkdv" and dq_write == "tma":
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
                      "mask_args": tuple(_arg_type(a) for a in mask_mod.args),
                      "score_args": tuple(_arg_type(a) for a in score_mod.args) if score_mod is not None else ()})
    constexprs.update(specific)
    constexprs.update(_modifier_constexprs(mask_mod, score_mod), USE_TMA=config.use_tma, BLOCK_M=config.block_m,
                      BLOCK_N=config.block_n, HEAD_DIM=head_dim)
    for name in constexprs:
        signature[name] = "constexpr"
    params = fn.arg_names
    aligned = [i for i, name in enumerate(params) if str(signature[name]).startswith("*")
               or (name.startswith("stride_") and name[-1] in "bhmn" and name != "stride_in")
               or name in ("q_len", "kv_len")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    return fn, signature, constexprs, attrs
