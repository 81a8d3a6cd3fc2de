"""The block-sparse attention forward in Triton (device code only).

Per (batch, head, q-block) program: the *full* kv tiles of the block mask are visited in a loop
without any mask work, then the *partial* tiles in a second loop that evaluates ``mask_mod`` (and
the sequence end); empty tiles are never loaded. Softmax is online, in base 2 (``exp2`` with the
scale folded into ``log2(e)``), accumulators in fp32, matmuls through ``tl.dot`` (wgmma on Hopper).
Writes the output and the natural-log log-sum-exp per query row (for the backward).
"""
from __future__ import annotations

import triton
import triton.language as tl


ALL_TILES, FULL_TILES, PARTIAL_TILES = 0, 1, 2   # the kernel's TILES: which tiles of the block mask it visits


@triton.jit
def load_kv_tile(k_src, v_src, b, kv_h, start_n, kv_idx, kv_len, stride_kn, stride_kd, stride_vn, stride_vd,
                 CHECK_END: tl.constexpr, USE_TMA: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """K^T [HEAD_DIM, BLOCK_N] and V [BLOCK_N, HEAD_DIM] of one kv tile.

    With USE_TMA the sources are 4-D tensor descriptors (TMA zero-fills past the end); otherwise
    pointers to this (batch, kv head), bounds-checked only when CHECK_END."""
    if USE_TMA:
        k = tl.trans(k_src.load([b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM))
        v = v_src.load([b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    else:
        offs_d = tl.arange(0, HEAD_DIM)
        k_ptrs = k_src + kv_idx[None, :] * stride_kn + offs_d[:, None] * stride_kd
        v_ptrs = v_src + kv_idx[:, None] * stride_vn + offs_d[None, :] * stride_vd
        if CHECK_END:
            in_range = kv_idx < kv_len
            k = tl.load(k_ptrs, mask=in_range[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=in_range[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
    return k, v


@triton.jit
def _online_softmax_step(acc, l_i, m_i, x, v, factor, ROWS_MAY_BE_EMPTY: tl.constexpr):
    """Fold one tile of scores ``x`` (disallowed pairs -inf; base-2 units after ``* factor``) and
    its V tile into (acc, l_i, m_i). ROWS_MAY_BE_EMPTY: a row may have seen no allowed pair yet."""
    m_new = tl.maximum(m_i, tl.max(x, 1) * factor)
    if ROWS_MAY_BE_EMPTY:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    p = tl.math.exp2(x * factor - m_ref[:, None])
    alpha = tl.math.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _attend_tiles_specialized(acc, l_i, m_i, q, k_src, v_src, num_full, full_ids, num_partial, partial_ids,
                              b, h, row_start, qk_scale, mask_args, MASK_FN: tl.constexpr, APPLY_MASK: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The full and then the partial tiles in one warp-specialized loop (TMA producer + two
    consumer warpgroups; Triton 3.6 specializes only a kernel's single loop, and only without an
    ``if`` in it), so the mask runs on every tile (APPLY_MASK; off when only full tiles are listed).
    The mask sees both indices shifted by the tile start (``q_idx - start_n``, ``0..BLOCK_N-1``;
    equal for a shift-invariant mask): Triton 3.6's data partitioning miscomputes a loop-variant
    kv-index row ``start_n + arange`` (docs/design/warp_specialization.md). k_src / v_src: 2-D
    descriptors of this kv head."""
    cols = tl.arange(0, BLOCK_N)[None, :]
    for j in tl.range(0, num_full + num_partial, warp_specialize=True):
        start_n = tl.load(tl.where(j < num_full, full_ids + j, partial_ids + (j - num_full))) * BLOCK_N
        x = tl.dot(q, tl.trans(k_src.load([start_n, 0])))
        if APPLY_MASK:
            shifted_rows = row_start - start_n + tl.arange(0, BLOCK_M)    # made from scalars in the loop
            keep = MASK_FN(b, h, shifted_rows[:, None], cols, mask_args)
            x = tl.where(keep, x, float("-inf"))
        acc, l_i, m_i = _online_softmax_step(acc, l_i, m_i, x, v_src.load([start_n, 0]), qk_scale, True)
    return acc, l_i, m_i


@triton.jit
def _attend_tiles(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                  num_tiles, tile_ids, b, h, kv_h, q_idx, kv_len, sm_scale, qk_scale, mask_args, score_args,
                  MASK_FN: tl.constexpr, SCORE_FN: tl.constexpr, APPLY_MASK: tl.constexpr,
                  HAS_SCORE: tl.constexpr, USE_TMA: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Online-softmax update of (acc, l_i, m_i) over the kv tiles listed in ``tile_ids[:num_tiles]``.

    APPLY_MASK selects, at compile time, the partial-tile body (mask + sequence-end checks) or the
    full-tile body (none). Scores are kept in base-2 units: ``x * factor`` with ``factor`` =
    scale*log2(e) (or log2(e) after a score_mod), so ``exp2(x * factor - m)`` is one FMA + ex2."""
    offs_n = tl.arange(0, BLOCK_N)
    for j in range(0, num_tiles):
        start_n = tl.load(tile_ids + j) * BLOCK_N
        kv_idx = start_n + offs_n
        k, v = load_kv_tile(k_src, v_src, b, kv_h, start_n, kv_idx, kv_len, stride_kn, stride_kd, stride_vn, stride_vd,
                            APPLY_MASK, USE_TMA, BLOCK_N, HEAD_DIM)
        x = tl.dot(q, k)
        if APPLY_MASK:
            kv_safe = tl.minimum(kv_idx, kv_len - 1)[None, :]   # modifiers never see keys past the end
        else:
            kv_safe = kv_idx[None, :]                           # a full tile ends inside the keys
        if HAS_SCORE:
            x = SCORE_FN(x * sm_scale, b, h, q_idx, kv_safe, score_args)
            factor = 1.4426950408889634
        else:
            factor = qk_scale
        if APPLY_MASK:
            keep = MASK_FN(b, h, q_idx, kv_safe, mask_args) & (kv_idx < kv_len)[None, :]
            x = tl.where(keep, x, float("-inf"))
        acc, l_i, m_i = _online_softmax_step(acc, l_i, m_i, x, v, factor, APPLY_MASK)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(Q, K, V, Out, LSE,
                     stride_qb, stride_qh, stride_qm, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_ob, stride_oh, stride_om, stride_od,
                     stride_lb, stride_lh,
                     partial_num, partial_ids, full_num, full_ids,
                     stride_nb, stride_nh, stride_ib, stride_ih, stride_iq,
                     num_heads, group_size, q_len, kv_len, sm_scale, qk_scale, mask_args, score_args,
                     MASK_FN: tl.constexpr, SCORE_FN: tl.constexpr, HAS_SCORE: tl.constexpr,
                     USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, TILES: tl.constexpr):
    """One program per (q-block, batch*head). With USE_TMA, Q/K/V/Out are 4-D tensor descriptors;
    with WARP_SPECIALIZE they are pointers and the kernel makes 2-D descriptors of its (batch, head)
    (Triton 3.6 specializes Hopper loops over device-side descriptors only; see
    ``warp_specialize_problem`` for what this variant requires). TILES: which tiles of the block
    mask this launch visits: ``ALL_TILES``, ``FULL_TILES`` (the first pass of a split) or
    ``PARTIAL_TILES`` (the second pass: resumes from the first pass's Out and LSE)."""
    # the last q-blocks usually carry the most tiles (causal-like masks): start them first
    q_block = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_heads
    h = bh % num_heads
    kv_h = h // group_size

    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < q_len
    if WARP_SPECIALIZE:
        q_src = tl.make_tensor_descriptor(Q + b * stride_qb + h * stride_qh, [q_len, HEAD_DIM], [stride_qm, stride_qd],
                                          [BLOCK_M, HEAD_DIM])
        k_src = tl.make_tensor_descriptor(K + b * stride_kb + kv_h * stride_kh, [kv_len, HEAD_DIM],
                                          [stride_kn, stride_kd], [BLOCK_N, HEAD_DIM])
        v_src = tl.make_tensor_descriptor(V + b * stride_vb + kv_h * stride_vh, [kv_len, HEAD_DIM],
                                          [stride_vn, stride_vd], [BLOCK_N, HEAD_DIM])
        o_dst = tl.make_tensor_descriptor(Out + b * stride_ob + h * stride_oh, [q_len, HEAD_DIM],
                                          [stride_om, stride_od], [BLOCK_M, HEAD_DIM])
        lse_dst = tl.make_tensor_descriptor(LSE + b * stride_lb + h * stride_lh, [q_len], [1], [BLOCK_M])
        q = q_src.load([q_block * BLOCK_M, 0])
    elif USE_TMA:
        q = Q.load([b, h, q_block * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
        k_src = K
        v_src = V
    else:
        q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
        k_src = K + b * stride_kb + kv_h * stride_kh
        v_src = V + b * stride_vb + kv_h * stride_vh
    q_idx = tl.minimum(offs_m, q_len - 1)[:, None]   # mask/score functions never see rows past the end

    num_off = b * stride_nb + h * stride_nh + q_block
    ids_off = b * stride_ib + h * stride_ih + q_block * stride_iq
    num_full = tl.load(full_num + num_off)
    num_partial = tl.load(partial_num + num_off)
    if TILES == 2:   # PARTIAL_TILES: the state (acc / l, l = 1, m + log2 l) the full-tile pass stored
        lse_prev = tl.load(LSE + b * stride_lb + h * stride_lh + offs_m, mask=row_ok, other=float("-inf"))
        m_i = lse_prev * 1.4426950408889634
        l_i = tl.where(lse_prev == float("-inf"), 0.0, 1.0)
        if USE_TMA:
            acc = Out.load([b, h, q_block * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM).to(tl.float32)
        else:
            o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
            acc = tl.load(o_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
        num_full = 0
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if TILES == 1:   # FULL_TILES
        num_partial = 0
    if WARP_SPECIALIZE:
        acc, l_i, m_i = _attend_tiles_specialized(acc, l_i, m_i, q, k_src, v_src, num_full, full_ids + ids_off,
                                                  num_partial, partial_ids + ids_off, b, h, q_block * BLOCK_M,
                                                  qk_scale, mask_args, MASK_FN, TILES != 1, BLOCK_M, BLOCK_N)
    else:
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                                      num_full, full_ids + ids_off, b, h, kv_h, q_idx, kv_len,
                                      sm_scale, qk_scale, mask_args, score_args, MASK_FN, SCORE_FN,
                                      False, HAS_SCORE, USE_TMA, BLOCK_N, HEAD_DIM)
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                                      num_partial, partial_ids + ids_off, b, h, kv_h, q_idx,
                                      kv_len, sm_scale, qk_scale, mask_args, score_args, MASK_FN, SCORE_FN,
                                      True, HAS_SCORE, USE_TMA, BLOCK_N, HEAD_DIM)

    empty_row = l_i == 0.0
    out = (acc / tl.where(empty_row, 1.0, l_i)[:, None]).to(q.dtype)
    lse = tl.where(empty_row, float("-inf"), (m_i + tl.math.log2(l_i)) * 0.6931471805599453)
    if WARP_SPECIALIZE:
        o_dst.store([q_block * BLOCK_M, 0], out)
    elif USE_TMA:
        Out.store([b, h, q_block * BLOCK_M, 0], out.reshape(1, 1, BLOCK_M, HEAD_DIM))
    else:
        o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
        tl.store(o_ptrs, out, mask=row_ok[:, None])
    if WARP_SPECIALIZE:   # through TMA too: a pointer store of the loop's row statistics comes out wrong
        lse_dst.store([q_block * BLOCK_M], lse)
    else:
        tl.store(LSE + b * stride_lb + h * stride_lh + offs_m, lse, mask=row_ok)
