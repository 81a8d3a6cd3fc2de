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
* the mask can be all-false on a whole tile at all (an ``!=`` of a moving index never is: such a
  loop is refused instead of rewritten into itself), and on a leading or trailing run of the
  loop's own iterations (:func:`.iterations.loop_uniform_runs`), and
* an iteration whose mask is all-false provably leaves every loop-carried value unchanged
  (:func:`.masked_iteration.unchanged_when_masked`: the online-softmax pattern, an additive mask,
  a runtime scale after the select (the bounds then stay as they are unless it is positive), FlexAttention's
  guards) or advances it by a loop-invariant step (pointer / offset induction; the initial value
  is then advanced by the skipped count, and its final value must be unused after the loop).

A loop whose tile position is carried through it with a data-dependent jump (FlexAttention's
templates) is tried again on a versioned copy (:mod:`.versioning`).

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

from .ir import (Module, constant_step, declared_pure, has_side_effect, increment_scalar, invariant_chain, loop_advances,
                 loop_label, no_select_reason, result_used_after, select_parts, substitute, type_of)
from .ir_syntax import TensorType, parse_for, parse_type, with_attribute
from .iterations import (NARROWED, PrefixSuffix, iteration_bound, mask_sets, no_wrap_in_loop, possible_runs,
                         loop_uniform_runs, scalars_fixed_in_loop, smax, smin, trip_count)
from .mask_analysis import Analysis
from .masked_iteration import NEG_INF, constant_kind, unchanged_when_masked
from .masks import IROps, Mask, UnreadableType
from .report import note
from .versioning import version_refused_loop


# --- iteration arguments advanced by a loop-invariant step -------------------------------------
def induction_steps(module: Module, loop: int) -> dict[int, tuple[str, str]]:
    """Iteration arguments advanced by a loop-invariant amount each iteration:
    position -> (op, increment value name) for ``arith.addi`` / ``tt.addptr``."""
    steps = {}
    for position, index in loop_advances(module, loop, ("arith.addi", "tt.addptr")).items():
        line = module.lines[index]
        increment = line.operands[1]
        scalar = increment_scalar(module, increment)
        # a splat or constant increment may sit in the loop (`k_ptrs += BLOCK_N * stride_kn` computes the
        # product there); its scalar must not change in the loop (it is recomputed before the loop)
        if scalar is not None and (scalar[0] == "constant" or invariant_chain(module, loop, scalar[1]) is not None):
            steps[position] = (line.op, increment)
    return steps


# --- the rewrite ------------------------------------------------------------------------------------
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
        analysis = Analysis(module, opaque_operands=True)
        mask = analysis.mask(parts[0])
        if mask is None or not 0 < mask.atoms() <= max_atoms:
            reasons.append(f"{name}: its mask is not an analysable index compare (or has over {max_atoms} compares)")
            continue
        if constant_kind(module, parts[2]) == NEG_INF:
            fill = parts[2]                                   # where(mask, x, -inf)
        elif constant_kind(module, parts[1]) == NEG_INF:
            fill, mask = parts[1], Mask("not", children=(mask,))   # where(~mask, -inf, x)
        else:
            reasons.append(f"{name}: neither operand is -inf")
            continue
        if not scalars_fixed_in_loop(module, loop, mask, head.iv, analysis.checks):
            reasons.append(f"{name}: its mask uses a scalar computed inside the loop")
            continue
        if not possible_runs(mask, head.iv)[1]:
            reasons.append(f"{name}: its mask is never provably all-false on a whole tile (a != of a moving "
                           "index, or an xor of two compares that are never both all-true or both all-false "
                           "on a whole tile), so no iteration could be dropped")
            continue
        leading, _, trailing = loop_uniform_runs(module, head, mask)
        if not (leading or trailing):
            reasons.append(f"{name}: no tile at the start or end of the loop's iterations is all-false: each such "
                           "run ends at or before its start for every value of the scalars its bounds and its mask "
                           "share")
            continue
        steps = induction_steps(module, loop)
        used_after = [position for position in steps if result_used_after(module, loop, position)]
        if used_after:
            reasons.append(f"{name}: the final value of the advanced iteration argument "
                           f"{head.iter_args[used_after[0]][0]} is used after the loop")
            continue
        others = set(range(len(head.iter_args))) - set(steps)
        proof = unchanged_when_masked(module, loop, select, fill, others)
        if proof is None:
            reasons.append(f"{name}: an all-false iteration is not proven to leave the loop state unchanged")
            continue
        try:
            _emit(module, loop, head, step, mask, analysis.checks, steps, proof.positive)
        except UnreadableType as unreadable:             # raised before the module changes
            reasons.append(f"{name}: {unreadable}")
            continue
        return None
    return "; ".join(reasons) or no_select_reason(module, loop)


def _describe(line) -> str:
    """``op`` of a line, saying when it is inline asm not declared pure."""
    return f"{line.op}, pure = false" if line.op == "tt.elementwise_inline_asm" and not declared_pure(line) else line.op


def narrowed_bounds(ops, lower, upper, step: int, mask: Mask, iv: str, checks, proven=None):
    """(new lower, new upper, skipped leading iterations) as i64 scalars: the loop's iterations
    minus the longest all-false prefix and suffix. The new bounds lie in ``[lower, upper]`` and
    ``skipped`` in ``[0, trips]``; the original bounds (nothing skipped) where the range is empty
    or reversed, an index computation could wrap somewhere in it, or the flag ``proven`` (the
    condition the all-false proof holds under; None: always) is false."""
    _, all_false = mask_sets(PrefixSuffix(ops, lower, upper), mask, iv)
    safe = ops.and_(ops.cmp("slt", lower, upper), no_wrap_in_loop(ops, lower, upper, iv, checks))
    if proven is not None:
        safe = ops.and_(safe, proven)
    leading = ops.ceil_div(ops.add(all_false[0], ops.mul(lower, -1)), step)
    skipped = ops.select(safe, smin(ops, smax(ops, leading, ops.const(0)), trip_count(ops, lower, upper, step)),
                         ops.const(0))
    new_lower = iteration_bound(ops, lower, upper, skipped, step)
    new_upper = ops.select(safe, smin(ops, smax(ops, all_false[1], new_lower), upper), upper)
    return new_lower, new_upper, skipped


def _positive(ops: IROps, scalars: tuple[str, ...]):
    """An i1 flag: every f32 scalar in ``scalars`` is greater than zero (None when there is none)."""
    flag = None
    for scalar in scalars:
        zero = ops.emit(("f32", 0.0), "arith.constant 0.000000e+00 : f32")
        above = ops.emit(("ogt", scalar), f"arith.cmpf ogt, {scalar}, {zero} : f32")
        flag = above if flag is None else ops.and_(flag, above)
    return flag


def _emit(module: Module, loop: int, head, step: int, mask: Mask, checks, steps, positive: tuple[str, ...]) -> None:
    line = module.lines[loop]
    ops = IROps(module, line.indent, module.lines[module.end_of(loop)].loc)
    new_lower, new_upper, skipped = narrowed_bounds(ops, ops.leaf(head.lower), ops.leaf(head.upper), step, mask,
                                                    head.iv, checks, _positive(ops, positive))
    narrow = {name: ops.emit(("trunc", wide), f"arith.trunci {wide} : i64 to i32")     # exact: inside the i32 range
              for name, wide in (("lower", new_lower), ("upper", new_upper))}
    inits = {}
    for position, (op, increment) in steps.items():
        inits[position] = _advanced_init(module, ops, loop, head.iter_args[position][1], op, increment, skipped)
    text = line.text
    text = text.replace(f" = {head.lower} to {head.upper} step ", f" = {narrow['lower']} to {narrow['upper']} step ", 1)
    for position, init in inits.items():
        arg, old = head.iter_args[position]
        text = text.replace(f"{arg} = {old}", f"{arg} = {init}", 1)
    texts = [l.text for l in module.lines]
    end = module.end_of(loop)
    texts[end] = with_attribute(texts[end], NARROWED)
    module.replace(texts[:loop] + ops.lines + [text] + texts[loop + 1:])


def _advanced_init(module: Module, ops: IROps, loop: int, init: str, op: str, increment: str, count: str) -> str:
    """``init`` advanced ``count`` times by ``increment`` (scalar or splat / constant tensor). An
    integer counter advances by ``increment * count`` in its own width (wrapping as ``count``
    separate additions would); a pointer by an i64 offset (``count`` separate pointer increments
    never wrap at 32 bits). An increment scalar computed in the loop is computed again before it."""
    increment_type = parse_type(type_of(module, increment) or "")
    kind, scalar = increment_scalar(module, increment)
    if kind == "value":
        scalar64 = ops.as_i64(_computed_before(module, ops, loop, scalar), typed_as=scalar)
    else:
        scalar64 = ops.const(scalar)
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


def _computed_before(module: Module, ops: IROps, loop: int, name: str) -> str:
    """``name``, or where the loop computes it (from values defined before it: :func:`.ir.invariant_chain`),
    a copy of that computation emitted into ``ops`` in front of the loop."""
    copies: dict[str, str] = {}
    for index in invariant_chain(module, loop, name):
        line = module.lines[index]
        text = line.text.strip()
        copy = module.fresh("skip")
        for old, new in [(line.results[0], copy), *copies.items()]:
            text = substitute(text, old, new)
        copies[line.results[0]] = copy
        ops.lines.append(f"{ops.indent}{text}")
    return copies.get(name, name)


def run(text: str, options) -> tuple[str, dict[str, int]]:
    module = Module(text)
    counts = {"loops_narrowed": 0}
    for loop in reversed(module.loops()):
        where = loop_label(module, loop)
        reason = skip_loop(module, loop, options["max_atoms"])
        if reason is not None:
            versioned, reason = version_refused_loop(
                module, loop, reason, lambda fast_module, fast, _: skip_loop(fast_module, fast, options["max_atoms"]))
            if versioned:
                counts["loops_versioned"] = counts.get("loops_versioned", 0) + 1  # only when one was
        if reason is None:
            counts["loops_narrowed"] += 1
        else:
            note(f"{where} left as it is: {reason}")
    return (module.text() if any(counts.values()) else text), counts
