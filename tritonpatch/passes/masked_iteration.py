"""What one all-false iteration of a loop does to its state: the proof behind ``skip-masked-blocks``.

An iteration whose select ``where(mask, x, -inf)`` returns ``-inf`` on the whole tile may be
dropped when it hands every loop-carried value on unchanged. :func:`unchanged_when_masked` proves
that by abstract interpretation of the body: each value is one of a few kinds (``-inf``, ``0``,
``1``, a positive constant, "never -inf", a dot of loaded tiles, ``true`` / ``false``, or an
iteration argument passed on through shape ops) or unknown, and the iteration is dropped only when every carried value ends up
as the argument it came from.

The rules assume finite inputs (``m`` and ``v`` of the online softmax, and a dot of loaded tiles
such as ``q @ k``): ``-inf - m = -inf``, ``m - m = 0``, ``0 * finite = 0``, ``0 @ v = 0``, and
``q @ k + (-inf) = -inf`` (an additive mask, ``qk += where(mask, 0, -inf)``). Where a loaded or
computed input is not finite, the unpatched kernel's output is not finite either (NaN or inf
reach the rows the tile touches), so the rewrite is exact wherever the unpatched output is
finite, up to the sign of a zero.

A runtime scale after the select (``where(mask, qk, -inf) * scale``, ``scale`` a float scalar
fixed in the loop) keeps ``-inf`` only for ``scale > 0``: the proof then holds under that
condition, and it names the scalars (:class:`Proof`) for the pass to check before the loop.

Every select on the same mask takes the arm the mask gives it (backward's ``where(mask, ds, 0)``),
and ``where(x == -inf, c, x)`` with a finite constant ``c`` is "never -inf" (the backward's guarded
log-sum-exp, so ``-inf - lse = -inf``).

FlexAttention's ``ROWS_GUARANTEED_SAFE=False`` guard, ``m_masked = where(m_new == -inf, 0,
m_new)``, makes the iteration depend on whether a row's running maximum is still ``-inf``. The proof
then runs in two worlds, row by row:

* rows whose running maximum is finite: the compare is false and the usual rules apply;
* rows whose running maximum is ``-inf``: there the other state is exactly zero (it starts at zero
  next to ``m = -inf``; an iteration keeping ``m' = max(m, rowmax(T)) = -inf`` has an all ``-inf``
  row in ``T`` and so adds nothing: checked by interpreting any iteration with ``T = -inf``), and
  the iteration must leave ``-inf`` and the zeros as they are.

This reading per row needs every operation on the state to be row-local (elementwise ops, reduces
and broadcasts along the other axes, the state as the left operand or accumulator of a dot); a
loop where it is not is refused.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .ir import Module, region_ops, type_of
from .ir_syntax import TensorType, base_name, int_width, parse_for, parse_type

NEG_INF, ZERO, ONE, POSITIVE = ("-inf",), ("0",), ("1",), ("+",)
NOT_NEG_INF = ("not -inf",)
LOADED_PRODUCT = ("dot of loaded tiles",)        # finite under the finite-inputs assumption
TRUE, FALSE = ("true",), ("false",)
_FINITE = (ZERO, ONE, POSITIVE)
_NEG_INF_BITS = {"0xFF800000", "0xFC00", "0xFF80", "0xFFF0000000000000"}
_SHAPE_OPS = ("tt.expand_dims", "tt.broadcast", "tt.splat", "ttg.convert_layout")
_LOADED_VIA = _SHAPE_OPS + ("tt.trans", "arith.extf", "arith.truncf")
_MAX_OPS = ("arith.maxnumf", "arith.maximumf")


# --- kinds of values ---------------------------------------------------------------------------
def constant_kind(module: Module, name: str):
    """NEG_INF / ZERO / ONE / POSITIVE for a float constant (splat or scalar), NOT_NEG_INF for a
    guarded value ``where(x == -inf, c, x)`` (``c`` finite; seen through shape ops), else None."""
    index = module.defs.get(base_name(name))
    if index is None or index < 0 or "#" in name:
        return None
    line = module.lines[index]
    if line.op in _SHAPE_OPS and len(line.operands) == 1:
        return constant_kind(module, line.operands[0])
    if line.op == "arith.select" and _guards_neg_inf(module, line):
        return NOT_NEG_INF
    if line.op != "arith.constant":
        return None
    match = re.match(r"\s*(?:dense<)?([^>:\s]+)>?\s*:", line.body)
    if not match:
        return None
    literal = match.group(1)
    if literal.upper().replace("0X", "0x") in _NEG_INF_BITS:
        return NEG_INF
    try:
        value = float(literal)
    except ValueError:
        return None
    if value == 0.0 and not literal.startswith("-"):
        return ZERO
    if value == 1.0:
        return ONE
    return POSITIVE if value > 0 and value != float("inf") else None


def _guards_neg_inf(module: Module, line) -> bool:
    """Whether the select ``line`` is ``where(x == -inf, c, x)`` with ``c`` a finite constant."""
    if len(line.operands) != 3:
        return False
    condition, replacement, value = line.operands
    index = module.defs.get(base_name(condition))
    compare = module.lines[index] if index is not None and index >= 0 else None
    if compare is None or compare.op != "arith.cmpf" or not compare.body.startswith("oeq"):
        return False
    sides = compare.operands
    return len(sides) == 2 and value in sides and constant_kind(module, sides[1 - sides.index(value)]) == NEG_INF \
        and constant_kind(module, replacement) in _FINITE


def _reduce_kind(module: Module, index: int):
    """"max" or "add" for a single-operand tt.reduce with that combiner, else None."""
    ops = [op for op in region_ops(module, index) if op != "tt.reduce.return"]
    if len(module.lines[index].operands) != 1 or len(ops) != 1:
        return None
    return {"arith.maxnumf": "max", "arith.maximumf": "max", "arith.addf": "add"}.get(ops[0])


def _is_state(value) -> bool:
    return value is not None and value[0] == "arg"


def _loaded(module: Module, name: str) -> bool:
    """Whether ``name`` is a loaded tile, seen through shape ops, transposes and float casts."""
    index = module.defs.get(base_name(name))
    if index is None or index < 0 or "#" in name:
        return False
    line = module.lines[index]
    if line.op == "tt.load":
        return True
    return line.op in _LOADED_VIA and len(line.operands) == 1 and _loaded(module, line.operands[0])


def _fixed_scalar(module: Module, loop: int, name: str) -> str | None:
    """The f32 scalar ``name`` is (or is a splat of, through shape ops) when that scalar is defined
    outside ``loop`` (a kernel argument, or computed before the loop), else None."""
    index = module.defs.get(base_name(name))
    if index is None or "#" in name:
        return None
    if index >= 0 and module.lines[index].op in _SHAPE_OPS and len(module.lines[index].operands) == 1:
        return _fixed_scalar(module, loop, module.lines[index].operands[0])
    if type_of(module, name) != "f32" or index == loop or (index >= 0 and module.inside(index, loop)):
        return None                                    # index == loop: an iteration argument
    return name


@dataclass(frozen=True)
class Proof:
    """An all-false iteration provably leaves the state unchanged wherever every scalar in
    ``positive`` is greater than zero (none: unconditionally)."""
    positive: tuple[str, ...] = ()


class _Interpretation:
    """One abstract run of the loop body. ``finite_state``: the world where every running maximum
    is finite (a compare of the state with -inf is false there); ``used_finiteness`` records
    whether a verdict relied on that."""

    def __init__(self, module: Module, env: dict, finite_state: bool):
        self.module, self.env, self.finite_state = module, env, finite_state
        self.used_finiteness = False
        self.positive: dict[str, None] = {}    # scalars assumed > 0 (-inf * scale = -inf), in order
        self.loop = -1

    def kind(self, name: str):
        if "#" in name:
            return None
        return self.env[name] if name in self.env else constant_kind(self.module, name)

    def transfer(self, index: int):
        """Abstract value of the op at ``index`` (None: unknown)."""
        module, line = self.module, self.module.lines[index]
        args = [self.kind(v) for v in line.operands]
        if line.op == "tt.reduce":
            kind = _reduce_kind(module, index)
            if (kind, args[0] if args else None) in (("max", NEG_INF), ("add", ZERO)):
                return args[0]
            return None
        if line.op == "arith.constant" or (line.op == "tt.splat" and args == [None]):
            return constant_kind(module, line.results[0])
        if line.op in _SHAPE_OPS:
            value = args[0] if args else None
            return value + ((line.op, line.body),) if _is_state(value) else value
        if line.op in ("arith.truncf", "arith.extf"):
            return args[0] if args[0] in (NEG_INF, ZERO, ONE) else None
        if line.op == "arith.cmpf":
            return self._compare(line, args)
        if line.op == "arith.select" and len(args) == 3:
            if args[0] in (TRUE, FALSE):
                return args[1] if args[0] == TRUE else args[2]
            if _guards_neg_inf(module, line):
                return NOT_NEG_INF
            return args[1] if args[1] is not None and args[1] == args[2] else None
        if line.op in ("math.exp2", "math.exp"):
            return {NEG_INF: ZERO, ZERO: ONE}.get(args[0])
        if line.op == "arith.mulf" and len(args) == 2 and NEG_INF in args and args.count(None) == 1:
            scale = _fixed_scalar(module, self.loop, line.operands[args.index(None)])
            if scale is not None:
                self.positive[scale] = None
                return NEG_INF                     # -inf * scale for scale > 0
        if line.op == "tt.dot" and len(args) >= 3 and ZERO not in args[:2] \
                and args[2] in (ZERO, LOADED_PRODUCT, NEG_INF) and all(_loaded(module, v) for v in line.operands[:2]):
            return NEG_INF if args[2] == NEG_INF else LOADED_PRODUCT   # q @ k + acc: Triton folds the add into acc
        if len(args) != 2 and line.op != "tt.dot":
            return None
        return self._arithmetic(line.op, args)

    def _compare(self, line, args):
        """``x == -inf`` / ``x != -inf`` for x of a known kind, or of the state where its running
        maximum is finite."""
        pred = line.body.split(",", 1)[0].strip()
        if pred not in ("oeq", "une") or len(args) != 2 or NEG_INF not in args:
            return None
        other = args[1] if args[0] == NEG_INF else args[0]
        if other == NEG_INF:
            equal = True
        elif other in _FINITE + (NOT_NEG_INF,):
            equal = False
        elif _is_state(other) and self.finite_state:
            self.used_finiteness = True
            equal = False
        else:
            return None
        return TRUE if equal == (pred == "oeq") else FALSE

    @staticmethod
    def _arithmetic(op: str, args):
        if op in _MAX_OPS:
            return args[0] if args[1] == NEG_INF else args[1] if args[0] == NEG_INF else None
        if op == "arith.mulf":
            if ONE in args:
                return args[1] if args[0] == ONE else args[0]
            if ZERO in args:
                other = args[1] if args[0] == ZERO else args[0]
                return ZERO if other in _FINITE + (LOADED_PRODUCT,) or _is_state(other) else None     # 0 * finite
            return NEG_INF if args in ([NEG_INF, POSITIVE], [POSITIVE, NEG_INF]) else None
        if op == "arith.addf":
            if NEG_INF in args and (args[1] if args[0] == NEG_INF else args[0]) in _FINITE + (LOADED_PRODUCT,):
                return NEG_INF                    # finite + -inf (an additive mask)
            return args[0] if args[1] == ZERO else args[1] if args[0] == ZERO else None
        if op == "arith.subf":
            if _is_state(args[0]) and args[0] == args[1]:
                return ZERO                       # m - m = 0 for finite m
            if args[0] == NEG_INF and (args[1] in _FINITE + (NOT_NEG_INF, LOADED_PRODUCT) or _is_state(args[1])):
                return NEG_INF                    # -inf - x for x never -inf
            return None
        if op == "tt.dot" and len(args) >= 3:
            return args[2] if ZERO in args[:2] else None
        return None

    def run(self, loop: int, fixed: dict) -> list:
        """The abstract values the body yields, with the values named in ``fixed`` fixed."""
        module = self.module
        children = module.children(loop)
        self.loop = loop
        self.env.update(fixed)
        for index in children[:-1]:
            line = module.lines[index]
            if len(line.results) == 1 and line.results[0] not in fixed:
                self.env[line.results[0]] = self.transfer(index)
        yielded = module.lines[children[-1]]
        return [self.kind(base_name(v)) if "#" not in v else None for v in yielded.operands] \
            if yielded.op == "scf.yield" else []


# --- the proof -------------------------------------------------------------------------------------
def unchanged_when_masked(module: Module, loop: int, select: int, fill: str, carried: set[int]) -> Proof | None:
    """Whether an iteration in which ``select`` returns ``fill`` on the whole tile yields, for every
    iteration argument in ``carried``, exactly the value it received (both worlds of the module
    docstring where the body compares its state with -inf): the :class:`Proof` and the condition
    it holds under, or None."""
    head = parse_for(module.lines[loop])
    condition, true_value, _ = module.lines[select].operands
    masked_condition = FALSE if fill != true_value else TRUE
    env = {name: ("arg", position) for position, (name, _) in enumerate(head.iter_args)}
    finite = _Interpretation(module, env, finite_state=True)
    result = module.lines[select].results[0]
    yielded = finite.run(loop, {base_name(condition): masked_condition, result: constant_kind(module, fill)})
    if not yielded or not all(yielded[i] == ("arg", i) for i in carried):
        return None
    if not finite.used_finiteness:
        return Proof(tuple(finite.positive))
    second = _unchanged_where_maximum_is_neg_inf(module, loop, select, carried, finite.env)
    return None if second is None else Proof(tuple(dict.fromkeys((*finite.positive, *second))))


def _unchanged_where_maximum_is_neg_inf(module: Module, loop: int, select: int, carried: set[int],
                                        masked_values: dict) -> tuple[str, ...] | None:
    """The second world: rows whose running maximum is -inf (see the module docstring).
    ``masked_values``: the abstract values of the masked iteration in the first world. Returns the
    scalars this world assumed positive, or None where it does not hold."""
    head = parse_for(module.lines[loop])
    children = module.children(loop)
    yielded = module.lines[children[-1]].operands
    running = _running_maximum(module, loop, head, yielded)
    if running is None:
        return None
    position, scores = running
    state = [p for p in sorted(carried) if _is_float_tensor(head.result_types[p])]
    if position not in state:
        return None
    inits = {p: constant_kind(module, head.iter_args[p][1]) for p in state}
    if inits[position] != NEG_INF or any(inits[p] != ZERO for p in state if p != position):
        return None
    if not _row_local(module, loop, head, state, scores):
        return None
    env = {name: ("arg", p) for p, (name, _) in enumerate(head.iter_args)}
    env.update({head.iter_args[p][0]: NEG_INF if p == position else ZERO for p in state})
    # Any iteration whose scores row is all -inf, the masked one included (the select's own value
    # is left unknown, so nothing may depend on it other than through the scores).
    world = _Interpretation(module, env, finite_state=False)
    values = world.run(loop, {module.lines[select].results[0]: None, module.lines[scores].results[0]: NEG_INF})
    if masked_values.get(module.lines[scores].results[0]) != NEG_INF:
        return None                 # a masked iteration must have all -inf scores
    expected = {p: NEG_INF if p == position else ZERO for p in state}
    if not all(values[p] == expected.get(p, ("arg", p)) for p in carried):
        return None
    return tuple(world.positive)


def _running_maximum(module: Module, loop: int, head, yielded: list[str]):
    """(position, scores line) of the iteration argument yielded as ``max(m, rowmax(scores))``."""
    for position, value in enumerate(yielded):
        index = module.defs.get(base_name(value))
        if index is None or "#" in value or not module.inside(index, loop):
            continue
        line = module.lines[index]
        if line.op not in _MAX_OPS or head.iter_args[position][0] not in line.operands:
            continue
        other = [v for v in line.operands if v != head.iter_args[position][0]]
        reduce_at = module.defs.get(base_name(other[0])) if len(other) == 1 else None
        if reduce_at is None or module.lines[reduce_at].op != "tt.reduce" or _reduce_kind(module, reduce_at) != "max":
            continue
        scores = module.defs.get(base_name(module.lines[reduce_at].operands[0]))
        if scores is not None and module.parent_of[scores] == loop and len(module.lines[scores].results) == 1:
            return position, scores
    return None


def _is_float_tensor(type_text: str) -> bool:
    parsed = parse_type(type_text)
    return isinstance(parsed, TensorType) and int_width(parsed) is None and parsed.element.startswith(("f", "bf"))


def _row_local(module: Module, loop: int, head, state: list[int], scores: int) -> bool:
    """Whether every op on the state (or on the scores) keeps rows apart: row r of its result
    depends only on row r of the state (axis 0)."""
    tainted = {head.iter_args[p][0] for p in state} | {module.lines[scores].results[0]}
    for index in module.children(loop):
        line = module.lines[index]
        used = [v for v in line.operands if base_name(v) in tainted]
        if index == scores or not module.uses(index) & tainted:
            continue
        if line.opens and line.op != "tt.reduce" or not _keeps_rows(module, line, used):
            return False
        tainted.update(line.results)
    return True


def _keeps_rows(module: Module, line, used: list[str]) -> bool:
    axis = re.search(r"axis = (\d+)", line.body)
    if line.op == "scf.yield" or line.op in ("arith.truncf", "arith.extf", "ttg.convert_layout"):
        return True
    if line.op.startswith(("arith.", "math.")):
        return True                                    # elementwise
    if line.op in ("tt.expand_dims", "tt.reduce"):
        return axis is not None and int(axis.group(1)) >= 1
    if line.op == "tt.broadcast":
        source = parse_type(type_of(module, line.operands[0]) or "")
        result = parse_type(type_of(module, line.results[0]) or "")
        return isinstance(source, TensorType) and isinstance(result, TensorType) and \
            source.shape[:1] == result.shape[:1]
    if line.op == "tt.dot":
        return line.operands[1] not in used
    return False
