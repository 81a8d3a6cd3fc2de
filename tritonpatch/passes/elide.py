"""``elide-uniform-masks``: run the tiles where the mask is uniform in loops without the mask.

For ``%r = arith.select %mask, %x, %c`` directly in an ``scf.for`` body, with ``%mask`` an
analysable combination of affine index compares (:mod:`.masks`) whose scalars are the induction
variable or fixed before the loop, the pass computes in front of the loop (scalar interval
arithmetic, :func:`.iterations.segment_counts`) where the mask is all-false or all-true on whole
tiles, and splits the loop into up to five consecutive loops over the same iterations::

    all-false run  |  mixed  |  all-true run  |  mixed  |  all-false run
    select -> %c   | original|  select -> %x  | original|  select -> %c

Each is an ``scf.for`` with the original step, carrying the loop state from one to the next, so
Triton still software-pipelines every one; the mask ops (and whatever only fed the dropped
operand, such as the ``q @ k`` of an all-false tile) vanish from the uniform loops. A run that can
never be non-empty for the mask (:func:`.iterations.possible_runs`), or that the loop's own bounds
rule out in every program (:func:`.iterations.loop_uniform_runs`), gets no loop, and a loop left
with no uniform run is not rewritten; the bounds stay inside the loop's range, so an empty or
reversed range runs nothing in any of the loops. Every loop or select left as it is gets its
reason in the pass's report notes (``tritonpatch.passes.note``; logged at INFO).

Bitwise exactness: every iteration computes the values the unpatched kernel computes (the select
would have returned exactly the operand that replaces it). The one way low bits could change is
floating-point contraction: without the select, LLVM or ptxas may fuse a multiply before it with an
add after it into an FMA, which the select prevents in the unpatched kernel. So where the kept
operand is a float, the copy keeps a boundary where the select sat (after the chain of
constant-operand ops that LLVM's InstCombine moves in front of a select with a constant arm,
``select(m, x, -inf) * C`` -> ``select(m, x * C, -inf)``), chosen by what produces the value there
(:func:`boundary`). Shape ops are register renames at LLVM level and InstCombine moves float casts
across the select too, so both walks see through them; where a constant-operand op follows the
select through one of them or through another select (InstCombine pushes the op into that
select's arms as well: ``select(m2, select(m1, a * b, 0), -inf) + C`` becomes an FMA of ``a * b``
and ``C``), or a product reaches it through a cast, no exact place for the boundary is known and
the copy is not emitted:

* an f32 multiply whose only user is the select (directly, not through a shape op): the multiply itself is emitted as ``mul.rn.f32``
  inline assembly, which neither LLVM nor ptxas contracts: the unpatched kernel's rounding, and
  the unpatched loop's instructions exactly (the select consumed the product there, so it was
  never fused);
* another f32 multiply (one with more users, or a constant chain's multiply by 2.0: InstCombine
  rewrites ``x * 2.0`` as ``x + x``, which the backend fuses with a product ``x``, so it is not
  rounded on its own) or a negated one: ``add.rn.f32 x, -0.0``, an add
  with an explicit rounding mode, which ptxas neither contracts nor removes. It returns ``x`` bit
  for bit for every ``x`` except NaN, which it makes the canonical NaN ``0x7fffffff``; products are
  canonical NaNs already (H200: every NaN that FMUL or neg.f32 produces), so on these values it is
  the identity. A product of another width, or a division (its NaNs were not checked), gets no
  boundary: that copy is not emitted;
* anything else (a dot, a load, an add, ...): no multiply to fuse, so a register move
  (``mov.b32``), opaque to LLVM and free in ptxas.

tests/cpu/test_passes.py and tests/cpu/test_passes_contraction.py check on SASS that each all-true copy
does the floating-point work of the unpatched loop.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .ir import (REGISTER_MOVES, Module, constant_step, inline_asm_line, is_movable, loop_label, no_select_reason, renamed,
                 select_parts, source_line, substitute, type_of, without_dead_ops)
from .ir_syntax import NAME_END, base_name, parse_for, parse_type, with_attribute, with_inits, without_attribute
from .iterations import (NARROWED, iteration_bound, loop_uniform_runs, possible_runs, scalars_fixed_in_loop,
                         segment_counts)
from .mask_analysis import Analysis
from .masked_iteration import NEG_INF, constant_kind
from .masks import IROps, Mask, UnreadableType
from .report import note
from .versioning import VERSIONED, version_refused_loop

_CHAIN_OPS = ("arith.mulf", "arith.addf", "arith.subf", "arith.divf", "arith.negf")
_RENAMES = ("tt.broadcast", "tt.expand_dims", "tt.splat", "tt.reshape", "tt.trans", "ttg.convert_layout")
_CASTS = ("arith.extf", "arith.truncf")          # InstCombine moves a float cast across a select with a constant arm
_ROUNDED_MULTIPLIES = {"f32": "mul.rn.f32 $0, $1, $2;"}        # the widths whose boundaries were checked on SASS
_ROUNDED_ADDS = {"f32": "add.rn.f32 $0, $1, 0f80000000;"}       # and on the GPU; x + -0.0: see the module docstring
_ONE = re.compile(r"\s*(?:dense<)?1\.0*(?:e\+?0+)?>?\s*:")
_TWO = re.compile(r"\s*(?:dense<)?2\.0*(?:e\+?0+)?>?\s*:")


def _single_source(module: Module, name: str):
    """The line defining ``name`` (a single-result value defined by an op), else None."""
    index = module.defs.get(base_name(name))
    return module.lines[index] if index is not None and index >= 0 and "#" not in name else None


def is_constant(module: Module, name: str) -> bool:
    """An ``arith.constant``, or one seen through renames (splat, broadcast, transpose, ...) and
    float casts: LLVM folds those into a constant."""
    line = _single_source(module, name)
    if line is not None and line.op in _RENAMES + _CASTS and len(line.operands) == 1:
        return is_constant(module, line.operands[0])
    return line is not None and line.op == "arith.constant"


# --- one specialised copy of the loop --------------------------------------------------------------
def _is_chain_op(module: Module, line, value: str) -> bool:
    """Whether ``line`` is an elementwise float op on ``value`` whose other operands are constants:
    an op InstCombine moves in front of a select with a constant arm."""
    others = [o for o in line.operands if o != value]
    return line.op in _CHAIN_OPS and len(line.results) == 1 and len(line.operands) - len(others) == 1 \
        and all(is_constant(module, o) for o in others)


def _passes_value_on(line, value: str) -> bool:
    """Whether ``line`` hands ``value``'s elements on unchanged: a rename, a cast, or another
    select with ``value`` as one of its arms. InstCombine moves a constant-operand op in front of
    each of them (into both arms of a select whose other arm is a constant, and again into an
    inner select), so such an op after them may end up fused with a multiply before the select."""
    if len(line.results) != 1:
        return False
    if line.op in _RENAMES + _CASTS:
        return True
    return line.op == "arith.select" and any(base_name(arm) == base_name(value) for arm in line.operands[1:])


def _chain_op_past_renames(module: Module, body: range, value: str) -> str | None:
    """A constant-operand op reached from ``value`` through renames, casts and other selects only
    (at LLVM level the first two are the select's own elements, and InstCombine pushes such an op
    into the arms of a select with a constant arm; either way it may land in front of the select
    being elided), as "op after renames"; None when there is none."""
    for index in module.users(value, body):
        line = module.lines[index]
        if not _passes_value_on(line, value):
            continue
        for user in module.users(line.results[0], body):
            if _is_chain_op(module, module.lines[user], line.results[0]):
                return f"{module.lines[user].op} after {line.op}"
        deeper = _chain_op_past_renames(module, body, line.results[0])
        if deeper is not None:
            return f"{deeper} after {line.op}"
    return None


def _constant_chain(module: Module, loop: int, start: str) -> list[int] | str:
    """Lines of the ops InstCombine folds into a select with a constant arm: starting at the
    select result, each the sole user of the previous value, elementwise, its other operand a
    constant. Why no exact boundary is known when such an op follows a rename or cast
    (``tl.trans``, ``.to(tl.float32)``): the place LLVM moves it to is not modelled."""
    chain, value = [], start
    body = range(loop + 1, module.end_of(loop))
    while True:
        past = _chain_op_past_renames(module, body, value)
        if past is not None:
            return (f"the select's value reaches a constant-operand {past}, which LLVM may move in front of the "
                    "select; no exact place for a contraction boundary is known")
        users = module.users(value, body)
        if len(users) != 1 or module.parent_of[users[0]] != loop or not _is_chain_op(module, module.lines[users[0]],
                                                                                      value):
            return chain
        chain.append(users[0])
        value = module.lines[users[0]].results[0]


def _is_constant_value(module: Module, name: str, pattern: re.Pattern) -> bool:
    """A float constant (or splat of one) whose printed value ``pattern`` matches."""
    line = _single_source(module, name)
    if line is not None and line.op == "tt.splat" and len(line.operands) == 1:
        return _is_constant_value(module, line.operands[0], pattern)
    return line is not None and line.op == "arith.constant" and bool(pattern.match(line.body))


def _is_one(module: Module, name: str) -> bool:
    """1.0: LLVM folds a multiply by it away."""
    return _is_constant_value(module, name, _ONE)


def _doubles(module: Module, index: int) -> bool:
    """A multiply by 2.0, which InstCombine rewrites as ``x + x``: an add the backend may fuse with
    a product ``x``."""
    line = module.lines[index]
    return line.op == "arith.mulf" and any(_is_constant_value(module, o, _TWO) for o in line.operands)


def _producer(module: Module, name: str) -> str | None:
    """"product" when ``name`` is a float multiply (not by 1.0) or its negation, "quotient" for a
    division (it may become a multiply by the reciprocal) or its negation: values ptxas may fuse
    into a following add. Renames (broadcast, transpose, ...) are seen through, as LLVM does;
    "converted" for either seen through a float cast (its width differs from the select's, and
    no boundary was checked for it). None for anything else."""
    line = _single_source(module, name)
    if line is None:
        return None
    if line.op in ("arith.negf",) + _RENAMES and len(line.operands) == 1:
        return _producer(module, line.operands[0])
    if line.op in _CASTS and len(line.operands) == 1:
        return "converted" if _producer(module, line.operands[0]) else None
    if line.op == "arith.mulf":
        return None if any(_is_one(module, operand) for operand in line.operands) else "product"
    return "quotient" if line.op == "arith.divf" else None


def boundary(module: Module, loop: int, value: str, element: str, sole_user: bool) -> tuple[str, str] | str:
    """How a split copy keeps the rounding boundary the select gave ``value`` (the float the select
    passed on, or the end of its constant chain; ``element`` its type): ``("rounded", asm)`` to
    emit its multiply as ``asm``, ``("barrier", asm)`` for a barrier op after it; or why no exact
    boundary exists. ``sole_user``: in the unpatched loop the select is its only user."""
    producer = _producer(module, value)
    if producer is None:
        return ("barrier", REGISTER_MOVES[element][0])
    if producer == "converted":
        return (f"the select passes on a converted product or quotient ({value}); no exact contraction barrier is "
                "known across a float cast")
    if producer == "quotient":
        return (f"the select passes on a quotient ({value}); the NaNs a division returns are not known to be "
                "canonical, so no exact contraction barrier is known for it")
    index = module.defs[base_name(value)]
    if sole_user and module.lines[index].op == "arith.mulf" and module.parent_of[index] == loop \
            and element in _ROUNDED_MULTIPLIES:
        return ("rounded", _ROUNDED_MULTIPLIES[element])
    if element in _ROUNDED_ADDS:
        return ("barrier", _ROUNDED_ADDS[element])
    return f"no exact contraction barrier for the {element} product {value} that the select passes on"


@dataclass(frozen=True)
class SelectCopy:
    """How a copy of the loop replaces one select by its kept operand: ``changed`` maps a body line
    to its new text (None: deleted); ``renamed``, where set, is ``(result, kept)``: every other
    reader of the select's result reads the kept operand instead."""
    changed: dict
    renamed: tuple[str, str] | None


def select_copy(module: Module, loop: int, select: int, keep_true: bool) -> SelectCopy | str:
    """The select replaced by its true (or false) operand, with a boundary that keeps the unpatched
    kernel's contraction (:func:`boundary`); or why no exact replacement exists."""
    _, true_value, false_value, value_type = select_parts(module, select)
    kept, other = (true_value, false_value) if keep_true else (false_value, true_value)
    line = module.lines[select]
    result = line.results[0]
    element = parse_type(value_type).element
    if element not in REGISTER_MOVES or is_constant(module, kept):      # nothing to contract with
        return SelectCopy({select: None}, (result, kept))
    chain = _constant_chain(module, loop, result) if is_constant(module, other) else []
    if isinstance(chain, str):
        return chain
    changed = {select: None}
    if chain:                      # InstCombine moves the chain in front of the select: the boundary follows it
        changed[chain[0]] = substitute(module.lines[chain[0]].text, result, kept)
        value, value_line = module.lines[chain[-1]].results[0], chain[-1]
        # the chain's last multiply rounded on its own, unless it doubles: InstCombine rewrites x * 2.0
        # as x + x, which the backend fuses with a product x (a * b * 2.0 -> fma(a, b, a * b)); a
        # barrier after it then keeps the unpatched kernel's work
        plan = boundary(module, loop, value, element, sole_user=not _doubles(module, chain[-1]))
    else:
        value, value_line = kept, module.defs.get(base_name(kept))
        plan = boundary(module, loop, kept, element, sole_user=module.users(base_name(kept)) == [select])
    if isinstance(plan, str):
        return plan
    kind, asm = plan
    register = REGISTER_MOVES[element][1]          # the constraint letter of the element's registers
    if kind == "rounded":          # the product itself, rounded on its own: the select's users read it
        product = module.lines[value_line]
        changed[value_line] = inline_asm_line(value, asm, register,
                                              [substitute(o, result, kept) for o in product.operands], value_type,
                                              product.indent, product.loc)
        return SelectCopy(changed, None if chain else (result, kept))
    if chain:
        before = module.fresh("contracted")
        last = module.lines[value_line]
        changed[value_line] = substitute(changed.get(value_line, last.text), value, before) + "\n" + \
            inline_asm_line(value, asm, register, [before], value_type, last.indent, last.loc)
        return SelectCopy(changed, None)
    changed[select] = inline_asm_line(result, asm, register, [kept], value_type, line.indent, line.loc)
    return SelectCopy(changed, None)


def same_mask_selects(module: Module, loop: int, select: int) -> list[int]:
    """The other selects directly in the loop body on the same mask value as ``select`` (Inductor's
    FlexAttention backward applies its mask twice: ``where(m, s, -inf)``, then ``where(m, ds, 0)``),
    except those that read another select's result or whose result another select reads."""
    condition = select_parts(module, select)[0]
    selects = [i for i in module.children(loop) if select_parts(module, i) is not None
               and select_parts(module, i)[0] == condition]
    results = {module.lines[i].results[0] for i in selects}
    return [i for i in selects if i != select
            and not any(base_name(o) in results for o in module.lines[i].operands[1:])
            and not any(base_name(o) == module.lines[i].results[0] for j in selects for o in module.lines[j].operands)]


def specialised_loop(module: Module, loop: int, select: int, keep_true: bool, same_mask: bool = False) -> list[str] | str:
    """The loop's lines (head to closing brace) with the select, and (``same_mask``) every other
    select on its mask that can be (:func:`same_mask_selects`), replaced by the true (or false)
    operand (:func:`select_copy`), and the ops left dead removed; or why no exact copy exists."""
    primary = select_copy(module, loop, select, keep_true)
    if isinstance(primary, str):
        return primary
    copies = [primary]
    for other in same_mask_selects(module, loop, select) if same_mask else []:
        copy = select_copy(module, loop, other, keep_true)
        if isinstance(copy, SelectCopy) and not set(copy.changed) & {i for c in copies for i in c.changed}:
            copies.append(copy)
    texts = {i: module.lines[i].text for i in range(loop, module.end_of(loop) + 1)}
    for copy in copies:
        for index, text in copy.changed.items():
            if text is None:
                del texts[index]
            else:
                texts[index] = text
    for copy in copies:
        if copy.renamed is not None:
            texts = {i: substitute(t, *copy.renamed) for i, t in texts.items()}
    return remove_dead_ops("\n".join(texts[i] for i in sorted(texts)).split("\n"))


def remove_dead_ops(lines: list[str]) -> list[str]:
    """Drop pure single-line ops inside the loop whose results are unused (until none is left)."""
    return without_dead_ops(lines, lambda line: is_movable(line) or line.op == "tt.dot")


def with_head(lines: list[str], module: Module, loop: int, result: str | None, lower: str, upper: str,
              inits: list[str] | None) -> list[str]:
    """The loop's lines with its head given new result name, bounds and initial values."""
    head = parse_for(module.lines[loop])
    text = lines[0].replace(f" = {head.lower} to {head.upper} step ", f" = {lower} to {upper} step ", 1)
    if result is not None and module.lines[loop].results:
        text = re.sub(r"^(\s*)" + re.escape(module.lines[loop].results[0]) + NAME_END, r"\g<1>" + result, text, 1)
    if inits is not None:
        text = with_inits(text, head, inits)
    return [text] + lines[1:]


# --- the split ------------------------------------------------------------------------------------
_RUNS = ("false", "mixed", "true", "mixed", "false")   # the five runs segment_counts cuts the iterations into
# What a copy claims about its tiles, as a unit attribute of its scf.for (read by the fuzzer's static
# check, which evaluates the mask on the tiles each copy runs): where the select had a constant arm and
# a computed one, the copy runs the constant (every tile all-masked) or the computed value (unmasked).
MASKED_COPY = "tritonpatch.masked_copy"
UNMASKED_COPY = "tritonpatch.unmasked_copy"
# The source line (``file.py:LINE``) of the select a marked copy was split on, so that the check evaluates
# that select's mask (a copy also loses selects its constant made dead, whose masks say nothing).
SPLIT_SELECT = "tritonpatch.split_select"


def _keeps_computed(module: Module, parts, keep_true: bool) -> bool | None:
    """Whether the select, taking its true (``keep_true``) or false operand, keeps its computed value
    (True) or its constant (False); None unless exactly one of its arms is a constant."""
    kept, other = (parts[1], parts[2]) if keep_true else (parts[2], parts[1])
    if is_constant(module, kept) == is_constant(module, other):
        return None
    return not is_constant(module, kept)


def _marked(closing: str, module: Module, select: int, parts, keep_true: bool | None) -> str:
    """The closing line of a copy that replaced the select at ``select`` by its true (``keep_true``)
    or false operand, with :data:`MASKED_COPY` or :data:`UNMASKED_COPY` (and :data:`SPLIT_SELECT`)
    when exactly one arm is a constant."""
    computed = None if keep_true is None else _keeps_computed(module, parts, keep_true)
    if computed is None:
        return closing
    line = source_line(module, select)
    if line is not None:
        closing = with_attribute(closing, f'{SPLIT_SELECT} = "{line}"')
    return with_attribute(closing, UNMASKED_COPY if computed else MASKED_COPY)


@dataclass(frozen=True)
class LoopMask:
    """A loop and the mask of one select in its body, read as index compares; ``negated``: the
    select is ``where(c, -inf, x)`` and ``mask`` is ``~c``."""
    head: object
    step: int
    parts: tuple
    analysis: Analysis
    mask: Mask
    negated: bool


def loop_mask(module: Module, loop: int, select: int, max_atoms: int) -> LoopMask | str:
    """The select's mask, analysable for the loop; or why not."""
    head = parse_for(module.lines[loop])
    step = constant_step(module, head.step)
    parts = select_parts(module, select)
    if step is None:
        return "its step is not a positive constant"
    if head.iv_type != "i32":
        return f"its induction variable is {head.iv_type}, not i32"
    analysis = Analysis(module)
    mask = analysis.mask(parts[0])
    if mask is None or not 0 < mask.atoms() <= max_atoms:
        return f"its mask is not an analysable index compare (or has over {max_atoms} compares)"
    # where(c, -inf, x) is split as where(~c, x, -inf), the form skip-masked-blocks reads it in: the runs it
    # drops from a loop it narrowed (NARROWED) are then this mask's all-false runs, as for where(c, x, -inf)
    negated = constant_kind(module, parts[1]) == NEG_INF and constant_kind(module, parts[2]) != NEG_INF
    if negated:
        mask = Mask("not", children=(mask,))
    if not scalars_fixed_in_loop(module, loop, mask, head.iv, analysis.checks):
        return "its mask uses a scalar computed inside the loop"
    return LoopMask(head, step, parts, analysis, mask, negated)


def run_bounds(module: Module, loop: int, found: LoopMask) -> tuple[IROps, list[str]]:
    """The ops computing, in front of the loop, the six i32 bounds of the five runs of :data:`_RUNS`
    (the loop's own lower and upper bound first and last)."""
    head, line = found.head, module.lines[loop]
    ops = IROps(module, line.indent, module.lines[module.end_of(loop)].loc)
    lower, upper = ops.leaf(head.lower), ops.leaf(head.upper)
    bounds = [head.lower]
    for count in segment_counts(ops, lower, upper, found.step, found.mask, head.iv, found.analysis.checks):
        bound = iteration_bound(ops, lower, upper, count, found.step)
        bounds.append(ops.emit(("trunc", bound), f"arith.trunci {bound} : i64 to i32"))   # exact: in the i32 range
    bounds.append(head.upper)
    return ops, bounds


def _negated_suffix(found: LoopMask) -> str:
    return (" (all-true and all-false of the select's condition negated: where(c, -inf, x) is read as "
            "where(~c, x, -inf))" if found.negated else "")


def split_loop(module: Module, loop: int, select: int, max_atoms: int, all_false_loops: bool,
               same_mask: bool = False) -> list[str] | str:
    """Replace ``loop`` by one loop per uniform run of its iterations and the mixed runs between
    them; returns the emitted lines, or why not (module untouched)."""
    found = loop_mask(module, loop, select, max_atoms)
    if isinstance(found, str):
        return found
    head, parts, mask, negated = found.head, found.parts, found.mask, found.negated
    original = [module.lines[i].text for i in range(loop, module.end_of(loop) + 1)]
    leading, true_possible, trailing = loop_uniform_runs(module, head, mask)
    false_loops = all_false_loops and NARROWED not in original[-1]  # skip-masked-blocks dropped those runs already
    possible = (leading and false_loops, True, true_possible, True, trailing and false_loops)   # per run of _RUNS
    bodies, refusals = {"mixed": original}, []
    for kind, wanted in (("true", true_possible), ("false", possible[0] or possible[4])):
        copy = specialised_loop(module, loop, select, (kind == "true") != negated, same_mask) if wanted else None
        if isinstance(copy, str):
            refusals.append(f"its all-{kind} copy: {copy}")
        elif copy is not None:
            bodies[kind] = copy
    kinds = [kind if kind in bodies and can_run else "mixed" for kind, can_run in zip(_RUNS, possible)]
    if kinds == ["mixed"] * len(_RUNS):
        reason = "; ".join(refusals) or _no_run_reason(mask, head.iv, leading or trailing, false_loops)
        return reason + _negated_suffix(found)
    ops, bounds = run_bounds(module, loop, found)
    segments = []                  # (kind, low, high), adjacent mixed runs merged
    for position, kind in enumerate(kinds):
        if segments and kind == "mixed" == segments[-1][0]:
            segments[-1] = ("mixed", segments[-1][1], bounds[position + 1])
        else:
            segments.append((kind, bounds[position], bounds[position + 1]))
    bodies = {kind: lines[:-1] + [_marked(without_attribute(lines[-1], NARROWED), module, select, parts,
                                          None if kind == "mixed" else (kind == "true") != negated)]
              for kind, lines in bodies.items()}
    emitted, inits, original_names = list(ops.lines), None, True
    for position, (kind, low, high) in enumerate(segments):
        result = None if position == len(segments) - 1 else module.fresh("segment")
        copy = with_head(bodies[kind], module, loop, result, low, high, inits)
        keep_names = kind == "mixed" and original_names     # the first mixed copy keeps the loop's value names
        original_names &= not keep_names
        emitted += copy if keep_names else renamed(copy, module.fresh("seg")[1:])
        if result is not None and head.iter_args:
            inits = [f"{result}#{k}" for k in range(len(head.iter_args))] if len(head.iter_args) > 1 else [result]
    texts = [l.text for l in module.lines]
    module.replace(texts[:loop] + emitted + texts[module.end_of(loop) + 1:])
    for refusal in refusals:
        note(f"loop {head.iv}: {refusal}; split without it")
    return emitted


# --- the branch form ---------------------------------------------------------------------------------
# What a branch claims about its tiles, as a unit attribute of its scf.if (read by the fuzzer's static
# check, which evaluates the mask on the tiles where the if's condition holds): there the select keeps
# its computed value everywhere (the mask, read as where(mask, x, fill), is all-true), or its constant
# (as for the split's copies, by which arm is a constant; by the mask's reading where neither or both are).
UNMASKED_BRANCH = "tritonpatch.unmasked_branch"
MASKED_BRANCH = "tritonpatch.masked_branch"


def _mask_ops(module: Module, loop: int, condition: str) -> list[int]:
    """The ops of the loop body that compute ``condition`` and nothing else: the op defining it
    and every pure op (movable, one result, no region) whose results feed only those ops."""
    body = range(loop + 1, module.end_of(loop))
    root = module.defs.get(base_name(condition))
    children = module.children(loop)
    if (root is None or root not in children or module.lines[root].opens or module.lines[root].values != 1
            or not is_movable(module.lines[root])):
        return []
    exclusive = {root}
    for index in reversed([i for i in children if i < root]):
        line = module.lines[index]
        if line.opens or line.values != 1 or not is_movable(line):
            continue
        users = module.users(line.results[0], body)
        if users and all(user in exclusive for user in users):
            exclusive.add(index)
    return sorted(exclusive)


def _fresh_copy(module: Module, indices: list[int], hint: str) -> tuple[list[str], dict[str, str]]:
    """The lines of the ops at ``indices`` (unindented) with every value they define renamed to a
    fresh name, and the renaming."""
    names = {result: module.fresh(hint) for i in indices for result in module.lines[i].results}
    lines = [module.lines[i].text.strip() for i in indices]
    for old, new in names.items():
        lines = [substitute(text, old, new) for text in lines]
    return lines, names


def _uniform_arm(module: Module, value: bool, type_text: str, indent: str, loc: str) -> list[str]:
    """The lines of an arm that yields the mask as the constant ``value`` of ``type_text``."""
    name = module.fresh("uniform_mask")
    literal = "true" if value else "false"
    constant = literal if type_text == "i1" else f"dense<{literal}>"
    return [f"{indent}{name} = arith.constant {constant} : {type_text} {loc}".rstrip(),
            f"{indent}scf.yield {name} : {type_text} {loc}".rstrip()]


def branch_mask_loop(module: Module, loop: int, select: int, max_atoms: int, all_false_loops: bool) -> list[str] | str:
    """Keep ``loop`` whole and compute the select's mask under a branch on the induction variable:
    a tile of the all-true run (bounds computed in front of the loop as for the split) takes the
    mask as a constant, as does a tile of a leading or trailing all-false run; every other tile
    runs the ops that compute the mask. The selects themselves, the loads and the dots stay where
    they were, so the IR computes every floating-point value with the unpatched kernel's operations
    in the unpatched order (LLVM may still fold a select into the branch's arms and contract
    differently: the exactness check compares, as for every patched kernel); Triton pipelines the
    one loop as before, its dots keep their layouts (the chain from one dot through the selects to
    the next stays visible to Triton), and no loop-invariant value lives across copies of the loop.
    Every select on the same mask (the backward's ``where(m, s, -inf)`` and ``where(m, ds, 0)``)
    reads the branched mask. Returns the emitted lines, or why not (module untouched)."""
    found = loop_mask(module, loop, select, max_atoms)
    if isinstance(found, str):
        return found
    head, condition = found.head, found.parts[0]
    closing = module.lines[module.end_of(loop)].text
    leading, true_possible, trailing = loop_uniform_runs(module, head, found.mask)
    false_loops = all_false_loops and NARROWED not in closing  # skip-masked-blocks dropped those runs already
    false_arm = false_loops and (leading or trailing)
    if not true_possible and not false_arm:
        return _no_run_reason(found.mask, head.iv, leading or trailing, false_loops) + _negated_suffix(found)
    moved = _mask_ops(module, loop, condition)
    if not moved:
        return ("its mask is not computed by pure ops of the loop body (computed in front of the loop, "
                "nothing to branch, or by an op that cannot move under a branch)")
    type_text = type_of(module, base_name(condition))
    if type_text is None:
        return f"the type of its mask {condition} cannot be read"
    ops, bounds = run_bounds(module, loop, found)
    levels = ([("andi", ("sge", bounds[2]), ("slt", bounds[3]), True)] if true_possible else []) + \
        ([("ori", ("slt", bounds[1]), ("sge", bounds[4]), False)] if false_arm else [])   # _RUNS' bounds
    line = module.lines[moved[-1]]
    loc = line.loc
    masked, names = _fresh_copy(module, moved, "mask")

    def nested(depth: int, indent: str, result: str) -> list[str]:
        """The lines giving ``result`` the mask: under the branches of ``levels[depth:]``."""
        if depth == len(levels):
            return [indent + substitute(text, names[base_name(condition)], result) for text in masked]
        combine, (first_predicate, first_bound), (second_predicate, second_bound), uniform = levels[depth]
        computed = _keeps_computed(module, found.parts, uniform != found.negated)
        claim = UNMASKED_BRANCH if (uniform if computed is None else computed) else MASKED_BRANCH
        flags = [module.fresh("in_run") for _ in range(3)]
        inner, value = indent + "  ", module.fresh("mask")
        return [f"{indent}{flags[0]} = arith.cmpi {first_predicate}, {head.iv}, {first_bound} : i32 {loc}".rstrip(),
                f"{indent}{flags[1]} = arith.cmpi {second_predicate}, {head.iv}, {second_bound} : i32 {loc}".rstrip(),
                f"{indent}{flags[2]} = arith.{combine} {flags[0]}, {flags[1]} : i1 {loc}".rstrip(),
                f"{indent}{result} = scf.if {flags[2]} -> ({type_text}) {{",
                *_uniform_arm(module, uniform != found.negated, type_text, inner, loc),
                f"{indent}}} else {{",
                *nested(depth + 1, inner, value),
                f"{inner}scf.yield {value} : {type_text} {loc}".rstrip(),
                f"{indent}}} {{{claim}}} {loc}".rstrip()]
    emitted = nested(0, line.indent, base_name(condition))
    texts = [other.text for other in module.lines]
    body = [texts[i] for i in range(loop, moved[-1]) if i not in moved] + emitted
    module.replace(texts[:loop] + ops.lines + body + texts[moved[-1] + 1:])
    return emitted


def _no_run_reason(mask: Mask, iv: str, false_possible: bool, false_loops: bool) -> str:
    """Why a loop gets no uniform loop: its mask is never uniform on a tile, or the loop's bounds
    rule out every run it would get (``false_possible``: a leading or trailing all-false run is
    possible within them, :func:`.iterations.loop_uniform_runs`)."""
    some_true, some_false = possible_runs(mask, iv)
    if not some_true and not (some_false and false_loops):
        return ("its mask is never provably uniform on a whole tile (== or != of a moving index, or an xor of such), "
                "or only all-false where no all-false loop is emitted")
    parts = (["no tile of its iterations is all-true"] if some_true else []) + \
        (["no tile at its start or end is all-false"] if some_false and false_loops else [])
    reason = (" and ".join(parts) + ": each such run ends at or before its start for every value of the scalars "
              "its bounds and its mask share")
    if some_false and not false_loops and false_possible:
        reason += " (all-false tiles at its start or end get no loop here: the loop was narrowed, or all_false_loops " \
                  "is off)"
    return reason


def run(text: str, options) -> tuple[str, dict[str, int]]:
    """Split every loop (innermost first) on its first analysable select (:func:`_preference`), versioning a loop on its
    carried offsets (:mod:`.versioning`) where that makes the mask analysable; log why each loop
    or select was left as it is (``tritonpatch.passes.note``)."""
    module = Module(text)
    counts = {"masks_branched" if options["branch"] else "loops_split": 0}
    done_key = next(iter(counts))
    for loop in module.loops():
        if not any(select_parts(module, index) for index in module.children(loop)):
            note(f"{loop_label(module, loop)} left as it is: {no_select_reason(module, loop)}")
    done: set[str] = set()
    split = functools.partial(_split_or_reason, max_atoms=options["max_atoms"],
                              all_false_loops=options["all_false_loops"], branch=options["branch"],
                              same_mask=options["same_mask_selects"])
    while True:
        candidates = ((loop, index) for loop in reversed(module.loops())
                      for index in sorted(module.children(loop), key=lambda i: _preference(module, i))
                      if VERSIONED not in module.lines[module.end_of(loop)].text
                      and select_parts(module, index) is not None and module.lines[index].results[0] not in done
                      and not _reads_branched_mask(module, index))
        loop, select = next(candidates, (None, None))
        if loop is None:
            break
        name = module.lines[select].results[0]
        done.add(name)
        outcome = split(module, loop, select)
        if isinstance(outcome, str):
            versioned, outcome = version_refused_loop(module, loop, outcome, lambda fast_module, fast, rename: split(
                fast_module, fast, _named_line(fast_module, fast, rename(name))))
            if versioned:
                counts["loops_versioned"] = counts.get("loops_versioned", 0) + 1  # only when one was
        if isinstance(outcome, str):
            note(f"{loop_label(module, loop)} not {'branched' if options['branch'] else 'split'} on {name}: {outcome}")
        else:
            done.update(parse_line_results(outcome, "arith.select"))
            counts[done_key] += 1
    return (module.text() if any(counts.values()) else text), counts


def _reads_branched_mask(module: Module, select: int) -> bool:
    """Whether the select's mask is one the branch form gives already (another select on the same
    mask was branched: the backward's ``where(m, s, -inf)`` and ``where(m, ds, 0)``)."""
    index = module.defs.get(base_name(select_parts(module, select)[0]))
    if index is None or index < 0 or module.lines[index].op != "scf.if":
        return False
    closing = module.lines[module.end_of(index)].text
    return UNMASKED_BRANCH in closing or MASKED_BRANCH in closing


def _split_or_reason(module: Module, loop: int, select: int, max_atoms: int, all_false_loops: bool,
                     branch: bool, same_mask: bool) -> list[str] | str:
    """:func:`split_loop` (:func:`branch_mask_loop` where ``branch``), with an integer scalar whose
    type cannot be read as the reason the loop is left as it is (raised before the module changes)."""
    try:
        if branch:
            return branch_mask_loop(module, loop, select, max_atoms, all_false_loops)
        return split_loop(module, loop, select, max_atoms, all_false_loops, same_mask)
    except UnreadableType as unreadable:
        return str(unreadable)


def _preference(module: Module, index: int) -> tuple[int, int]:
    """The order a loop's selects are tried in: float selects with a constant arm (a mask's -inf or
    0 fill) first, then the rest, each in body order. An integer select in Inductor's output is
    usually an index fix-up (a floor division's sign correction) whose condition reads as a mask
    but whose split drops nothing of the mask's work."""
    parts = select_parts(module, index)
    if parts is None:
        return (1, index)
    element = parse_type(parts[3]).element
    masking = element.startswith(("f", "bf")) and (is_constant(module, parts[1]) or is_constant(module, parts[2]))
    return (0 if masking else 1, index)


def _named_line(module: Module, loop: int, name: str) -> int:
    """The line of ``loop``'s body that defines ``name``."""
    return next(index for index in module.children(loop) if name in module.lines[index].results)


def parse_line_results(lines: list[str], op: str) -> set[str]:
    """Result names of the ``op`` lines among ``lines``."""
    fragment = Module("\n".join(lines))
    return {r for line in fragment.lines if line.op == op for r in line.results}
