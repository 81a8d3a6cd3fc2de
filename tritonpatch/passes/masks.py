"""Affine index analysis of mask expressions and their per-tile verdicts.

An integer tensor built from ``make_range``, ``splat`` of integer scalars, ``expand_dims``,
``broadcast``, ``addi`` / ``subi``, ``muli`` by a constant and ``extsi`` has, at tile position
``(i_0, ..., i_{r-1})``, the value ``S + sum_a c_a * i_a`` where ``S`` is a runtime scalar (an affine
form of scalar SSA values) and ``c_a`` are compile-time integers. So ``lhs OP rhs`` is
``d = lhs - rhs OP 0`` with ``d`` ranging exactly over ``[S + L-, S + L+]`` on the tile, both ends
attained at tile corners (``L-`` / ``L+``: sums of the negative / positive ``c_a * (n_a - 1)``).
The verdicts "all true" / "all false" of an inequality are therefore exact; of ``==`` / ``!=`` and
of and/or/xor/not combinations they are sound (never claim uniformity that is not there).

The verdict formulas are written once against a small scalar-operation interface with two
implementations: :class:`PyOps` (Python integers, for tests and the brute-force property check)
and :class:`IROps` (emits TTIR scalar ops into a :class:`~tritonpatch.passes.ir.Module`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .ir import Module, type_of
from .ir_syntax import TensorType, int_width, parse_type

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
_COEFF_LIMIT = 1 << 20
_CONST_LIMIT = 1 << 40
PREDICATES = ("slt", "sle", "sgt", "sge", "eq", "ne")


@dataclass(frozen=True)
class Affine:
    """``const + sum(coeff * scalar) + sum(axes[a] * i_a)`` over a tile of ``shape``."""
    const: int
    scalars: tuple[tuple[str, int], ...]
    axes: tuple[int, ...]
    shape: tuple[int, ...]

    def span(self) -> tuple[int, int]:
        """(L-, L+): the least and greatest tile-index contribution."""
        low = sum(min(0, c * (n - 1)) for c, n in zip(self.axes, self.shape))
        high = sum(max(0, c * (n - 1)) for c, n in zip(self.axes, self.shape))
        return low, high

    def combine(self, other: "Affine", sign: int) -> "Affine":
        terms = dict(self.scalars)
        for name, coeff in other.scalars:
            terms[name] = terms.get(name, 0) + sign * coeff
        axes = tuple(a + sign * b for a, b in zip(self.axes, other.axes)) if other.axes else self.axes
        return Affine(self.const + sign * other.const, tuple(sorted((n, c) for n, c in terms.items() if c)),
                      axes, self.shape or other.shape)

    def scale(self, factor: int) -> "Affine":
        return Affine(self.const * factor, tuple((n, c * factor) for n, c in self.scalars),
                      tuple(a * factor for a in self.axes), self.shape)

    @property
    def is_constant(self) -> bool:
        return not self.scalars and not any(self.axes)


@dataclass(frozen=True)
class Check:
    """An intermediate i<width> node whose elements must not wrap for the analysis to hold."""
    value: Affine
    width: int


@dataclass(frozen=True)
class Mask:
    """A boolean mask expression: ``atom`` (pred, diff), ``and``/``or``/``xor`` (children),
    ``not`` (child), ``const`` (bool) or ``scalar`` (runtime i1 value name)."""
    kind: str
    pred: str = ""
    diff: Affine | None = None
    children: tuple["Mask", ...] = ()
    value: object = None

    def atoms(self) -> int:
        return 1 if self.kind == "atom" else sum(child.atoms() for child in self.children)


@dataclass
class Analysis:
    """Analysis of the values feeding one mask in one module."""
    module: Module
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


# --- scalar operations: Python and IR ---------------------------------------------------------------
class PyOps:
    """Scalar operations on Python ints / bools (the reference the IR emitter mirrors)."""

    def __init__(self, env: dict[str, int]):
        self.env = env

    def leaf(self, name):
        return self.env[name]

    def flag(self, name):
        return bool(self.env[name])

    def const(self, value):
        return value

    def boolean(self, value):
        return bool(value)

    def add(self, a, b):
        return a + b

    def mul(self, a, factor):
        return a * factor

    def cmp(self, pred, a, b):
        return {"slt": a < b, "sle": a <= b, "sgt": a > b, "sge": a >= b, "eq": a == b, "ne": a != b}[pred]

    def and_(self, a, b):
        return a and b

    def or_(self, a, b):
        return a or b

    def not_(self, a):
        return not a

    def select(self, cond, a, b):
        return a if cond else b

    def ceil_div(self, a, divisor):
        return a if divisor == 1 else -((-a) // divisor)


class IROps:
    """Scalar operations emitted as TTIR lines (i64 arithmetic, i1 flags) into ``lines``."""

    def __init__(self, module: Module, indent: str, loc: str):
        self.module, self.indent, self.loc = module, indent, loc
        self.lines: list[str] = []
        self._cache: dict[tuple, str] = {}

    def emit(self, key, text_for_name, hint="tp"):
        """Emit ``%new = <text>`` once per ``key`` and return ``%new``."""
        if key in self._cache:
            return self._cache[key]
        name = self.module.fresh(hint)
        self.lines.append(f"{self.indent}{name} = {text_for_name} {self.loc}".rstrip())
        self._cache[key] = name
        return name

    def leaf(self, name):
        width = int_width(type_of(self.module, name))
        if width == 64:
            return name
        return self.emit(("ext", name), f"arith.extsi {name} : i{width} to i64")

    def flag(self, name):
        return name

    def const(self, value):
        return self.emit(("c", value), f"arith.constant {int(value)} : i64")

    def boolean(self, value):
        return self.emit(("b", bool(value)), f"arith.constant {'true' if value else 'false'}")

    def add(self, a, b):
        return self.emit(("add", a, b), f"arith.addi {a}, {b} : i64")

    def mul(self, a, factor):
        return self.emit(("mul", a, factor), f"arith.muli {a}, {self.const(factor)} : i64")

    def cmp(self, pred, a, b):
        return self.emit(("cmp", pred, a, b), f"arith.cmpi {pred}, {a}, {b} : i64")

    def and_(self, a, b):
        return self.emit(("and", a, b), f"arith.andi {a}, {b} : i1")

    def or_(self, a, b):
        return self.emit(("or", a, b), f"arith.ori {a}, {b} : i1")

    def not_(self, a):
        return self.emit(("not", a), f"arith.xori {a}, {self.boolean(True)} : i1")

    def select(self, cond, a, b):
        return self.emit(("sel", cond, a, b), f"arith.select {cond}, {a}, {b} : i64")

    def ceil_div(self, a, divisor):
        """ceil(a / divisor) for a positive constant divisor, from truncating division."""
        if divisor == 1:
            return a
        quotient = self.emit(("div", a, divisor), f"arith.divsi {a}, {self.const(divisor)} : i64")
        below = self.cmp("slt", self.mul(quotient, divisor), a)
        return self.select(below, self.add(quotient, self.const(1)), quotient)


# --- verdicts ----------------------------------------------------------------------------------------
def scalar_value(ops, value: Affine):
    """The runtime scalar part ``S`` of an affine value."""
    total = ops.const(value.const)
    for name, coeff in value.scalars:
        term = ops.leaf(name)
        total = ops.add(total, term if coeff == 1 else ops.mul(term, coeff))
    return total


def no_wrap(ops, checks):
    """True when no checked intermediate node can wrap around on this tile."""
    flag = None
    for check in checks:
        low, high = check.value.span()
        lowest, highest = -(1 << (check.width - 1)), (1 << (check.width - 1)) - 1
        start = scalar_value(ops, check.value)
        fits = ops.and_(ops.cmp("sge", start, ops.const(lowest - low)), ops.cmp("sle", start, ops.const(highest - high)))
        flag = fits if flag is None else ops.and_(flag, fits)
    return ops.boolean(True) if flag is None else flag


def atom_conditions(pred: str, diff: Affine):
    """(all_true, all_false) of ``diff OP 0`` over the tile as conditions on the scalar part S:
    ``("cmp", p, K)`` means ``S p K``; ``("or", a, b)``; ``("false",)``."""
    low, high = diff.span()
    if pred in ("slt", "sle"):
        # d < 0 everywhere <=> S + L+ < 0 ;  d >= 0 everywhere <=> S + L- >= 0
        return ("cmp", pred, -high), ("cmp", "sge" if pred == "slt" else "sgt", -low)
    if pred in ("sgt", "sge"):
        return ("cmp", pred, -low), ("cmp", "sle" if pred == "sgt" else "slt", -high)
    single = ("cmp", "eq", -low) if low == high else ("false",)
    outside = ("or", ("cmp", "sgt", -low), ("cmp", "slt", -high))
    return (single, outside) if pred == "eq" else (outside, single)


def evaluate_condition(ops, condition, start):
    """The i1 value of an atom condition for scalar part ``start``."""
    if condition[0] == "cmp":
        return ops.cmp(condition[1], start, ops.const(condition[2]))
    if condition[0] == "or":
        return ops.or_(evaluate_condition(ops, condition[1], start), evaluate_condition(ops, condition[2], start))
    return ops.boolean(False)


def atom_verdict(ops, pred: str, diff: Affine):
    """(all_true, all_false) of ``diff OP 0`` over the tile."""
    start = scalar_value(ops, diff)
    return tuple(evaluate_condition(ops, condition, start) for condition in atom_conditions(pred, diff))


def verdict(ops, mask: Mask):
    """(all_true, all_false) of ``mask`` over the tile (without the wrap-around guard)."""
    if mask.kind == "atom":
        return atom_verdict(ops, mask.pred, mask.diff)
    if mask.kind == "const":
        return ops.boolean(mask.value), ops.boolean(not mask.value)
    if mask.kind == "scalar":
        flag = ops.flag(mask.value)
        return flag, ops.not_(flag)
    if mask.kind == "not":
        all_true, all_false = verdict(ops, mask.children[0])
        return all_false, all_true
    (t1, f1), (t2, f2) = (verdict(ops, child) for child in mask.children)
    if mask.kind == "and":
        return ops.and_(t1, t2), ops.or_(f1, f2)
    if mask.kind == "or":
        return ops.or_(t1, t2), ops.and_(f1, f2)
    return (ops.or_(ops.and_(t1, f2), ops.and_(f1, t2)), ops.or_(ops.and_(t1, t2), ops.and_(f1, f2)))


def guarded_verdict(ops, mask: Mask, checks):
    """(all_true, all_false), both forced false where an index computation might wrap."""
    safe = no_wrap(ops, checks)
    all_true, all_false = verdict(ops, mask)
    return ops.and_(safe, all_true), ops.and_(safe, all_false)


def brute_force(mask: Mask, env: dict[str, int | bool]) -> tuple[bool, bool]:
    """(all_true, all_false) of ``mask`` by evaluating every element of the tile (tests)."""
    shape = _mask_shape(mask)
    values = []
    for position in _positions(shape):
        values.append(_evaluate(mask, env, position))
    return all(values), not any(values)


def _mask_shape(mask: Mask):
    if mask.kind == "atom":
        return mask.diff.shape
    for child in mask.children:
        shape = _mask_shape(child)
        if shape:
            return shape
    return ()


def _positions(shape):
    if not shape:
        yield ()
        return
    for head in range(shape[0]):
        for rest in _positions(shape[1:]):
            yield (head,) + rest


def _evaluate(mask: Mask, env, position) -> bool:
    if mask.kind == "atom":
        d = mask.diff.const + sum(c * env[n] for n, c in mask.diff.scalars)
        d += sum(c * i for c, i in zip(mask.diff.axes, position))
        return PyOps(env).cmp(mask.pred, d, 0)
    if mask.kind == "const":
        return bool(mask.value)
    if mask.kind == "scalar":
        return bool(env[mask.value])
    values = [_evaluate(child, env, position) for child in mask.children]
    if mask.kind == "not":
        return not values[0]
    if mask.kind == "and":
        return values[0] and values[1]
    if mask.kind == "or":
        return values[0] or values[1]
    return values[0] != values[1]


__all__ = ["Affine", "Check", "Mask", "Analysis", "PyOps", "IROps", "verdict", "guarded_verdict", "atom_verdict",
           "brute_force", "scalar_value", "no_wrap", "atom_conditions"]
