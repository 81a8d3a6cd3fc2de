"""The block-sparse attention forward in Gluon for Hopper (sm_90a), in FlashAttention-3's shape
(device code only).

One program per (q-block, batch*head); a q-block is ``NUM_WG`` x ``WG_ROWS`` (64) query rows. The program is
warp-specialized:

* a 1-warp **producer** issues TMA loads: each consumer's 64 rows of Q once, then K and V of every
  tile the block mask lists (full tiles first, then partial ones) into a ring of ``STAGES`` shared
  buffers, each with its own ready / empty mbarrier;
* ``NUM_WG`` **consumer warpgroups** (4 warps each) own 64 query rows each. Per tile j a consumer
  issues ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}`` as asynchronous wgmma, waits for S_j only,
  runs the softmax of tile j (mask, row max, exp2, row sum), waits for PV, and only then converts P_j
  to the next PV product's operand (in the registers the finished one released); O is rescaled just
  before that product is issued. (The
  PTX keeps the softmax between the two waits; ptxas moves the second wait up where its schedule
  stalls, so in the unmasked loop the exponentials run after it: docs/design/gluon_forward.md says
  why that is left so.) Full tiles run a loop without any mask work, partial tiles a second loop
  that evaluates ``mask_mod`` and the sequence end.

Softmax is online and in base 2 (the scale is folded into ``log2(e)``), accumulators are fp32, and
the output and the natural-log log-sum-exp per row are written like the Triton-language forward's
(:mod:`.kernels`), so the backward takes either.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .._runtime.gluon_compat import tma_load, tma_store
from .configs import GLUON_PRODUCER_REGISTERS, GLUON_WG_ROWS

WG_ROWS = gl.constexpr(GLUON_WG_ROWS)   # query rows per consumer warpgroup (one wgmma M)
PRODUCER_REGS = gl.constexpr(GLUON_PRODUCER_REGISTERS)
LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _tile_start(t, num_full, full_ids, partial_ids, BLOCK_N: gl.constexpr):
    """The first kv index of the program's tile number ``t`` (full tiles first, then partial ones)."""
    if t < num_full:
        block = gl.load(full_ids + t)
    else:
        block = gl.load(partial_ids + (t - num_full))
    return block * BLOCK_N


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
              b, h, kv_h, row_start, num_full, full_ids, num_partial, partial_ids,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NUM_WG: gl.constexpr):
    """TMA loads: Q of every consumer, then K_t and V_t of each tile t into stage ``t % STAGES``."""
    mbarrier.expect(q_bar, NUM_WG * q_desc.block_type.nbytes)
    for wg in gl.static_range(NUM_WG):
        tma_load(q_desc, [b, h, row_start + wg * WG_ROWS, 0], q_bar, q_smem.index(wg))
    for t in range(num_full + num_partial):
        start_n = _tile_start(t, num_full, full_ids, partial_ids, BLOCK_N)
        stage = t % STAGES
        phase = (t // STAGES) & 1
        mbarrier.wait(k_empty.index(stage), phase ^ 1)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma_load(k_desc, [b, kv_h, start_n, 0], k_ready.index(stage), k_smem.index(stage))
        mbarrier.wait(v_empty.index(stage), phase ^ 1)
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma_load(v_desc, [b, kv_h, start_n, 0], v_ready.index(stage), v_smem.index(stage))


@gluon.jit
def _softmax_step(s, m_i, l_i, t, b, h, q_idx, tile_ids, t_begin, kv_len, sm_scale, qk_scale, mask_args,
                  score_args, MASK_FN: gl.constexpr, SCORE_FN: gl.constexpr, HAS_SCORE: gl.constexpr,
                  MASKED: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """Scores of tile ``t`` (fp32, the wgmma layout) to probabilities ``p`` in base-2 units; returns
    ``(p, m_new, l_new, alpha)`` where ``alpha`` rescales the output accumulator."""
    if HAS_SCORE or MASKED:
        start_n = gl.load(tile_ids + (t - t_begin)) * BLOCK_N
        kv_idx = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    if MASKED:
        kv_safe = gl.minimum(kv_idx, kv_len - 1)[None, :]   # modifiers never see keys past the end
    elif HAS_SCORE:
        kv_safe = kv_idx[None, :]                           # a full tile ends inside the keys
    if HAS_SCORE:
        x = SCORE_FN(s * sm_scale, b, h, q_idx[:, None], kv_safe, score_args)
        factor = LOG2E
    else:
        x = s
        factor = qk_scale
    if MASKED:
        keep = MASK_FN(b, h, q_idx[:, None], kv_safe, mask_args) & (kv_idx < kv_len)[None, :]
        x = gl.where(keep, x, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(x, 1) * factor)
    if MASKED:
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)   # a row without an allowed pair so far
    else:
        m_ref = m_new
    p = gl.exp2(x * factor - m_ref[:, None])
    alpha = gl.exp2(m_i - m_ref)
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_new, alpha


@gluon.jit
def _take_turn(turn_bars, wg, turns, PINGPONG: gl.constexpr):
    """With PINGPONG, wait until the warpgroup before ``wg`` has issued its matmuls (turn number
    ``turns``; the first warpgroup's first turn is free: a fresh mbarrier reads as phase 1 complete)."""
    if PINGPONG:
        mbarrier.wait(turn_bars.index(wg), (turns & 1) ^ (wg == 0).to(gl.int32))


@gluon.jit
def _pass_turn(turn_bars, wg, turns, NUM_WG: gl.constexpr, PINGPONG: gl.constexpr):
    """With PINGPONG, hand the tensor cores to the next warpgroup; returns the turns taken."""
    if PINGPONG:
        mbarrier.arrive(turn_bars.index((wg + 1) % NUM_WG), count=1)
    return turns + 1


@gluon.jit
def _attend(acc, m_i, l_i, turns, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn_bars, wg,
            t_begin, t_end, tile_ids, b, h, q_idx, kv_len, sm_scale, qk_scale, mask_args, score_args,
            MASK_FN: gl.constexpr, SCORE_FN: gl.constexpr, HAS_SCORE: gl.constexpr, MASKED: gl.constexpr,
            BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, NUM_WG: gl.constexpr,
            PINGPONG: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr, o_layout: gl.constexpr):
    """Tiles ``t_begin .. t_end - 1`` of one consumer warpgroup, FlashAttention-3's step order:
    ``S_t`` and ``O += P_{t-1} V_{t-1}`` in flight together, the softmax of tile t between the waits for
    the two (where ptxas puts the second wait: the module docstring).
    With PINGPONG the warpgroups issue their matmuls in turn, so one's softmax runs under the
    others' matmuls. Returns ``(acc, m_i, l_i, turns)``."""
    if t_begin < t_end:
        zero_s = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, layout=s_layout)
        stage = t_begin % STAGES
        mbarrier.wait(k_ready.index(stage), (t_begin // STAGES) & 1)
        _take_turn(turn_bars, wg, turns, PINGPONG)
        s = warpgroup_mma(q, k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), zero_s,
                          use_acc=False, is_async=True)
        turns = _pass_turn(turn_bars, wg, turns, NUM_WG, PINGPONG)
        s = warpgroup_mma_wait(0, deps=[s])
        mbarrier.arrive(k_empty.index(stage), count=1)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, t_begin, b, h, q_idx, tile_ids, t_begin, kv_len,
                                           sm_scale, qk_scale, mask_args, score_args, MASK_FN, SCORE_FN,
                                           HAS_SCORE, MASKED, BLOCK_N, s_layout)
        p_op = gl.convert_layout(p.to(q.dtype), p_layout)
        for t in range(t_begin + 1, t_end):
            stage = t % STAGES
            mbarrier.wait(k_ready.index(stage), (t // STAGES) & 1)
            _take_turn(turn_bars, wg, turns, PINGPONG)
            s_tok = warpgroup_mma(q, k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), zero_s,
                                  use_acc=False, is_async=True)
            prev = (t - 1) % STAGES
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            mbarrier.wait(v_ready.index(prev), ((t - 1) // STAGES) & 1)
            o_tok = warpgroup_mma(p_op, v_smem.index(prev).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
            turns = _pass_turn(turn_bars, wg, turns, NUM_WG, PINGPONG)
            s = warpgroup_mma_wait(1, deps=[s_tok])
            mbarrier.arrive(k_empty.index(stage), count=1)
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, t, b, h, q_idx, tile_ids, t_begin, kv_len,
                                               sm_scale, qk_scale, mask_args, score_args, MASK_FN, SCORE_FN,
                                               HAS_SCORE, MASKED, BLOCK_N, s_layout)
            acc, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
            mbarrier.arrive(v_empty.index(prev), count=1)
            # converted only now, so the fp32 P never shares registers with the next S (beside it, three
            # consumers at D=64 spilled 3.2 KB: docs/design/gluon_forward.md)
            p_op = gl.convert_layout(p.to(q.dtype), p_layout)
        last = (t_end - 1) % STAGES
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        mbarrier.wait(v_ready.index(last), ((t_end - 1) // STAGES) & 1)
        _take_turn(turn_bars, wg, turns, PINGPONG)
        o_tok = warpgroup_mma(p_op, v_smem.index(last).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
        turns = _pass_turn(turn_bars, wg, turns, NUM_WG, PINGPONG)
        acc, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
        mbarrier.arrive(v_empty.index(last), count=1)
    return acc, m_i, l_i, turns


@gluon.jit
def _consumer(o_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, turn_bars, LSE,
              b, h, row_start, q_len, kv_len, num_full, full_ids, num_partial, partial_ids, sm_scale, qk_scale,
              mask_args, score_args, MASK_FN: gl.constexpr, SCORE_FN: gl.constexpr, HAS_SCORE: gl.constexpr,
              BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, NUM_WG: gl.constexpr,
              PINGPONG: gl.constexpr, wg):
    """Consumer warpgroup ``wg``: WG_ROWS query rows over every listed tile, then Out and LSE of its rows."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows = row_start + wg * WG_ROWS
    q_tile = q_smem.index(wg)
    q = q_tile.reshape([WG_ROWS, HEAD_DIM])
    q_idx = gl.minimum(rows + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, s_layout)), q_len - 1)
    m_i = gl.full([WG_ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([WG_ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, layout=o_layout)
    mbarrier.wait(q_bar, 0)
    turns = 0
    acc, m_i, l_i, turns = _attend(acc, m_i, l_i, turns, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                                   turn_bars, wg, 0, num_full, full_ids, b, h, q_idx, kv_len, sm_scale, qk_scale,
                                   mask_args, score_args, MASK_FN, SCORE_FN, HAS_SCORE, False, BLOCK_N, HEAD_DIM,
                                   STAGES, NUM_WG, PINGPONG, s_layout, p_layout, o_layout)
    acc, m_i, l_i, turns = _attend(acc, m_i, l_i, turns, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                                   turn_bars, wg, num_full, num_full + num_partial, partial_ids, b, h, q_idx, kv_len,
                                   sm_scale, qk_scale, mask_args, score_args, MASK_FN, SCORE_FN, HAS_SCORE, True,
                                   BLOCK_N, HEAD_DIM, STAGES, NUM_WG, PINGPONG, s_layout, p_layout, o_layout)
    empty_row = l_i == 0.0
    lse = gl.where(empty_row, float("-inf"), (m_i + gl.log2(l_i)) * LN2)
    offs = rows + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, s_layout))
    gl.store(LSE + offs, lse, mask=offs < q_len)
    inv_l = gl.convert_layout(1.0 / gl.where(empty_row, 1.0, l_i), gl.SliceLayout(1, o_layout))
    q.store((acc * inv_l[:, None]).to(o_desc.dtype))   # Q's buffer is free once the last wgmma is done
    fence_async_shared()
    tma_store(o_desc, [b, h, rows, 0], q_tile)
    tma.store_wait(0)


@gluon.jit
def _specialize(consumer_args, producer_args, NUM_WG: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """Fork into NUM_WG consumer warpgroups (the first is the default partition) and the producer warp
    (NUM_WG is 1, 2 or 3: ``FwdConfig`` allows no other). The argument tuples are built at the call
    (Triton cannot assign a tuple holding a function to a variable); the consumer's index goes last, as
    a run-time value (adding tuples unwraps constants of the right-hand one, and worker partitions take
    run-time values only)."""
    if NUM_WG == 1:   # the one consumer (the default partition) gets what the producer leaves: CONSUMER_REGS
        gl.warp_specialize([(_consumer, consumer_args + (gl.to_tensor(0), )),
                            (_producer, producer_args)], [1], [PRODUCER_REGS])
    elif NUM_WG == 2:
        gl.warp_specialize([(_consumer, consumer_args + (gl.to_tensor(0), )),
                            (_consumer, consumer_args + (gl.to_tensor(1), )),
                            (_producer, producer_args)], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([(_consumer, consumer_args + (gl.to_tensor(0), )),
                            (_consumer, consumer_args + (gl.to_tensor(1), )),
                            (_consumer, consumer_args + (gl.to_tensor(2), )),
                            (_producer, producer_args)], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])


@gluon.jit
def _work_item(HEAD_SWIZZLE: gl.constexpr):
    """``(q_block, batch*head)`` of this program. The grid is ``(q-blocks, batch*heads)``, launched q-block
    fastest; the last q-blocks usually carry the most tiles (causal masks), so each head's run goes longest
    first. With ``HEAD_SWIZZLE`` G > 0 the launch order instead walks groups of G heads, and inside a group
    its q-blocks longest first, the group's heads side by side: the longest blocks of G heads start before
    any short one, and the group's K/V can stay in L2 while its programs run. A bijection on the grid (the
    last group may hold fewer heads)."""
    num_q_blocks = gl.num_programs(0)
    if HEAD_SWIZZLE == 0:
        q_block = num_q_blocks - 1 - gl.program_id(0)
        bh = gl.program_id(1)
    else:
        order = gl.program_id(1) * num_q_blocks + gl.program_id(0)
        group = order // (HEAD_SWIZZLE * num_q_blocks)
        first_bh = group * HEAD_SWIZZLE
        width = gl.minimum(gl.num_programs(1) - first_bh, HEAD_SWIZZLE)
        rank = order - first_bh * num_q_blocks
        q_block = num_q_blocks - 1 - rank // width
        bh = first_bh + rank % width
    return q_block, bh


@gluon.jit
def _attn_fwd_gluon_kernel(q_desc, k_desc, v_desc, o_desc, LSE, stride_lb, stride_lh,
                           partial_num, partial_ids, full_num, full_ids,
                           stride_nb, stride_nh, stride_ib, stride_ih, stride_iq,
                           num_heads, group_size, q_len, kv_len, sm_scale, qk_scale, mask_args, score_args,
                           MASK_FN: gl.constexpr, SCORE_FN: gl.constexpr, HAS_SCORE: gl.constexpr,
                           NUM_WG: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                           STAGES: gl.constexpr, PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                           HEAD_SWIZZLE: gl.constexpr):
    """q/k/v/o_desc: host TMA descriptors over ``[B, H, S, D]`` moving ``[1, 1, WG_ROWS, D]`` (Q, Out) and
    ``[1, 1, BLOCK_N, D]`` (K, V) tiles; TMA fills rows past the end with zeros and clips stores."""
    q_block, bh = _work_item(HEAD_SWIZZLE)
    b = bh // num_heads
    h = bh % num_heads
    kv_h = h // group_size
    row_start = q_block * (NUM_WG * WG_ROWS)
    num_off = b * stride_nb + h * stride_nh + q_block
    ids_off = b * stride_ib + h * stride_ih + q_block * stride_iq
    num_full = gl.load(full_num + num_off)
    num_partial = gl.load(partial_num + num_off)
    full_ids += ids_off
    partial_ids += ids_off
    LSE += b * stride_lb + h * stride_lh

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_WG] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_WG):
        mbarrier.init(turn_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NUM_WG)
        mbarrier.init(v_empty.index(i), count=NUM_WG)

    _specialize((o_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, turn_bars, LSE, b, h,
                 row_start, q_len, kv_len, num_full, full_ids, num_partial, partial_ids, sm_scale, qk_scale,
                 mask_args, score_args, gl.constexpr(MASK_FN), gl.constexpr(SCORE_FN), HAS_SCORE, BLOCK_N,
                 HEAD_DIM, STAGES, NUM_WG, PINGPONG),
                (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                 b, h, kv_h, row_start, num_full, full_ids, num_partial, partial_ids, BLOCK_N, STAGES, NUM_WG),
                NUM_WG, CONSUMER_REGS)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(NUM_WG):
        mbarrier.invalidate(turn_bars.index(i))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(i))
        mbarrier.invalidate(v_ready.index(i))
        mbarrier.invalidate(k_empty.index(i))
        mbarrier.invalidate(v_empty.index(i))
