"""Reading a mask out of the IR: the affine index analysis behind :mod:`.masks`.

:class:`Analysis` follows an ``i1`` tensor of a loop body back through compares (``<  <=  >  >=
==  !=``, signed), ``and`` / ``or`` / ``xor`` / ``not``, shape ops and splats of ``i1`` scalars to
affine index tensors (``make_range``, ``splat`` of integer scalars, ``expand_dims``, ``broadcast``,
``addi`` / ``subi``, ``muli`` by a constant, ``extsi``), and gives the :class:`~.masks.Mask` it
computes, the intermediate integer nodes whose wrap-around must be ruled out at run time
(:class:`~.masks.Check`) and the lines of the ops that build it. Anything else (a mask loaded from
memory, a division, a multiplier known only at run time) is not analysable: None. With
``opaque_operands``, such a tensor as one operand of ``and`` / ``or`` / ``xor`` next to an analysable
one is an ``opaque`` mask, known on no tile (``doc[q] == doc[kv] & q >= kv`` is still all-false
wherever ``q >= kv`` is). Only ``skip-masked-blocks`` asks for that: it runs the remaining
iterations with the body unchanged. A copy of the body without the select (``elide-uniform-masks``)
can compile to other layouts than the loop it came from where part of the mask is loaded (in
the PTX, the loop converts the select's value to the next dot's operand layout through shuffles;
the copy does not), and round differently: measured on the H200, one ulp in a dK accumulator
(the fuzzer's seed 85).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .ir import Module, type_of
from .ir_syntax import TensorType, int_width, parse_type
from .masks import Affine, Check, Mask

_COEFF_LIMIT = 1 << 20
_CONST_LIMIT = 1 << 40
PREDICATES = ("slt", "sle", "sgt", "sge", "eq", "ne")


@dataclass
class Analysis:
    """Analysis of the values feeding one mask in one module."""
    module: Module
    opaque_operands: bool = False          # an unreadable operand of and/or/xor next to a readable one: opaque
    checks: list[Check] = field(default_factory=list)
    ops: set[int] = field(default_factory=set)        # lines of the tensor ops that build the mask

    # --- scalars -------------------------------------------------------------------------------
    def scalar(self, name: str) -> Affine | None:
        """Affine form of an integer scalar: constants folded, add/sub/mul-by-constant/extsi
        expanded, anything else an opaque leaf (which must be at most 32 bits wide). Results of
        multi-result ops (``%x#1``) are not analysed."""
        if "#" in name:
            return None
        index = self.module.defs.get(name)
        type_text = type_of(self.module, name)
        width = int_width(type_text) if isinstance(type_text, str) else None
        if width is None:
            return None
        line = self.module.lines[index] if index is not None and index >= 0 else None
        if line is not None and name in line.results and len(line.results) == 1 and not line.opens:
            operands = line.operands
            if line.op == "arith.constant":
                match = re.match(r"\s*(-?\d+)\s*:", line.body)
                if match and abs(int(match.group(1))) <= _CONST_LIMIT:
                    return Affine(int(match.group(1)), (), (), ())
                return None
            if line.op in ("arith.addi", "arith.subi") and len(operands) == 2:
                left, right = self.scalar(operands[0]), self.scalar(operands[1])
                if left is None or right is None:
                    return None
                result = left.combine(right, 1 if line.op == "arith.addi" else -1)
                return self._bounded(result, width, scalar=True)
            if line.op == "arith.muli" and len(operands) == 2:
                left, right = self.scalar(operands[0]), self.scalar(operands[1])
                if left is not None and right is not None:
                    if right.is_constant:
                        return self._bounded(left.scale(right.const), width, scalar=True)
                    if left.is_constant:
                        return self._bounded(right.scale(left.const), width, scalar=True)
            if line.op == "arith.extsi" and len(operands) == 1:
                return self.scalar(operands[0])
        if width > 32:
            return None
        return Affine(0, ((name, 1),), (), ())

    def _bounded(self, value: Affine, width: int, scalar: bool = False) -> Affine | None:
        if any(abs(c) > _COEFF_LIMIT for _, c in value.scalars) or any(abs(c) > _COEFF_LIMIT for c in value.axes):
            return None
        if abs(value.const) > _CONST_LIMIT:
            return None
        if width < 64 and Check(value if not scalar else Affine(value.const, value.scalars, (), ()), width) \
                not in self.checks:
            self.checks.append(Check(value if not scalar else Affine(value.const, value.scalars, (), ()), width))
        return value

    def _sole_definition(self, name: str):
        """(index, line) of the op defining ``name`` as its only result in this region, else None
        (block arguments, multi-result ops and region-opening ops are never analysed)."""
        if "#" in name:
            return None
        index = self.module.defs.get(name)
        if index is None or index < 0:
            return None
        line = self.module.lines[index]
        if name not in line.results or len(line.results) != 1 or line.opens:
            return None
        return index, line

    # --- integer tensors -------------------------------------------------------------------------
    def tensor(self, name: str) -> Affine | None:
        """Affine form of an integer tensor (see the module docstring), None if it is not one."""
        found = self._sole_definition(name)
        if found is None:
            return None
        index, line = found
        result_type = parse_type(type_of(self.module, name) or "")
        if not isinstance(result_type, TensorType) or int_width(result_type) is None:
            return None
        shape, width, operands = result_type.shape, int_width(result_type), line.operands
        value = None
        if line.op == "arith.constant":
            match = re.match(r"\s*dense<(-?\d+)>", line.body)
            if match and abs(int(match.group(1))) <= _CONST_LIMIT:
                value = Affine(int(match.group(1)), (), (0,) * len(shape), shape)
        elif line.op == "tt.make_range":
            start = re.search(r"start = (-?\d+)", line.body)
            value = Affine(int(start.group(1)), (), (1,), shape) if start else None
        elif line.op == "tt.splat" and len(operands) == 1:
            inner = self.scalar(operands[0])
            value = Affine(inner.const, inner.scalars, (0,) * len(shape), shape) if inner else None
        elif line.op == "tt.expand_dims" and len(operands) == 1:
            inner, axis = self.tensor(operands[0]), re.search(r"axis = (\d+)", line.body)
            if inner is not None and axis:
                position = int(axis.group(1))
                value = Affine(inner.const, inner.scalars, inner.axes[:position] + (0,) + inner.axes[position:], shape)
        elif line.op in ("tt.broadcast", "ttg.convert_layout", "arith.extsi") and len(operands) == 1:
            inner = self.tensor(operands[0])
            if inner is not None:
                axes = tuple(0 if n == 1 else c for c, n in zip(inner.axes, shape))
                value = Affine(inner.const, inner.scalars, axes, shape)
        elif line.op in ("arith.addi", "arith.subi", "arith.muli") and len(operands) == 2:
            left, right = self.tensor(operands[0]), self.tensor(operands[1])
            if left is not None and right is not None:
                if line.op == "arith.muli":
                    if right.is_constant:
                        value = left.scale(right.const)
                    elif left.is_constant:
                        value = right.scale(left.const)
                else:
                    value = left.combine(right, 1 if line.op == "arith.addi" else -1)
                value = self._bounded(value, width) if value is not None else None
        if value is not None:
            self.ops.add(index)
        return value

    # --- masks ---------------------------------------------------------------------------------------
    def mask(self, name: str) -> Mask | None:
        """The mask expression computing i1 tensor ``name``, None if it is not analysable."""
        found = self._sole_definition(name)
        if found is None:
            return None
        index, line = found
        operands, result = line.operands, None
        if line.op == "arith.cmpi":
            pred = line.body.split(",", 1)[0].strip()
            if pred in PREDICATES and len(operands) == 2:
                left, right = self.tensor(operands[0]), self.tensor(operands[1])
                if left is not None and right is not None:
                    result = Mask("atom", pred=pred, diff=left.combine(right, -1))
        elif line.op in ("arith.andi", "arith.ori", "arith.xori") and len(operands) == 2:
            left, right = self.mask(operands[0]), self.mask(operands[1])
            if self.opaque_operands and (left is None) != (right is None):     # one side unreadable
                left, right = left or Mask("opaque"), right or Mask("opaque")
            if left is not None and right is not None:
                if line.op == "arith.xori" and right.kind == "const" and right.value is True:
                    result = Mask("not", children=(left,))
                elif line.op == "arith.xori" and left.kind == "const" and left.value is True:
                    result = Mask("not", children=(right,))
                else:
                    result = Mask(line.op.split(".")[1][:-1], children=(left, right))
        elif line.op in ("tt.broadcast", "tt.expand_dims", "ttg.convert_layout") and len(operands) == 1:
            result = self.mask(operands[0])
        elif line.op == "arith.constant":
            match = re.match(r"\s*dense<(true|false)>", line.body)
            result = Mask("const", value=match.group(1) == "true") if match else None
        elif line.op == "tt.splat" and len(operands) == 1 and "#" not in operands[0] \
                and type_of(self.module, operands[0]) == "i1":
            result = Mask("scalar", value=operands[0])
        if result is not None:
            self.ops.add(index)
        return result
