"""Mask expressions over a tile and their per-tile verdicts.

An integer tensor built from ``make_range``, ``splat`` of integer scalars, ``expand_dims``,
``broadcast``, ``addi`` / ``subi``, ``muli`` by a constant and ``extsi`` has, at tile position
``(i_0, ..., i_{r-1})``, the value ``S + sum_a c_a * i_a`` where ``S`` is a runtime scalar (an affine
form of scalar SSA values) and ``c_a`` are compile-time integers: an :class:`Affine`
(:mod:`.mask_analysis` reads them, and the :class:`Mask` combining their compares, out of the IR).
So ``lhs OP rhs`` is ``d = lhs - rhs OP 0`` with ``d`` ranging exactly over ``[S + L-, S + L+]`` on
the tile, both ends attained at tile corners (``L-`` / ``L+``: sums of the negative / positive
``c_a * (n_a - 1)``). The verdicts "all true" / "all false" of an inequality are therefore exact;
of ``==`` / ``!=`` and of and/or/xor/not combinations they are sound (never claim uniformity that
is not there).

The verdict formulas are written once against a small scalar-operation interface with two
implementations: :class:`PyOps` (Python integers, for tests and the brute-force property check)
and :class:`IROps` (emits TTIR scalar ops into a :class:`~tritonpatch.passes.ir.Module`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .ir import Module, type_of
from .ir_syntax import int_width


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
    ``not`` (child), ``const`` (bool), ``scalar`` (runtime i1 value name) or ``opaque`` (a tensor
    the analysis cannot read: uniform on no tile as far as the verdicts know)."""
    kind: str
    pred: str = ""
    diff: Affine | None = None
    children: tuple["Mask", ...] = ()
    value: object = None

    def atoms(self) -> int:
        return 1 if self.kind == "atom" else sum(child.atoms() for child in self.children)


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


class UnreadableType(ValueError):
    """An integer scalar whose type cannot be read from the IR: the loop that needs it is left as it is."""


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
        return self.as_i64(name)

    def as_i64(self, name, typed_as=None):
        """``name`` (an integer scalar of ``typed_as``'s type, by default its own) widened to i64;
        :class:`UnreadableType` when that type cannot be read (the pass then leaves the loop as it is and
        says why, rather than emitting IR Triton rejects)."""
        typed_as = typed_as or name
        width = int_width(type_of(self.module, typed_as) or "")
        if width is None:
            raise UnreadableType(f"the integer type of {typed_as} cannot be read from its defining line")
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
    if mask.kind == "opaque":
        return ops.boolean(False), ops.boolean(False)
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


__all__ = ["Affine", "Check", "Mask", "PyOps", "IROps", "verdict", "guarded_verdict", "atom_verdict",
           "scalar_value", "no_wrap", "atom_conditions"]
