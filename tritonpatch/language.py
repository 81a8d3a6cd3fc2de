"""Device helpers for Triton kernels (``import tritonpatch.language as tpl``).

``red_add(pointer, value, mask=None)``: ``*pointer += value`` as fire-and-forget reductions
(``red.global.add``), two neighbouring elements per instruction (``.v2.f32``, ``.bf16x2``,
``.f16x2``) straight from the value's own layout. ``tl.atomic_add`` first converts an MMA-layout
value (a ``tl.dot`` result) to a blocked layout through shared memory and then issues wide
vector atomics; this helper skips the conversion but writes 4 or 8 bytes per instruction.
Which wins is measured in docs/benchmarks/language.md.

Pairing: Triton hands the inline assembly two consecutive elements of a thread's registers. In
an MMA (``tl.dot``) layout those are neighbouring columns of one row, so with a row-major
pointer every pair is contiguous. The assembly checks at run time that the second address is
the first plus one element and that the first is aligned to the pair's size; a pair that fails
the check, or whose mask is only partly set, is written with one scalar reduction per element,
so the result is right for any layout, stride or mask. Reductions are relaxed and unordered
(like ``tl.atomic_add(..., sem="relaxed")`` without a return value); Hopper (sm_90) or newer.
Under ``TRITON_INTERPRET=1`` (which cannot run PTX) ``red_add`` is that ``tl.atomic_add``.
"""
import triton
import triton.language as tl
from triton import knobs

__all__ = ["red_add"]

# Operands: $0 $1 dummy outputs; $2 $3 the pair's addresses; then the values (two .b32 for f32,
# one .b32 holding both halves for 16-bit types); then, when masked, two .b32 mask words.


def _asm(kind: str, masked: bool) -> str:
    """The PTX for one pair: a vector reduction when the pair is contiguous, aligned to its size
    and (if masked) wholly masked in; otherwise one predicated scalar reduction per element."""
    if kind == "f32":
        size, values, mask_operands = 4, ("$4", "$5"), ("$6", "$7")
        vector = "red.global.add.v2.f32 [$2], {$4, $5};"
        scalar = "red.global.add.f32"
        unpack = ""
    else:  # both 16-bit halves arrive packed in $4, element 0 in the low half
        size, values, mask_operands = 2, ("%h0", "%h1"), ("$5", "$6")
        vector = f"red.global.add.noftz.{kind}x2 [$2], $4;"
        scalar = f"red.global.add.noftz.{kind}"
        unpack = "\n.reg .b16 %h0, %h1;\nmov.b32 {%h0, %h1}, $4;"
    lines = ["{", ".reg .pred %vec, %scalar, %p0, %p1;", ".reg .b64 %d, %a;" + unpack,
             "sub.s64 %d, $3, $2;", f"setp.eq.s64 %vec, %d, {size};",
             f"and.b64 %a, $2, {2 * size - 1};", "setp.eq.and.s64 %vec, %a, 0, %vec;"]
    if masked:
        lines += [f"setp.ne.b32 %p0, {mask_operands[0]}, 0;", f"setp.ne.b32 %p1, {mask_operands[1]}, 0;",
                  "and.pred %vec, %vec, %p0;", "and.pred %vec, %vec, %p1;", "not.pred %scalar, %vec;",
                  "and.pred %p0, %p0, %scalar;", "and.pred %p1, %p1, %scalar;"]
        predicates = ("%p0", "%p1")
    else:
        lines += ["not.pred %scalar, %vec;"]
        predicates = ("%scalar", "%scalar")
    lines += [f"@%vec {vector}",
              f"@{predicates[0]} {scalar} [$2], {values[0]};",
              f"@{predicates[1]} {scalar} [$3], {values[1]};",
              "mov.b32 $0, 0;", "mov.b32 $1, 0;", "}"]
    return "\n".join(lines)


_RED_F32 = tl.constexpr(_asm("f32", masked=False))
_RED_F32_MASKED = tl.constexpr(_asm("f32", masked=True))
_RED_BF16 = tl.constexpr(_asm("bf16", masked=False))
_RED_BF16_MASKED = tl.constexpr(_asm("bf16", masked=True))
_RED_F16 = tl.constexpr(_asm("f16", masked=False))
_RED_F16_MASKED = tl.constexpr(_asm("f16", masked=True))


@triton.jit
def red_add(pointer, value, mask=None):
    """``*pointer += value`` element-wise, as vectorized ``red.global.add`` on pairs of
    neighbouring elements (fp32, bf16 or fp16 destinations; ``value`` is converted to the
    destination type like ``tl.atomic_add`` does). ``mask``: elements where it is False are not
    written. Returns nothing; the reductions are relaxed (unordered) and need sm_90+."""
    element_ty = pointer.dtype.element_ty
    tl.static_assert(element_ty == tl.float32 or element_ty == tl.bfloat16 or element_ty == tl.float16,
                     "tritonpatch.language.red_add writes fp32, bf16 or fp16; use tl.atomic_add for other types")
    address = pointer.to(tl.int64, bitcast=True)
    value = value.to(element_ty)
    if element_ty == tl.float32:
        if mask is None:
            tl.inline_asm_elementwise(_RED_F32, "=r,=r,l,l,r,r", [address, value], dtype=tl.int32,
                                      is_pure=False, pack=2)
        else:
            tl.inline_asm_elementwise(_RED_F32_MASKED, "=r,=r,l,l,r,r,r,r", [address, value, mask.to(tl.int32)],
                                      dtype=tl.int32, is_pure=False, pack=2)
    elif element_ty == tl.bfloat16:
        if mask is None:
            tl.inline_asm_elementwise(_RED_BF16, "=r,=r,l,l,r", [address, value], dtype=tl.int32,
                                      is_pure=False, pack=2)
        else:
            tl.inline_asm_elementwise(_RED_BF16_MASKED, "=r,=r,l,l,r,r,r", [address, value, mask.to(tl.int32)],
                                      dtype=tl.int32, is_pure=False, pack=2)
    else:
        if mask is None:
            tl.inline_asm_elementwise(_RED_F16, "=r,=r,l,l,r", [address, value], dtype=tl.int32,
                                      is_pure=False, pack=2)
        else:
            tl.inline_asm_elementwise(_RED_F16_MASKED, "=r,=r,l,l,r,r,r", [address, value, mask.to(tl.int32)],
                                      dtype=tl.int32, is_pure=False, pack=2)



@triton.jit
def _interpreted_red_add(pointer, value, mask=None):
    """``red_add`` under ``TRITON_INTERPRET=1``, which cannot run PTX: the same relaxed sum."""
    tl.atomic_add(pointer, value, mask=mask, sem="relaxed")


if knobs.runtime.interpret:
    red_add = _interpreted_red_add
