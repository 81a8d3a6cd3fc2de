"""The block-sparse attention backward in Triton (device code only).

Given the forward's output ``O`` and natural-log log-sum-exp ``lse`` (fp32, ``[B, H, Sq]``):

* **dK/dV kernel**, one program per (kv tile, batch, kv head). It walks the q tiles of the
  *transposed* block mask (for its kv block: full q blocks without mask work, partial ones with it,
  empty ones never) and, for GQA, every query head of its group, so dK/dV are reduced across the
  shared heads in registers. Per q tile it recomputes ``P^T = exp(S^T - lse)`` and accumulates
  ``dV += P^T dO`` and ``dK += dS^T Q`` with ``dS = P * (dO V^T - delta)``. In ``dq_mode="atomic"``
  it also computes the tile's ``dQ = dS K`` and hands it to ``DQ_ADD`` (:mod:`.dq_adds`), which adds
  it into an fp32 buffer.
* **dQ kernel** (``dq_mode="separate"``, deterministic): one program per q tile walks the
  forward-orientation block mask and recomputes ``S`` and ``dP``; it also computes delta.
* **preprocess** (atomic mode): delta = ``rowsum(dO * O)`` (minus ``dlse``) and the zeroed fp32 dQ
  buffer in one pass.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..fwd.kernels import load_kv_tile


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
def _dkdv_tiles(dk, dv, k, v, q_src, do_src, lse_src, delta_src, dq_acc, stride_qm, stride_qd, stride_dom, stride_dod,
                stride_dqb, stride_dqh, stride_dqm, num_tiles, tile_ids, b, h, kv_idx, q_len, kv_len, sm_scale,
                qk_scale, mask_args, score_args, MASK_FN: tl.constexpr, SCORE_FN: tl.constexpr,
                SCORE_GRAD_FN: tl.constexpr, APPLY_MASK: tl.constexpr, HAS_SCORE: tl.constexpr, DQ_ADD: tl.constexpr, ADD_DQ: tl.constexpr,
                USE_TMA: tl.constexpr, SUB_M: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Accumulate dK, dV of one kv tile over the q tiles ``tile_ids[:num_tiles]`` (each a mask block of
    ``SUB_M * BLOCK_M`` rows, walked ``BLOCK_M`` rows at a time). Works on transposed scores
    ``S^T [BLOCK_N, BLOCK_M]`` so that dK/dV accumulate without transposing the accumulators.
    With USE_TMA, q_src / do_src are 4-D tensor descriptors of all of Q / dO (the TMA unit
    zero-fills rows past the end); otherwise pointers to this (batch, head). With ADD_DQ, each q tile's
    ``dQ = dS K`` goes to ``DQ_ADD`` with the accumulator ``dq_acc`` (all of dQ) and its strides."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_col = tl.minimum(kv_idx, kv_len - 1)[:, None]    # what the modifiers see: no key past the end
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
            keep = MASK_FN(b, h, q_safe, kv_col, mask_args)
            keep = keep & (q_rows < q_len)[None, :] & (kv_idx < kv_len)[:, None]
            p = tl.where(keep, p, 0.0)
        dv = tl.dot(p.to(do.dtype), do, dv)
        dp = tl.dot(v, tl.trans(do))                        # dP^T [BLOCK_N, BLOCK_M]
        ds = p * (dp - delta[None, :])
        if HAS_SCORE:
            ds = SCORE_GRAD_FN(ds, s, b, h, q_safe, kv_col, score_args)
        ds = ds.to(q.dtype)
        dk = tl.dot(ds, q, dk)
        if ADD_DQ:
            dq = tl.dot(tl.trans(ds), k) * sm_scale         # [BLOCK_M, HEAD_DIM] fp32
            DQ_ADD(dq_acc, dq, b, h, start_m, q_rows, q_len, stride_dqb, stride_dqh, stride_dqm, APPLY_MASK, BLOCK_M,
                   HEAD_DIM)
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
                          HAS_SCORE: tl.constexpr, DQ_ADD: tl.constexpr, ADD_DQ: tl.constexpr, USE_TMA: tl.constexpr,
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
        num_off = b * stride_nb + h * stride_nh + mask_block
        ids_off = b * stride_ib + h * stride_ih + mask_block * stride_in
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_src, do_src, lse_src, delta_src, DQ_ACC, stride_qm, stride_qd,
                             stride_dom, stride_dod, stride_qab, stride_qah, stride_qam, tl.load(full_num + num_off),
                             full_ids + ids_off, b, h, kv_idx, q_len, kv_len, sm_scale, qk_scale, mask_args,
                             score_args, MASK_FN, SCORE_FN, SCORE_GRAD_FN, False, HAS_SCORE, DQ_ADD, ADD_DQ, USE_TMA,
                             SUB_M, BLOCK_M, HEAD_DIM)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_src, do_src, lse_src, delta_src, DQ_ACC, stride_qm, stride_qd,
                             stride_dom, stride_dod, stride_qab, stride_qah, stride_qam,
                             tl.load(partial_num + num_off), partial_ids + ids_off, b, h, kv_idx, q_len, kv_len,
                             sm_scale, qk_scale, mask_args, score_args, MASK_FN, SCORE_FN, SCORE_GRAD_FN, True,
                             HAS_SCORE, DQ_ADD, ADD_DQ, USE_TMA, SUB_M, BLOCK_M, HEAD_DIM)
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
