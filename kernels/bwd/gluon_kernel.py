"""The block-sparse attention backward's dK/dV kernel in Gluon for Hopper (sm_90a), in
FlashAttention-3's shape (device code only).

One program per (kv block of ``NUM_WG`` x 64 keys, batch * kv head). It walks the q tiles of the
*transposed* block mask (full tiles without mask work, partial ones with it, empty ones never) of
every query head of its GQA group, ``BLOCK_M`` query rows at a time. The program is warp-specialized:

* a 1-warp **loader** brings K and V of the block once, then Q and dO of every q tile into a ring of
  ``STAGES`` shared buffers with ready / empty mbarriers;
* ``NUM_WG`` **consumer warpgroups** (4 warps each) own 64 keys each and keep their dK and dV in
  registers. Per q tile a consumer issues ``S^T = K_w Q^T`` and ``dP^T = V_w dO^T`` as asynchronous
  wgmma, turns S^T into ``P^T = exp2(S^T scale - lse)`` (masked in partial tiles) while dP^T runs,
  then issues ``dV += P^T dO`` and ``dK += dS^T Q`` with P^T and ``dS^T = P^T (dP^T - delta)``
  straight from registers. With ``ADD_DQ`` it also writes its dS^T into shared memory; once every
  consumer has, each computes ``dQ = dS K`` for its share of the head dim (``HEAD_DIM / NUM_WG``
  columns over all keys of the block) into a shared fp32 dQ tile;
* a 1-warp **dQ writer** adds each finished dQ tile into the fp32 dQ accumulator with the TMA unit's
  bulk reduce-add (``cp.reduce.async.bulk.tensor``), off the consumers' path.

Scores are recomputed in base 2 from the forward's natural-log lse; dK is scaled once at the end and
dQ leaves scaled, as in :mod:`.kernels`' Triton-language kernel, so the backward's other kernels
(preprocess, the separate-mode dQ kernel) serve both.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .._runtime.gluon_compat import tma_load, tma_reduce_add
from .configs import GLUON_WG_KEYS, GLUON_WORKER_REGISTERS

WG_KEYS = gl.constexpr(GLUON_WG_KEYS)   # keys per consumer warpgroup (one wgmma M)
WORKER_REGS = gl.constexpr(GLUON_WORKER_REGISTERS)
LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _head_tiles(g, b, kv_h, group_size, n_block, partial_num, partial_ids, full_num, full_ids,
                stride_nb, stride_nh, stride_ib, stride_ih, stride_in, SUB_M: gl.constexpr):
    """Query head number ``g`` of the group and its walk over this kv block: ``(h, steps_full,
    steps_all, full_ids, partial_ids)``, steps counted in ``BLOCK_M``-row q tiles (``SUB_M`` per mask
    block), the id pointers at this kv block's lists."""
    h = kv_h * group_size + g
    num_off = b * stride_nb + h * stride_nh + n_block
    ids_off = b * stride_ib + h * stride_ih + n_block * stride_in
    num_full = gl.load(full_num + num_off)
    num_all = num_full + gl.load(partial_num + num_off)
    return h, num_full * SUB_M, num_all * SUB_M, full_ids + ids_off, partial_ids + ids_off


@gluon.jit
def _q_start(t, steps_full, full_ids, partial_ids, SUB_M: gl.constexpr, BLOCK_M: gl.constexpr):
    """The first query row of step ``t`` of a head's walk (full mask blocks first, then partial ones)."""
    if t < steps_full:
        block = gl.load(full_ids + t // SUB_M)
    else:
        block = gl.load(partial_ids + (t - steps_full) // SUB_M)
    return (block * SUB_M + t % SUB_M) * BLOCK_M


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem, kv_bar,
            q_ready, q_empty, do_ready, do_empty, LSE, DELTA, stride_lb, stride_lh, q_len, b, kv_h, n_start,
            group_size, n_block, partial_num, partial_ids, full_num, full_ids, stride_nb, stride_nh, stride_ib,
            stride_ih, stride_in, SUB_M: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
    """Loads K and V of the block (TMA), then for step i into stage ``i % STAGES`` Q with the rows' lse
    (in base 2) and dO with their delta. The row vectors go through shared memory so the consumers hold
    them only briefly (each consumer thread needs 16 of the 64)."""
    rows_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [b, kv_h, n_start, 0], kv_bar, k_smem)
    tma_load(v_desc, [b, kv_h, n_start, 0], kv_bar, v_smem)
    i = 0
    for g in range(group_size):
        h, steps_full, steps_all, f_ids, p_ids = _head_tiles(g, b, kv_h, group_size, n_block, partial_num,
                                                             partial_ids, full_num, full_ids, stride_nb, stride_nh,
                                                             stride_ib, stride_ih, stride_in, SUB_M)
        row_off = b * stride_lb + h * stride_lh
        for t in range(steps_all):
            start_m = _q_start(t, steps_full, f_ids, p_ids, SUB_M, BLOCK_M)
            rows = start_m + gl.arange(0, BLOCK_M, layout=rows_layout)
            lse2 = gl.load(LSE + row_off + rows, mask=rows < q_len, other=0.0) * LOG2E
            delta = gl.load(DELTA + row_off + rows, mask=rows < q_len, other=0.0)
            stage = i % STAGES
            phase = (i // STAGES) & 1
            mbarrier.wait(q_empty.index(stage), phase ^ 1)
            mbarrier.expect(q_ready.index(stage), q_desc.block_type.nbytes)
            tma_load(q_desc, [b, h, start_m, 0], q_ready.index(stage), q_smem.index(stage))
            lse_smem.index(stage).store(lse2)
            mbarrier.arrive(q_ready.index(stage), count=1)
            mbarrier.wait(do_empty.index(stage), phase ^ 1)
            mbarrier.expect(do_ready.index(stage), do_desc.block_type.nbytes)
            tma_load(do_desc, [b, h, start_m, 0], do_ready.index(stage), do_smem.index(stage))
            delta_smem.index(stage).store(delta)
            mbarrier.arrive(do_ready.index(stage), count=1)
            i += 1


@gluon.jit
def _dq_writer(dq_desc, dq_smem, dq_full, dq_empty, b, kv_h, group_size, n_block, partial_num, partial_ids,
               full_num, full_ids, stride_nb, stride_nh, stride_ib, stride_ih, stride_in,
               ADD_DQ: gl.constexpr, SUB_M: gl.constexpr, BLOCK_M: gl.constexpr):
    """Adds the dQ tile of step i into the accumulator once every consumer has written its columns
    (without ADD_DQ there is none: it returns at once)."""
    i = 0
    for g in range(group_size if ADD_DQ else 0):
        h, steps_full, steps_all, f_ids, p_ids = _head_tiles(g, b, kv_h, group_size, n_block, partial_num,
                                                             partial_ids, full_num, full_ids, stride_nb, stride_nh,
                                                             stride_ib, stride_ih, stride_in, SUB_M)
        for t in range(steps_all):
            start_m = _q_start(t, steps_full, f_ids, p_ids, SUB_M, BLOCK_M)
            mbarrier.wait(dq_full, i & 1)
            tma_reduce_add(dq_desc, [b, h, start_m, 0], dq_smem)
            tma.store_wait(0)   # the tile's shared memory has been read
            mbarrier.arrive(dq_empty, count=1)
            i += 1


@gluon.jit
def _modifier_indices(q_rows, kv_idx, q_len, kv_len):
    """The ``[1, q rows]`` and ``[keys, 1]`` indices the mask and score modifiers see: clamped to the
    sequences, so a modifier reading a per-query or per-key table never reads past its end."""
    return gl.minimum(q_rows, q_len - 1)[None, :], gl.minimum(kv_idx, kv_len - 1)[:, None]


@gluon.jit
def _probabilities(s, b, h, q_rows, kv_idx, lse2, q_len, kv_len, sm_scale, qk_scale, mask_args, score_args,
                   MASK_FN: gl.constexpr, SCORE_FN: gl.constexpr, HAS_SCORE: gl.constexpr, MASKED: gl.constexpr):
    """``P^T`` of a tile from its unscaled ``S^T`` ``[keys, q rows]``; also returns the modified scores
    the score_mod's gradient takes (``s`` itself without a score_mod)."""
    q_safe, kv_safe = _modifier_indices(q_rows, kv_idx, q_len, kv_len)
    if HAS_SCORE:
        s = SCORE_FN(s * sm_scale, b, h, q_safe, kv_safe, score_args)
        p = gl.exp2(s * LOG2E - lse2[None, :])
    else:
        p = gl.exp2(s * qk_scale - lse2[None, :])
    if MASKED:
        keep = MASK_FN(b, h, q_safe, kv_safe, mask_args)
        keep = keep & (q_rows < q_len)[None, :] & (kv_idx < kv_len)[:, None]
        p = gl.where(keep, p, 0.0)
    return p, s


@gluon.jit
def _consumer_steps(dk, dv, i, t_begin, t_end, steps_full, f_ids, p_ids, k_w, v_w, k_cols0, k_cols1, q_smem,
                    do_smem, lse_smem, delta_smem, ds_smem, dq_cols, q_ready, q_empty, do_ready, do_empty,
                    ds_ready, dq_full, dq_empty, b, h, kv_idx, q_len, kv_len, sm_scale, qk_scale, mask_args,
                    score_args, WG: gl.constexpr, MASK_FN: gl.constexpr, SCORE_FN: gl.constexpr,
                    SCORE_GRAD_FN: gl.constexpr, HAS_SCORE: gl.constexpr, MASKED: gl.constexpr, ADD_DQ: gl.constexpr,
                    SUB_M: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                    NUM_WG: gl.constexpr, st_layout: gl.constexpr, a_layout: gl.constexpr, dq_layout: gl.constexpr):
    """Steps ``t_begin .. t_end - 1`` of one head's walk for consumer ``WG`` (global step counter ``i``):
    ``k_w``, ``v_w`` its keys' rows of K and V, ``k_cols0`` / ``k_cols1`` its head-dim columns of the
    first / second consumer's keys of K, and ``dq_cols`` its columns of the dQ tile. Returns ``(dk, dv, i)``."""
    DQ_COLS: gl.constexpr = HEAD_DIM // NUM_WG
    dtype: gl.constexpr = q_smem.dtype
    for t in range(t_begin, t_end):
        start_m = _q_start(t, steps_full, f_ids, p_ids, SUB_M, BLOCK_M)
        q_rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
        stage = i % STAGES
        phase = (i // STAGES) & 1
        q_tile = q_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
        do_tile = do_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
        zero_st = gl.zeros([WG_KEYS, BLOCK_M], gl.float32, layout=st_layout)
        mbarrier.wait(q_ready.index(stage), phase)
        s_tok = warpgroup_mma(k_w, q_tile.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        mbarrier.wait(do_ready.index(stage), phase)
        dp_tok = warpgroup_mma(v_w, do_tile.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        lse2 = lse_smem.index(stage).load(gl.SliceLayout(0, st_layout))
        p, s = _probabilities(s, b, h, q_rows, kv_idx, lse2, q_len, kv_len, sm_scale, qk_scale, mask_args,
                              score_args, MASK_FN, SCORE_FN, HAS_SCORE, MASKED)
        dp = warpgroup_mma_wait(0, deps=[dp_tok])
        delta = delta_smem.index(stage).load(gl.SliceLayout(0, st_layout))
        p_op = gl.convert_layout(p.to(dtype), a_layout)
        ds = p * (dp - delta[None, :])   # P and dP^T end here, before the next matmuls take registers
        if HAS_SCORE:
            q_safe, kv_safe = _modifier_indices(q_rows, kv_idx, q_len, kv_len)
            ds = SCORE_GRAD_FN(ds, s, b, h, q_safe, kv_safe, score_args)
        ds = ds.to(dtype)
        ds_op = gl.convert_layout(ds, a_layout)
        dv_tok = warpgroup_mma(p_op, do_tile, dv, is_async=True)
        dk_tok = warpgroup_mma(ds_op, q_tile, dk, is_async=True)
        if ADD_DQ:
            ds_smem.index((i % 2) * NUM_WG + WG).store(ds)   # [keys, q rows] of buffer i % 2
            fence_async_shared()
            mbarrier.arrive(ds_ready.index(i % 2), count=1)
        # dV and dK done before dQ's matmuls take their accumulator's registers
        dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, p_op, ds_op])
        if ADD_DQ:
            mbarrier.wait(ds_ready.index(i % 2), (i // 2) & 1)   # every consumer's dS^T is in
            ds_0 = ds_smem.index((i % 2) * NUM_WG).permute((1, 0))       # dS over the first consumer's keys
            ds_1 = ds_smem.index((i % 2) * NUM_WG + 1).permute((1, 0))
            zero_dq = gl.zeros([BLOCK_M, DQ_COLS], gl.float32, layout=dq_layout)
            dq = warpgroup_mma(ds_0, k_cols0, zero_dq, use_acc=False, is_async=True)
            dq = warpgroup_mma(ds_1, k_cols1, dq, is_async=True)
            dq = warpgroup_mma_wait(0, deps=[dq])
            mbarrier.wait(dq_empty, (i & 1) ^ 1)   # the writer has sent the previous tile
            dq_cols.store(dq * sm_scale)
            fence_async_shared()
            mbarrier.arrive(dq_full, count=1)
        mbarrier.arrive(q_empty.index(stage), count=1)
        mbarrier.arrive(do_empty.index(stage), count=1)
        i += 1
    return dk, dv, i


@gluon.jit
def _consumer(args, WG: gl.constexpr):
    """The consumer partition: :func:`_consumer_wg` with the arguments tuple and the constant ``WG``
    (see :func:`_specialize`)."""
    _consumer_wg(*args, WG)


@gluon.jit
def _consumer_wg(q_smem, do_smem, lse_smem, delta_smem, ds_smem, kv_bar, q_ready, q_empty, do_ready, do_empty,
                 ds_ready, dq_full, dq_empty, k_tile, v_tile, dq_tile, DK, DV, stride_dkb, stride_dkh, stride_dkn,
                 b, kv_h, n_start, group_size, n_block, partial_num, partial_ids, full_num, full_ids, stride_nb,
                 stride_nh, stride_ib, stride_ih, stride_in, q_len, kv_len, sm_scale, qk_scale, mask_args,
                 score_args, MASK_FN: gl.constexpr, SCORE_FN: gl.constexpr, SCORE_GRAD_FN: gl.constexpr,
                 HAS_SCORE: gl.constexpr, ADD_DQ: gl.constexpr, SUB_M: gl.constexpr, BLOCK_M: gl.constexpr,
                 HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, NUM_WG: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup ``WG``: dK and dV of keys ``n_start + 64 WG ...`` over every listed q tile."""
    DQ_COLS: gl.constexpr = HEAD_DIM // NUM_WG
    k_w = k_tile.slice(WG * WG_KEYS, WG_KEYS, dim=0)
    v_w = v_tile.slice(WG * WG_KEYS, WG_KEYS, dim=0)
    k_cols0 = k_tile.slice(0, WG_KEYS, dim=0).slice(WG * DQ_COLS, DQ_COLS, dim=1)
    k_cols1 = k_tile.slice(WG_KEYS, WG_KEYS, dim=0).slice(WG * DQ_COLS, DQ_COLS, dim=1)
    dq_cols = dq_tile.slice(WG * DQ_COLS, DQ_COLS, dim=1)
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM // NUM_WG, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    kv_idx = n_start + WG * WG_KEYS + gl.arange(0, WG_KEYS, layout=gl.SliceLayout(1, st_layout))
    dk = gl.zeros([WG_KEYS, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([WG_KEYS, HEAD_DIM], gl.float32, layout=kv_layout)
    mbarrier.wait(kv_bar, 0)
    i = 0
    for g in range(group_size):
        h, steps_full, steps_all, f_ids, p_ids = _head_tiles(g, b, kv_h, group_size, n_block, partial_num,
                                                             partial_ids, full_num, full_ids, stride_nb, stride_nh,
                                                             stride_ib, stride_ih, stride_in, SUB_M)
        dk, dv, i = _consumer_steps(dk, dv, i, 0, steps_full, steps_full, f_ids, p_ids, k_w, v_w, k_cols0, k_cols1,
                                    q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_cols, q_ready, q_empty,
                                    do_ready, do_empty, ds_ready, dq_full, dq_empty, b, h, kv_idx, q_len, kv_len,
                                    sm_scale, qk_scale, mask_args, score_args, WG, MASK_FN, SCORE_FN, SCORE_GRAD_FN,
                                    HAS_SCORE, False, ADD_DQ, SUB_M, BLOCK_M, HEAD_DIM, STAGES, NUM_WG, st_layout,
                                    a_layout, dq_layout)
        dk, dv, i = _consumer_steps(dk, dv, i, steps_full, steps_all, steps_full, f_ids, p_ids, k_w, v_w, k_cols0,
                                    k_cols1, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_cols, q_ready,
                                    q_empty, do_ready, do_empty, ds_ready, dq_full, dq_empty, b, h, kv_idx, q_len,
                                    kv_len, sm_scale, qk_scale, mask_args, score_args, WG, MASK_FN, SCORE_FN,
                                    SCORE_GRAD_FN, HAS_SCORE, True, ADD_DQ, SUB_M, BLOCK_M, HEAD_DIM, STAGES, NUM_WG,
                                    st_layout, a_layout, dq_layout)
    rows = n_start + WG * WG_KEYS + gl.arange(0, WG_KEYS, layout=gl.SliceLayout(1, kv_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
    offs = b * stride_dkb + kv_h * stride_dkh + rows[:, None] * stride_dkn + cols[None, :]
    ok = (rows < kv_len)[:, None]
    gl.store(DK + offs, (dk * sm_scale).to(DK.dtype.element_ty), mask=ok)
    gl.store(DV + offs, dv.to(DV.dtype.element_ty), mask=ok)


@gluon.jit
def _specialize(consumer_args, loader_args, writer_args, NUM_WG: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """Fork into the two consumer warpgroups (the first is the default partition), the loader warp and
    the dQ writer warp. Argument tuples are built at the call (as in the forward's ``_specialize``). Each
    consumer takes its index as a constant (its shared-memory slices need constant offsets) beside the
    arguments tuple, not appended to it: adding tuples turns the right-hand one's constants into plain
    values, which a worker partition cannot take."""
    gl.static_assert(NUM_WG == 2, "the Gluon dK/dV kernel runs two consumer warpgroups")
    gl.warp_specialize([(_consumer, (consumer_args, gl.constexpr(0))),
                        (_consumer, (consumer_args, gl.constexpr(1))),
                        (_loader, loader_args), (_dq_writer, writer_args)],
                       [4, 1, 1], [CONSUMER_REGS, WORKER_REGS, WORKER_REGS])


@gluon.jit
def _attn_bwd_dkdv_gluon_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, DK, DV, LSE, DELTA,
                                stride_dkb, stride_dkh, stride_dkn, stride_lb, stride_lh,
                                partial_num, partial_ids, full_num, full_ids,
                                stride_nb, stride_nh, stride_ib, stride_ih, stride_in,
                                num_heads, group_size, q_len, kv_len, sm_scale, qk_scale, mask_args, score_args,
                                MASK_FN: gl.constexpr, SCORE_FN: gl.constexpr, SCORE_GRAD_FN: gl.constexpr,
                                HAS_SCORE: gl.constexpr, ADD_DQ: gl.constexpr, MASK_BLOCK_M: gl.constexpr,
                                MASK_BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
                                NUM_WG: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """q/do_desc: host TMA descriptors over ``[B, H, Sq, D]`` moving ``[1, 1, BLOCK_M, D]`` tiles; k/v_desc
    ``[1, 1, NUM_WG * 64, D]`` tiles; dq_desc the fp32 accumulator's (``[1, 1, BLOCK_M, D]``; unused without
    ADD_DQ). TMA fills rows past the end with zeros and clips the adds; DK/DV are stored with row masks."""
    BLOCK_N: gl.constexpr = NUM_WG * WG_KEYS
    SUB_M: gl.constexpr = MASK_BLOCK_M // BLOCK_M
    n_tile = gl.program_id(0)
    bkv = gl.program_id(1)
    kv_heads = num_heads // group_size
    b = bkv // kv_heads
    kv_h = bkv % kv_heads
    n_start = n_tile * BLOCK_N
    n_block = n_start // MASK_BLOCK_N

    k_smem = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WG_KEYS, BLOCK_M], q_desc.dtype)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2 * NUM_WG, WG_KEYS, BLOCK_M], ds_layout)   # 2 buffers
    dq_smem = gl.allocate_shared_memory(dq_desc.dtype, dq_desc.block_type.shape, dq_desc.layout)
    rows_smem_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], rows_smem_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], rows_smem_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(dq_full, count=NUM_WG)
    mbarrier.init(dq_empty, count=1)
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=NUM_WG)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=2)    # the TMA's bytes and the row vector's store
        mbarrier.init(do_ready.index(i), count=2)
        mbarrier.init(q_empty.index(i), count=NUM_WG)
        mbarrier.init(do_empty.index(i), count=NUM_WG)

    k_tile = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v_tile = v_smem.reshape([BLOCK_N, HEAD_DIM])
    dq_tile = dq_smem.reshape([BLOCK_M, HEAD_DIM])
    _specialize((q_smem, do_smem, lse_smem, delta_smem, ds_smem, kv_bar, q_ready, q_empty, do_ready, do_empty,
                 ds_ready, dq_full, dq_empty, k_tile, v_tile, dq_tile, DK, DV, stride_dkb, stride_dkh, stride_dkn, b,
                 kv_h, n_start, group_size, n_block, partial_num, partial_ids, full_num, full_ids, stride_nb,
                 stride_nh, stride_ib, stride_ih, stride_in, q_len, kv_len, sm_scale, qk_scale,
                 mask_args, score_args, gl.constexpr(MASK_FN), gl.constexpr(SCORE_FN), gl.constexpr(SCORE_GRAD_FN),
                 HAS_SCORE, ADD_DQ, SUB_M, BLOCK_M, HEAD_DIM, STAGES, NUM_WG),
                (q_desc, k_desc, v_desc, do_desc, q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem, kv_bar,
                 q_ready, q_empty, do_ready, do_empty, LSE, DELTA, stride_lb, stride_lh, q_len, b, kv_h, n_start,
                 group_size, n_block, partial_num, partial_ids, full_num, full_ids, stride_nb, stride_nh, stride_ib,
                 stride_ih, stride_in, SUB_M, BLOCK_M, STAGES),
                (dq_desc, dq_smem, dq_full, dq_empty, b, kv_h, group_size, n_block, partial_num, partial_ids,
                 full_num, full_ids, stride_nb, stride_nh, stride_ib, stride_ih, stride_in, ADD_DQ, SUB_M, BLOCK_M),
                NUM_WG, CONSUMER_REGS)

    mbarrier.invalidate(kv_bar)
    mbarrier.invalidate(dq_full)
    mbarrier.invalidate(dq_empty)
    for i in gl.static_range(2):
        mbarrier.invalidate(ds_ready.index(i))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(q_ready.index(i))
        mbarrier.invalidate(do_ready.index(i))
        mbarrier.invalidate(q_empty.index(i))
        mbarrier.invalidate(do_empty.index(i))
