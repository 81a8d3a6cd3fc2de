"""Sets of loop iterations on which a mask is all-true / all-false, as runtime scalars.

Each compare of an analysable mask (:mod:`.masks`) is affine in the induction variable, so the
iterations on which it is all-true (or all-false) on the whole tile form a half-line. Two algebras
combine those half-lines through the mask's and/or/not structure, each a sound under-approximation:

* :class:`PrefixSuffix` -- ``[lower, P) U [S, upper)``: the leading and trailing iterations
  (``skip-masked-blocks`` drops the all-false ones);
* :class:`Interval` -- ``[a, b)``: one run of iterations (``elide-uniform-masks`` gives the all-true
  run its own loop).

Both are written against the scalar-operation interface of :mod:`.masks` (Python integers in the
property tests, TTIR scalar ops in the passes). A third reading of the same formulas,
:func:`possible_runs`, decides at compile time which of the sets can be non-empty at all (an ``==``
of a moving index is never all-true on a tile), so that a pass does not emit, or report, a
rewrite that can never take effect; :func:`loop_uniform_runs` reads them once more on affine forms
of the loop's own bounds (:class:`_Symbolic`), so that a run those bounds rule out in every program
gets no loop either.

Every bound a pass derives from these sets stays inside the loop's own iteration range: the
counts are clamped to ``[0, trips]`` and the bounds to ``[lower, max(lower, upper)]``
(:func:`trip_count`, :func:`iteration_bound`), so an empty or reversed range (``lower >= upper``,
as a caller-given key range can be) stays empty whatever the set algebra answers for it.
"""
from __future__ import annotations

from .ir import Module
from .mask_analysis import Analysis
from .masks import Affine, Mask, atom_conditions, no_wrap, scalar_value


NARROWED = "tritonpatch.narrowed"   # skip-masked-blocks marks the loops it narrowed (no all-false runs left)


def smin(ops, a, b):
    folded = getattr(ops, "min_of", None)          # the symbolic reading keeps min(a, b) as such
    return folded(a, b) if folded else ops.select(ops.cmp("slt", a, b), a, b)


def smax(ops, a, b):
    folded = getattr(ops, "max_of", None)
    return folded(a, b) if folded else ops.select(ops.cmp("sgt", a, b), a, b)


class PrefixSuffix:
    """Sets of iterations as (P, S): every iv in [lower, P) and every iv in [S, upper)."""

    def __init__(self, ops, lower, upper):
        self.ops, self.lower, self.upper = ops, lower, upper

    def constant(self, flag):
        ops = self.ops
        return ops.select(flag, self.upper, self.lower), ops.select(flag, self.lower, self.upper)

    def empty(self):
        return self.lower, self.upper

    def at_least(self, threshold):
        ops = self.ops
        prefix = ops.select(ops.cmp("sle", threshold, self.lower), self.upper, self.lower)
        return prefix, smax(ops, self.lower, smin(ops, threshold, self.upper))

    def at_most(self, threshold):
        ops = self.ops
        last = ops.add(self.upper, ops.const(-1))
        suffix = ops.select(ops.cmp("sge", threshold, last), self.lower, self.upper)
        return smax(ops, self.lower, smin(ops, ops.add(threshold, ops.const(1)), self.upper)), suffix

    def union(self, a, b):
        ops = self.ops
        whole = ops.or_(ops.cmp("sge", a[0], b[1]), ops.cmp("sge", b[0], a[1]))
        return (ops.select(whole, self.upper, smax(ops, a[0], b[0])),
                ops.select(whole, self.lower, smin(ops, a[1], b[1])))

    def intersection(self, a, b):
        return smin(self.ops, a[0], b[0]), smax(self.ops, a[1], b[1])


class Interval:
    """Sets of iterations as [a, b) within [lower, upper) (empty when a >= b)."""

    def __init__(self, ops, lower, upper):
        self.ops, self.lower, self.upper = ops, lower, upper

    def constant(self, flag):
        return self.lower, self.ops.select(flag, self.upper, self.lower)

    def empty(self):
        return self.lower, self.lower

    def at_least(self, threshold):
        return smax(self.ops, self.lower, smin(self.ops, threshold, self.upper)), self.upper

    def at_most(self, threshold):
        ops = self.ops
        return self.lower, smax(ops, self.lower, smin(ops, ops.add(threshold, ops.const(1)), self.upper))

    def union(self, a, b):
        """The hull where the two runs overlap or touch, else the longer one."""
        ops = self.ops
        touch = ops.cmp("sle", smax(ops, a[0], b[0]), smin(ops, a[1], b[1]))
        a_longer = ops.cmp("sge", ops.add(a[1], ops.mul(a[0], -1)), ops.add(b[1], ops.mul(b[0], -1)))
        start = ops.select(touch, smin(ops, a[0], b[0]), ops.select(a_longer, a[0], b[0]))
        end = ops.select(touch, smax(ops, a[1], b[1]), ops.select(a_longer, a[1], b[1]))
        return start, end

    def intersection(self, a, b):
        start = smax(self.ops, a[0], b[0])
        return start, smax(self.ops, start, smin(self.ops, a[1], b[1]))


def condition_set(sets, condition, slope: int, rest):
    """Iterations where ``slope * iv + rest  p  K`` holds (an atom condition, see atom_conditions)."""
    ops = sets.ops
    if condition[0] == "false":
        return sets.empty()
    if condition[0] == "or":
        return sets.union(condition_set(sets, condition[1], slope, rest),
                          condition_set(sets, condition[2], slope, rest))
    _, pred, bound = condition
    if slope == 0:
        return sets.constant(ops.cmp(pred, rest, ops.const(bound)))
    if pred in ("eq", "ne"):
        return sets.empty()                   # sound under-approximation
    target = ops.add(ops.const(bound), ops.mul(rest, -1))        # slope * iv  pred  target
    if slope < 0:
        slope, target = -slope, ops.mul(target, -1)
        pred = {"slt": "sgt", "sle": "sge", "sgt": "slt", "sge": "sle"}[pred]
    ceil = ops.ceil_div(target, slope)
    floor = ops.mul(ops.ceil_div(ops.mul(target, -1), slope), -1)
    if pred == "slt":
        return sets.at_most(ops.add(ceil, ops.const(-1)))
    if pred == "sle":
        return sets.at_most(floor)
    if pred == "sgt":
        return sets.at_least(ops.add(floor, ops.const(1)))
    return sets.at_least(ceil)


def mask_sets(sets, mask: Mask, iv: str):
    """(all-true set, all-false set) of ``mask`` over the iterations (under-approximations)."""
    ops = sets.ops
    if mask.kind == "atom":
        slope = dict(mask.diff.scalars).get(iv, 0)
        rest = scalar_value(ops, Affine(mask.diff.const, tuple((n, c) for n, c in mask.diff.scalars if n != iv), (), ()))
        return tuple(condition_set(sets, c, slope, rest) for c in atom_conditions(mask.pred, mask.diff))
    if mask.kind == "const":
        return sets.constant(ops.boolean(mask.value)), sets.constant(ops.boolean(not mask.value))
    if mask.kind == "scalar":
        flag = ops.flag(mask.value)
        return sets.constant(flag), sets.constant(ops.not_(flag))
    if mask.kind == "not":
        true_set, false_set = mask_sets(sets, mask.children[0], iv)
        return false_set, true_set
    if mask.kind == "opaque":
        return sets.empty(), sets.empty()
    (t1, f1), (t2, f2) = (mask_sets(sets, child, iv) for child in mask.children)
    if mask.kind == "and":
        return sets.intersection(t1, t2), sets.union(f1, f2)
    if mask.kind == "or":
        return sets.union(t1, t2), sets.intersection(f1, f2)
    # xor: all-true where one side is all-true and the other all-false, all-false where they agree
    return (sets.union(sets.intersection(t1, f2), sets.intersection(f1, t2)),
            sets.union(sets.intersection(t1, t2), sets.intersection(f1, f2)))


class _Possible:
    """The set algebra read at compile time: a set is True when it may be non-empty for some
    runtime values, False when it is empty for all of them (every scalar is unknown)."""

    def __init__(self):
        self.ops = _Unknown()

    @staticmethod
    def constant(flag):
        return flag is not False

    @staticmethod
    def empty():
        return False

    @staticmethod
    def at_least(threshold):
        return True

    @staticmethod
    def at_most(threshold):
        return True

    @staticmethod
    def union(a, b):
        return a or b

    @staticmethod
    def intersection(a, b):
        return a and b


class _Symbolic:
    """Scalar operations on the kernel's scalars read at compile time. A value is an affine form
    (:class:`~.masks.Affine` without tile axes) or ``("max" | "min" | "either", parts)``: the
    maximum or minimum of the parts, or one of them (a select on a condition that depends on the
    runtime values). A value is None where it is none of these (a division that does not divide
    every term, more than ``_PARTS`` parts), a condition None where its truth depends on the
    runtime values. A comparison is known where it follows for every program: ``max(a, b) >= c``
    when ``a >= c`` or ``b >= c`` is, two affine forms when they differ by a constant or by one of
    ``facts`` (affine forms known to be >= 0 in every program considered) plus a constant."""

    _PARTS = 16

    def __init__(self, facts: tuple = ()):
        self.facts = facts
        self._verdicts = {}          # (a, b, strict) -> _at_least's answer: max/min trees share parts

    def _nonnegative(self, form: Affine) -> bool:
        if not form.scalars:
            return form.const >= 0
        return any(not rest.scalars and rest.const >= 0 for rest in (form.combine(fact, -1) for fact in self.facts))

    def _node(self, kind, parts):
        flat = set()
        for part in parts:
            if part is None:
                return None
            flat |= part[1] if isinstance(part, tuple) and part[0] == kind else {part}
        if len(flat) == 1:
            return next(iter(flat))
        return (kind, frozenset(flat)) if len(flat) <= self._PARTS else None

    def _candidates(self, value):
        """The affine forms ``value`` is one of."""
        if isinstance(value, tuple):
            return set().union(*(self._candidates(part) for part in value[1]))
        return {value}

    def leaf(self, name):
        return Affine(0, ((name, 1),), (), ())

    def flag(self, name):
        return None

    def const(self, value):
        return Affine(int(value), (), (), ())

    def boolean(self, value):
        return bool(value)

    def add(self, a, b):
        if a is None or b is None:
            return None
        if not isinstance(a, tuple) and not isinstance(b, tuple):
            return a.combine(b, 1)                                     # combine drops zero coefficients
        if isinstance(b, tuple) and not isinstance(a, tuple):
            a, b = b, a
        if not isinstance(b, tuple):                                  # max(x, y) + z = max(x + z, y + z)
            return self._node(a[0], [self.add(part, b) for part in a[1]])
        if a[0] == b[0] and a[0] in ("max", "min"):                   # max(x, y) + max(z, w): max of the sums
            return self._node(a[0], [self.add(x, y) for x in a[1] for y in b[1]])
        return self._node("either", [x.combine(y, 1) for x in self._candidates(a) for y in self._candidates(b)])

    def mul(self, a, factor):
        if a is None:
            return None
        if not isinstance(a, tuple):
            return a.scale(factor)
        if factor == 0:
            return self.const(0)
        kind = {"max": "min", "min": "max"}.get(a[0], a[0]) if factor < 0 else a[0]
        return self._node(kind, [self.mul(part, factor) for part in a[1]])

    def max_of(self, a, b):
        return self._node("max", [a, b])

    def min_of(self, a, b):
        return self._node("min", [a, b])

    def _at_least(self, a, b, strict: bool):
        """Whether ``a >= b`` (``a > b``) in every program: True, False, or None (it depends)."""
        key = (a, b, strict)
        if key not in self._verdicts:
            self._verdicts[key] = self._compare(a, b, strict)
        return self._verdicts[key]

    def _compare(self, a, b, strict: bool):
        if isinstance(a, tuple):
            verdicts = [self._at_least(part, b, strict) for part in a[1]]
            return _verdict({"max": "any", "min": "all"}.get(a[0], "same"), verdicts)
        if isinstance(b, tuple):
            verdicts = [self._at_least(a, part, strict) for part in b[1]]
            return _verdict({"max": "all", "min": "any"}.get(b[0], "same"), verdicts)
        margin = a.combine(b, -1).combine(self.const(1 if strict else 0), -1)     # a >= b: a - b >= 0
        if self._nonnegative(margin):
            return True
        return False if self._nonnegative(margin.scale(-1).combine(self.const(1), -1)) else None

    def cmp(self, pred, a, b):
        if a is None or b is None:
            return None
        if pred in ("eq", "ne"):
            above, below = self._at_least(a, b, True), self._at_least(b, a, True)
            equal = False if True in (above, below) else True if (above, below) == (False, False) else None
            return equal if pred == "eq" or equal is None else not equal
        left, right = (a, b) if pred in ("sge", "sgt") else (b, a)
        return self._at_least(left, right, pred in ("sgt", "slt"))

    def or_(self, a, b):
        if a is True or b is True:
            return True
        return False if a is False and b is False else None

    def not_(self, a):
        return None if a is None else not a

    def select(self, cond, a, b):
        if cond is not None:
            return a if cond else b
        return self._node("either", [a, b])

    def ceil_div(self, a, divisor):
        """Exact where ``divisor`` divides every scalar's coefficient: ceil((T + c) / d) = T / d +
        ceil(c / d) for an integer T / d; it keeps order, so it goes into a max or min."""
        if a is None:
            return None
        if isinstance(a, tuple):
            return self._node(a[0], [self.ceil_div(part, divisor) for part in a[1]])
        if any(c % divisor for _, c in a.scalars):
            return None
        return Affine(-((-a.const) // divisor), tuple((name, c // divisor) for name, c in a.scalars), (), ())


def _verdict(rule: str, verdicts: list) -> bool | None:
    """Combine the verdicts on the parts of a max / min / either: ``any`` part true makes it true
    (all false: false), ``all`` parts true make it true (any false: false), ``same``: all agree."""
    if rule == "any":
        return True if True in verdicts else False if all(v is False for v in verdicts) else None
    if rule == "all":
        return False if False in verdicts else True if all(v is True for v in verdicts) else None
    return verdicts[0] if verdicts and all(v is verdicts[0] for v in verdicts) else None


class _Unknown:
    """Scalar operations on unknown runtime values (None); only boolean constants are known."""

    def boolean(self, value):
        return bool(value)

    def not_(self, value):
        return None if value is None else not value

    def __getattr__(self, name):
        return lambda *args: None


def possible_runs(mask: Mask, iv: str) -> tuple[bool, bool]:
    """(all-true run possible, all-false run possible): whether :func:`mask_sets` can answer a
    non-empty all-true / all-false set of iterations for any runtime values."""
    return mask_sets(_Possible(), mask, iv)


def loop_uniform_runs(module: Module, head, mask: Mask) -> tuple[bool, bool, bool]:
    """:func:`uniform_runs_possible` for the ``scf.for`` ``head`` of ``module``, its bounds read as
    affine forms by an :class:`~.mask_analysis.Analysis` of their own (the wrap checks of the bound
    arithmetic must not join the mask's, which guard the loop's runtime split)."""
    bounds = Analysis(module)
    return uniform_runs_possible(mask, head.iv, bounds.scalar(head.lower), bounds.scalar(head.upper))


def uniform_runs_possible(mask: Mask, iv: str, lower: Affine | None, upper: Affine | None) -> tuple[bool, bool, bool]:
    """(leading all-false, all-true, trailing all-false): whether each uniform run of a loop over
    ``[lower, upper)`` may be non-empty. Beyond :func:`possible_runs`, the set algebras are read on
    affine forms of the bounds and of the mask's scalars (:class:`_Symbolic`), so a run whose end
    lies at or before its start in every program whose loop runs is known empty: the
    tutorial's on-band loop ``range(64 * pid, 64 * pid + 64, 32)`` under ``rows >= cols`` on
    64 x 32 tiles has only mixed tiles. ``lower`` / ``upper`` None: not affine (unknown).
    A run said empty runs in a mixed loop (the original body), so a wrong answer here could only
    cost speed, never exactness; where an index computation wraps, every run is mixed anyway."""
    true_possible, false_possible = possible_runs(mask, iv)
    lower = lower if lower is not None else _Symbolic().leaf("<lower bound>")
    upper = upper if upper is not None else _Symbolic().leaf("<upper bound>")
    # a run can be non-empty only in a program whose loop is: there upper - lower - 1 >= 0
    ops = _Symbolic(facts=(upper.combine(lower, -1).combine(Affine(1, (), (), ()), -1),))
    start, end = mask_sets(Interval(ops, lower, upper), mask, iv)[0]
    prefix, suffix = mask_sets(PrefixSuffix(ops, lower, upper), mask, iv)[1]
    return (false_possible and ops.cmp("sle", prefix, lower) is not True,
            true_possible and ops.cmp("sle", end, start) is not True,
            false_possible and ops.cmp("sge", suffix, upper) is not True)


def trip_count(ops, lower, upper, step: int):
    """The loop's number of iterations, ``max(0, ceil((upper - lower) / step))``."""
    return smax(ops, ops.const(0), ops.ceil_div(ops.add(upper, ops.mul(lower, -1)), step))


def iteration_bound(ops, lower, upper, count, step: int):
    """``lower + count * step`` for a count in ``[0, trips]``, capped at ``max(lower, upper)``: a
    bound that never leaves the loop's own range (the last iteration may stop short of a full step
    before ``upper``; an empty or reversed range gives ``lower``)."""
    return smin(ops, ops.add(lower, ops.mul(count, step)), smax(ops, lower, upper))


class AtIteration:
    """Scalar ops with the induction variable replaced by a fixed i64 value (range guards)."""

    def __init__(self, ops, iv, value):
        self._ops, self._iv, self._value = ops, iv, value

    def leaf(self, name):
        return self._value if name == self._iv else self._ops.leaf(name)

    def __getattr__(self, name):
        return getattr(self._ops, name)


def no_wrap_in_loop(ops, lower, upper, iv: str, checks):
    """True when no checked index computation wraps on the first or the last iteration (they are
    affine in the induction variable, so then on none in between)."""
    last = ops.add(upper, ops.const(-1))
    return ops.and_(no_wrap(AtIteration(ops, iv, lower), checks), no_wrap(AtIteration(ops, iv, last), checks))


def segment_counts(ops, lower, upper, step: int, mask: Mask, iv: str, checks):
    """Iteration counts ``k1 <= k2 <= k3 <= k4`` (from ``lower``) cutting the loop's ``n`` iterations
    into five runs: ``[0, k1)`` all-false, ``[k1, k2)`` mixed, ``[k2, k3)`` all-true, ``[k3, k4)``
    mixed, ``[k4, n)`` all-false. Every run but the mixed ones may be empty; where an index
    computation could wrap, everything is one mixed run. Each count lies in ``[0, n]``, also for
    an empty or reversed range (``n = 0``)."""
    trips = trip_count(ops, lower, upper, step)

    def count_before(bound, least):
        """Iterations whose iv lies below ``bound``, at least ``least`` and at most ``trips``."""
        return smin(ops, smax(ops, ops.ceil_div(ops.add(bound, ops.mul(lower, -1)), step), least), trips)

    all_true, _ = mask_sets(Interval(ops, lower, upper), mask, iv)
    _, all_false = mask_sets(PrefixSuffix(ops, lower, upper), mask, iv)
    zero = ops.const(0)
    k1 = count_before(all_false[0], zero)
    k2 = count_before(all_true[0], k1)
    k3 = count_before(all_true[1], k2)
    k4 = count_before(all_false[1], k3)
    safe = no_wrap_in_loop(ops, lower, upper, iv, checks)
    return (ops.select(safe, k1, zero), ops.select(safe, k2, zero), ops.select(safe, k3, zero),
            ops.select(safe, k4, trips))


def scalars_fixed_in_loop(module: Module, loop: int, mask: Mask, iv: str, checks) -> bool:
    """Whether every runtime scalar of the mask (and of its wrap checks) is the induction variable
    or defined before the loop, so that the iteration sets can be computed in front of it."""
    names = set()

    def collect(node):
        if node.kind == "atom":
            names.update(n for n, _ in node.diff.scalars)
        elif node.kind == "scalar":
            names.add(node.value)
        for child in node.children:
            collect(child)
    collect(mask)
    for check in checks:
        names.update(n for n, _ in check.value.scalars)
    for name in names - {iv}:
        where = module.defs.get(name)
        if where is None or where == loop or module.inside(where, loop):
            return False
    return True
