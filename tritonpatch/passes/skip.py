"""``skip-masked-blocks``: narrow a loop's bounds to drop leading / trailing all-false tiles.

Applies to ``scf.for %iv = %lb to %ub step C`` (C a positive constant) whose body holds
``select(%mask, %x, -inf)`` (or ``select(%mask, -inf, %x)``, skipping where the mask is all-true)
with an analysable mask (:mod:`.masks`) whose scalars are the
induction variable or loop-invariant, when

* the induction variable is 32-bit (a 64-bit one never takes part in an analysable mask, and its
  bound arithmetic could overflow),
* nothing in the body may have a side effect (an allow-list of operations known to have none:
  a store, an atomic, a print, a call, impure inline assembly, a volatile load or any operation the
  list does not know makes the pass refuse the loop, since a dropped iteration would drop it),
* the mask can be all-false on a whole tile at all (an xor of compares or an ``==`` of a moving
  index never is: such a loop is refused instead of rewritten into itself), and
* an iteration whose mask is all-false provably leaves every loop-carried value unchanged
  (:func:`unchanged_when_masked`, the online-softmax pattern) or advances it by a loop-invariant
  step (pointer / offset induction; the initial value is then advanced by the skipped count, and
  its final value must be unused after the loop).

Each compare is affine in ``%iv``, so the iterations where it is all-true / all-false form
half-lines; the pass computes, before the loop, the longest prefix and suffix of iterations on
which the whole mask is all-false (as runtime scalars) and runs the loop on the rest only. The
new bounds never leave the original range (an empty or reversed range keeps its bounds). The
loop stays an ``scf.for`` with a constant step, so Triton's software pipelining still applies.
Every loop the pass leaves alone gets its reason in the pass's report notes
(``tritonpatch.passes.note``; logged at INFO).

Exactness: an all-false iteration computes ``m' = max(m, -inf) = m``, ``alpha = exp2(m - m') = 1``,
``p = exp2(-inf - m') = 0``, ``l' = l * 1 + 0 = l``, ``acc' = acc * 1 + 0 @ v = acc``: identical
when ``m`` and ``v`` are finite. Where the unpatched kernel meets an all-false tile with ``m = -inf``
(or non-finite ``v``), it produces NaN for those rows: the rewrite is exact wherever the unpatched
output is finite, up to the sign of a zero accumulator (``-0 + 0 = +0``).
"""
from __future__ import annotations

import re

from .ir import Module, constant_step, declared_pure, has_side_effect, select_parts, type_of
from .ir_syntax import TensorType, base_name, int_width, parse_for, parse_type, with_attribute
from .iterations import (NARROWED, PrefixSuffix, iteration_bound, mask_sets, no_wrap_in_loop, possible_runs,
                         scalars_fixed_in_loop, smax, smin, trip_count)
from .mask_analysis import Analysis
from .masks import IROps, Mask
from .report import note

NEG_INF, ZERO, ONE, POSITIVE = ("-inf",), ("0",), ("1",), ("+",)
_NEG_INF_BITS = {"0xFF800000", "0xFC00", "0xFF80", "0xFFF0000000000000"}


# --- loop-carried values in an all-false iteration ----------------------------------------------
def _constant_kind(module: Module, name: str):
    """NEG_INF / ZERO / ONE / POSITIVE for a float constant (splat or scalar), else None."""
    index = module.defs.get(base_name(name))
    if index is None or index < 0:
        return None
    line = module.lines[index]
    if line.op == "tt.splat" and len(line.operands) == 1:
        return _constant_kind(module, line.operands[0])
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


def _reduce_kind(module: Module, index: int):
    """"max" or "add" for a single-operand tt.reduce with that combiner, else None."""
    ops = [module.lines[i].op for i in range(index + 1, module.end_of(index))
           if module.lines[i].op and not module.lines[i].text.lstrip().startswith("^")]
    ops = [op for op in ops if op not in ("tt.reduce.return", "}")]
    if len(module.lines[index].operands) != 1 or len(ops) != 1:
        return None
    return {"arith.maxnumf": "max", "arith.maximumf": "max", "arith.addf": "add"}.get(ops[0])


def _transfer(module: Module, index: int, env: dict):
    """Abstract value of the op at ``index`` in an all-false iteration (None: unknown)."""
    line = module.lines[index]
    args = [None if "#" in v else env[v] if v in env else _constant_kind(module, v) for v in line.operands]
    if line.op == "tt.reduce":
        kind = _reduce_kind(module, index)
        if (kind, args[0] if args else None) in (("max", NEG_INF), ("add", ZERO)):
            return args[0]
        return None
    if line.op == "arith.constant" or (line.op == "tt.splat" and args == [None]):
        return _constant_kind(module, line.results[0])
    if line.op in ("tt.expand_dims", "tt.broadcast", "tt.splat", "ttg.convert_layout"):
        value = args[0]
        if value is None or value[0] != "arg":
            return value
        return value + ((line.op, line.body),)
    if line.op in ("arith.truncf", "arith.extf"):
        return args[0] if args[0] in (NEG_INF, ZERO, ONE) else None
    if line.op == "arith.select" and len(args) == 3:
        return args[1] if args[1] is not None and args[1] == args[2] else None
    if line.op in ("math.exp2", "math.exp"):
        return {NEG_INF: ZERO, ZERO: ONE}.get(args[0])
    if len(args) != 2 and line.op != "tt.dot":
        return None
    if line.op in ("arith.maxnumf", "arith.maximumf"):
        return args[0] if args[1] == NEG_INF else args[1] if args[0] == NEG_INF else None
    if line.op == "arith.mulf":
        if ONE in args:
            return args[1] if args[0] == ONE else args[0]
        return NEG_INF if args in ([NEG_INF, POSITIVE], [POSITIVE, NEG_INF]) else None
    if line.op == "arith.addf":
        return args[0] if args[1] == ZERO else args[1] if args[0] == ZERO else None
    if line.op == "arith.subf":
        if args[0] is not None and args[0] == args[1] and args[0][0] == "arg":
            return ZERO                       # m - m = 0 for finite m
        if args[0] == NEG_INF and (args[1] in (ZERO, ONE, POSITIVE) or (args[1] or ("",))[0] == "arg"):
            return NEG_INF                    # -inf - finite m
        return None
    if line.op == "tt.dot" and len(args) >= 3:
        return args[2] if ZERO in args[:2] else None
    return None


def unchanged_when_masked(module: Module, loop: int, select: int, fill: str, carried: set[int]) -> bool:
    """Whether an iteration in which ``select`` returns ``fill`` yields, for every iteration
    argument in ``carried``, exactly the value it received."""
    head = parse_for(module.lines[loop])
    env = {name: ("arg", position) for position, (name, _) in enumerate(head.iter_args)}
    children = module.children(loop)
    for index in children[:-1]:
        line = module.lines[index]
        if index == select:
            env[line.results[0]] = _constant_kind(module, fill)
        elif len(line.results) == 1:
            env[line.results[0]] = _transfer(module, index, env)
    yielded = module.lines[children[-1]]
    if yielded.op != "scf.yield":
        return False
    operands = yielded.operands
    return all(env.get(base_name(operands[i])) == ("arg", i) for i in carried)


def induction_steps(module: Module, loop: int) -> dict[int, tuple[str, str]]:
    """Iteration arguments advanced by a loop-invariant amount each iteration:
    position -> (op, increment value name) for ``arith.addi`` / ``tt.addptr``."""
    head = parse_for(module.lines[loop])
    yielded = module.lines[module.children(loop)[-1]]
    steps = {}
    for position, value in enumerate(yielded.operands):
        index = module.defs.get(base_name(value))
        if index is None or "#" in value or not module.inside(index, loop):
            continue
        line = module.lines[index]
        operands = line.operands
        if line.op in ("arith.addi", "tt.addptr") and len(operands) == 2 and operands[0] == head.iter_args[position][0]:
            increment = operands[1]
            where = module.defs.get(base_name(increment))
            if where is not None and not module.inside(where, loop) and where != loop \
                    and _increment_scalar(module, increment) is not None:
                steps[position] = (line.op, increment)
    return steps


def _increment_scalar(module: Module, increment: str):
    """("value", name) / ("constant", int) of the scalar an increment is (or splats), None for
    other tensors (their advance by a count is not expressible as one scalar product)."""
    increment_type = parse_type(type_of(module, increment) or "")
    if not isinstance(increment_type, TensorType):
        return ("value", increment) if int_width(increment_type) in (32, 64) else None
    source = module.lines[module.defs[base_name(increment)]]
    if source.op == "tt.splat" and len(source.operands) == 1:
        return ("value", source.operands[0])
    constant = re.match(r"\s*dense<(-?\d+)>", source.body) if source.op == "arith.constant" else None
    return ("constant", int(constant.group(1))) if constant else None


# --- the rewrite ------------------------------------------------------------------------------------
def _result_used_after(module: Module, loop: int, position: int) -> bool:
    """Whether result ``position`` of the loop is used after it."""
    results = module.lines[loop].results
    if not results:
        return False
    token = f"{results[0]}#{position}" if len(parse_for(module.lines[loop]).iter_args) > 1 else results[0]
    pattern = re.compile(re.escape(token) + r"(?![A-Za-z0-9_$.\-#])")
    return any(pattern.search(module.lines[i].body) for i in range(module.end_of(loop) + 1, len(module.lines)))


def skip_loop(module: Module, loop: int, max_atoms: int) -> str | None:
    """Narrow the bounds of one loop. Returns None when it did, else why not (module untouched)."""
    head = parse_for(module.lines[loop])
    step = constant_step(module, head.step)
    if step is None:
        return "its step is not a positive constant"
    if head.iv_type != "i32":
        return f"its induction variable is {head.iv_type}, not i32"
    for index in range(loop + 1, module.end_of(loop)):
        if has_side_effect(module.lines[index]):
            return f"its body has an operation that may have a side effect ({_describe(module.lines[index])})"
    reasons = []
    for select in module.children(loop):
        parts = select_parts(module, select)
        if parts is None:
            continue
        name = module.lines[select].results[0]
        analysis = Analysis(module)
        mask = analysis.mask(parts[0])
        if mask is None or not 0 < mask.atoms() <= max_atoms:
            reasons.append(f"{name}: its mask is not an analysable index compare (or has over {max_atoms} compares)")
            continue
        if _constant_kind(module, parts[2]) == NEG_INF:
            fill = parts[2]                                   # where(mask, x, -inf)
        elif _constant_kind(module, parts[1]) == NEG_INF:
            fill, mask = parts[1], Mask("not", children=(mask,))   # where(~mask, -inf, x)
        else:
            reasons.append(f"{name}: neither operand is -inf")
            continue
        if not scalars_fixed_in_loop(module, loop, mask, head.iv, analysis.checks):
            reasons.append(f"{name}: its mask uses a scalar computed inside the loop")
            continue
        if not possible_runs(mask, head.iv)[1]:
            reasons.append(f"{name}: its mask is never provably all-false on a whole tile (xor, == or != of a "
                           "moving index), so no iteration could be dropped")
            continue
        steps = induction_steps(module, loop)
        used_after = [position for position in steps if _result_used_after(module, loop, position)]
        if used_after:
            reasons.append(f"{name}: the final value of the advanced iteration argument "
                           f"{head.iter_args[used_after[0]][0]} is used after the loop")
            continue
        others = set(range(len(head.iter_args))) - set(steps)
        if not unchanged_when_masked(module, loop, select, fill, others):
            reasons.append(f"{name}: an all-false iteration is not proven to leave the loop state unchanged")
            continue
        _emit(module, loop, head, step, mask, analysis.checks, steps)
        return None
    return "; ".join(reasons) or "its body has no tensor select (tl.where)"


def _describe(line) -> str:
    """``op`` of a line, saying when it is inline asm not declared pure."""
    return f"{line.op}, pure = false" if line.op == "tt.elementwise_inline_asm" and not declared_pure(line) else line.op


def narrowed_bounds(ops, lower, upper, step: int, mask: Mask, iv: str, checks):
    """(new lower, new upper, skipped leading iterations) as i64 scalars: the loop's iterations
    minus the longest all-false prefix and suffix. The new bounds lie in ``[lower, upper]`` and
    ``skipped`` in ``[0, trips]``; the original bounds (nothing skipped) where the range is empty
    or reversed, or an index computation could wrap somewhere in it."""
    _, all_false = mask_sets(PrefixSuffix(ops, lower, upper), mask, iv)
    safe = ops.and_(ops.cmp("slt", lower, upper), no_wrap_in_loop(ops, lower, upper, iv, checks))
    leading = ops.ceil_div(ops.add(all_false[0], ops.mul(lower, -1)), step)
    skipped = ops.select(safe, smin(ops, smax(ops, leading, ops.const(0)), trip_count(ops, lower, upper, step)),
                         ops.const(0))
    new_lower = iteration_bound(ops, lower, upper, skipped, step)
    new_upper = ops.select(safe, smin(ops, smax(ops, all_false[1], new_lower), upper), upper)
    return new_lower, new_upper, skipped


def _emit(module: Module, loop: int, head, step: int, mask: Mask, checks, steps) -> None:
    line = module.lines[loop]
    ops = IROps(module, line.indent, module.lines[module.end_of(loop)].loc)
    new_lower, new_upper, skipped = narrowed_bounds(ops, ops.leaf(head.lower), ops.leaf(head.upper), step, mask,
                                                    head.iv, checks)
    narrow = {name: ops.emit(("trunc", wide), f"arith.trunci {wide} : i64 to i32")     # exact: inside the i32 range
              for name, wide in (("lower", new_lower), ("upper", new_upper))}
    inits = {}
    for position, (op, increment) in steps.items():
        inits[position] = _advanced_init(module, ops, head.iter_args[position][1], op, increment, skipped)
    text = line.text
    text = text.replace(f" = {head.lower} to {head.upper} step ", f" = {narrow['lower']} to {narrow['upper']} step ", 1)
    for position, init in inits.items():
        arg, old = head.iter_args[position]
        text = text.replace(f"{arg} = {old}", f"{arg} = {init}", 1)
    texts = [l.text for l in module.lines]
    end = module.end_of(loop)
    texts[end] = with_attribute(texts[end], NARROWED)
    module.replace(texts[:loop] + ops.lines + [text] + texts[loop + 1:])


def _advanced_init(module: Module, ops: IROps, init: str, op: str, increment: str, count: str) -> str:
    """``init`` advanced ``count`` times by ``increment`` (scalar or splat / constant tensor). An
    integer counter advances by ``increment * count`` in its own width (wrapping as ``count``
    separate additions would); a pointer by an i64 offset (``count`` separate pointer increments
    never wrap at 32 bits)."""
    increment_type = parse_type(type_of(module, increment) or "")
    kind, scalar = _increment_scalar(module, increment)
    scalar64 = ops.leaf(scalar) if kind == "value" else ops.const(scalar)
    element = increment_type.element if isinstance(increment_type, TensorType) else increment_type
    offset_element = "i64" if op == "tt.addptr" else element
    total = ops.emit(("muli", scalar64, count), f"arith.muli {scalar64}, {count} : i64")
    if offset_element != "i64":
        total = ops.emit(("trunc", total, offset_element), f"arith.trunci {total} : i64 to {offset_element}")
    offset_type = increment_type.text(element=offset_element) if isinstance(increment_type, TensorType) \
        else offset_element
    if isinstance(increment_type, TensorType):
        total = ops.emit(("splat", total, offset_type), f"tt.splat {total} : {offset_element} -> {offset_type}")
    init_type = type_of(module, init)
    advanced = module.fresh("skip")
    operand_types = f"{init_type}, {offset_type}" if op == "tt.addptr" else init_type
    ops.lines.append(f"{ops.indent}{advanced} = {op} {init}, {total} : {operand_types} {ops.loc}".rstrip())
    return advanced


def run(text: str, options) -> tuple[str, dict[str, int]]:
    module = Module(text)
    counts = {"loops_narrowed": 0}
    for loop in reversed(module.loops()):
        where = f"loop {parse_for(module.lines[loop]).iv} (line {loop + 1})"
        reason = skip_loop(module, loop, options["max_atoms"])
        if reason is None:
            counts["loops_narrowed"] += 1
        else:
            note(f"{where} left as it is: {reason}")
    return (module.text() if any(counts.values()) else text), counts
