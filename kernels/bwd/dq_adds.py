"""How the dK/dV kernel adds each q tile's ``dQ`` into the fp32 accumulator in ``dq_mode="atomic"``.

A :class:`DqAdd` names a ``@triton.jit`` function the kernel calls once per q tile::

    fn(dq_acc, dq, b, h, start_m, q_rows, q_len, stride_b, stride_h, stride_m, MASKED, BLOCK_M, HEAD_DIM)

``dq`` is the tile's ``[BLOCK_M, HEAD_DIM]`` fp32 contribution for rows ``q_rows`` (``start_m`` the
first) of batch ``b``, head ``h``; ``dq_acc`` is the accumulator over all of dQ ``[B, H, Sq, D]`` with
its strides (a pointer, or a TMA descriptor where ``descriptor``); ``MASKED``: rows may lie past
``q_len`` and must not be written. Other blocks run the same tile concurrently, so an add must be
atomic. Three adds are correct; the tuner uses :data:`ATOMIC_ADD`, the others are alternatives
(``BwdConfig(..., dq_add=RED_ADD)``) measured by ``scripts/research/bwd_atomic.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl


@dataclass(frozen=True)
class DqAdd:
    """One way to add dQ tiles: ``fn`` (see the module docstring); ``descriptor``: the kernel gets the
    accumulator as a TMA descriptor over all of dQ (``[1, 1, BLOCK_M, D]`` blocks; Hopper+)."""

    name: str
    fn: object
    descriptor: bool = False


@triton.jit
def _rows(dq_acc, b, h, q_rows, stride_b, stride_h, stride_m, HEAD_DIM: tl.constexpr):
    return dq_acc + b * stride_b + h * stride_h + q_rows[:, None] * stride_m + tl.arange(0, HEAD_DIM)[None, :]


@triton.jit
def _atomic_add(dq_acc, dq, b, h, start_m, q_rows, q_len, stride_b, stride_h, stride_m, MASKED: tl.constexpr,
                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """``tl.atomic_add``, relaxed order (vectorizes to ``red.global.add.v4.f32`` on 16-byte aligned rows)."""
    pointers = _rows(dq_acc, b, h, q_rows, stride_b, stride_h, stride_m, HEAD_DIM)
    if MASKED:
        tl.atomic_add(pointers, dq, mask=(q_rows < q_len)[:, None], sem="relaxed")
    else:
        tl.atomic_add(pointers, dq, sem="relaxed")


@triton.jit
def _red_add(dq_acc, dq, b, h, start_m, q_rows, q_len, stride_b, stride_h, stride_m, MASKED: tl.constexpr,
             BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Scalar inline-PTX ``red.global.add.f32`` straight from the MMA layout (no layout conversion). Rows
    past the end add zero to the last row instead of writing out of bounds."""
    pointers = _rows(dq_acc, b, h, tl.minimum(q_rows, q_len - 1), stride_b, stride_h, stride_m, HEAD_DIM)
    tl.inline_asm_elementwise("red.global.add.f32 [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,f",
                              [pointers.to(tl.int64, bitcast=True), tl.where((q_rows < q_len)[:, None], dq, 0.0)],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _tma_add(dq_acc, dq, b, h, start_m, q_rows, q_len, stride_b, stride_h, stride_m, MASKED: tl.constexpr,
             BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The TMA unit's bulk reduce-add (``cp.reduce.async.bulk.tensor``) through a descriptor over all of
    dQ; the unit clips rows past the end."""
    dq_acc.atomic_add([b, h, start_m, 0], dq.reshape(1, 1, BLOCK_M, HEAD_DIM))


ATOMIC_ADD = DqAdd("atomic", _atomic_add)
RED_ADD = DqAdd("red", _red_add)
TMA_ADD = DqAdd("tma", _tma_add, descriptor=True)
