"""The softmax's ``exp2`` shared between the SM's special-function units and its FP32 pipes.

At D=64 a consumer warpgroup's 128-key tile costs the tensor cores about as many cycles as its 64×128
exponentials cost the SM's 16 ``MUFU.EX2`` lanes, while the softmax leaves the FP32 pipes (128 lanes) partly
idle. :func:`exp2_shared` computes ``poly_of_4`` of every 4 exponentials (neighbouring elements of one
thread) with a cubic polynomial on the FP32 pipes and the rest with ``ex2.approx.ftz.f32``, the instruction
``gl.exp2`` emits, so those stay bitwise ``gl.exp2``'s.

The polynomial, for ``x`` ≤ 0 (a softmax argument: the score minus the row maximum):
``t = max(x, -127)`` (NaN kept), ``j = round(t)`` (adding and subtracting 1.5·2²³ + 127, whose low bits then
hold ``j + 127``), ``f = t - j`` in [-0.5, 0.5], ``2^f`` by a cubic (minimax relative error 7.5e-5 on that
interval, below bfloat16's rounding of P, 2⁻⁹), times ``2^j`` built from ``j + 127`` shifted into the
exponent field. ``-inf`` gives exactly 0 (``2^j`` is +0.0 at ``j = -127``) and NaN stays NaN, as in
``gl.exp2``; results below 2⁻¹²⁶ are 0 or subnormal (``ex2.approx.ftz`` flushes them to 0). Positive
arguments above 0.5 are not the softmax's and are not supported.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# 2^f ≈ C0 + f·(C1 + f·(C2 + f·C3)) on [-0.5, 0.5], fp32 bit patterns (minimax in relative error)
_COEFFICIENTS = ("0f3F7FFB4A", "0f3F31798D", "0f3E786EE6", "0f3D61FB53")
_ROUNDER = "0f4B40007F"   # 1.5·2²³ + 127: t + this rounds t to an integer and biases it by 127


def _polynomial_exp2(out: str, arg: str) -> str:
    """PTX of ``out = 2^arg`` by the polynomial (module docstring), in its own register scope."""
    c0, c1, c2, c3 = _COEFFICIENTS
    return ("{ .reg .f32 t, r, j, f, p; .reg .b32 e; "
            f"max.NaN.f32 t, {arg}, 0fC2FE0000; "          # -127.0
            f"add.rn.f32 r, t, {_ROUNDER}; sub.rn.f32 j, r, {_ROUNDER}; sub.rn.f32 f, t, j; "
            f"fma.rn.f32 p, f, {c3}, {c2}; fma.rn.f32 p, p, f, {c1}; fma.rn.f32 p, p, f, {c0}; "
            "shl.b32 e, r, 23; "
            f"mul.rn.f32 {out}, p, e; }} ")


def shared_exp2_asm(poly_of_4: int) -> str:
    """PTX for 4 packed fp32 elements ($0-$3 out, $4-$7 in): the last ``poly_of_4`` by the polynomial,
    the others by ``ex2.approx.ftz.f32``."""
    if not 0 < poly_of_4 < 4:
        raise ValueError(f"poly_of_4 must be 1, 2 or 3 (got {poly_of_4}); 0 is plain gl.exp2")
    parts = []
    for i in range(4):
        if i < 4 - poly_of_4:
            parts.append(f"ex2.approx.ftz.f32 ${i}, ${i + 4}; ")
        else:
            parts.append(_polynomial_exp2(f"${i}", f"${i + 4}"))
    return "".join(parts)


SHARED_EXP2_1 = gl.constexpr(shared_exp2_asm(1))
SHARED_EXP2_2 = gl.constexpr(shared_exp2_asm(2))
_CONSTRAINTS = gl.constexpr("=f,=f,=f,=f,f,f,f,f")


@gluon.jit
def exp2_shared(x, POLY_OF_4: gl.constexpr):
    """``exp2(x)`` elementwise for softmax arguments (x ≤ 0, -inf, NaN); ``POLY_OF_4`` (0, 1 or 2) of every
    4 elements by the polynomial, the rest by ``MUFU.EX2``; 0 is ``gl.exp2``."""
    if POLY_OF_4 == 0:
        y = gl.exp2(x)
    elif POLY_OF_4 == 1:
        y = gl.inline_asm_elementwise(SHARED_EXP2_1, _CONSTRAINTS, [x], gl.float32, True, 4)
    else:
        gl.static_assert(POLY_OF_4 == 2, "POLY_OF_4 is 0, 1 or 2")
        y = gl.inline_asm_elementwise(SHARED_EXP2_2, _CONSTRAINTS, [x], gl.float32, True, 4)
    return y
