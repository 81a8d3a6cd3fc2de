"""Loop versioning for offsets carried through a loop: the fast copy the mask passes can read.

torch.compile's FlexAttention templates do not index a tile by the induction variable. They carry
its position through the loop (``offs_n = offs_n + offset``, ``kv_offset += offset``) with an
increment that only jumps at the end of a sparse block::

    needs_jump = (i + 1) % SPARSE_MULTIPLE == 0
    offset = jump * needs_jump + (1 - needs_jump) * BLOCK        # jump: loaded block indices

The mask then compares against a loop-carried value, which the interval analysis
(:mod:`.mask_analysis`) cannot follow. Where ``SPARSE_MULTIPLE`` is large (no block mask:
``2**30 / BLOCK``), no iteration of a loop shorter than it ever jumps. This module recognises such
an iteration argument (``arg' = arg + increment`` with the increment a scalar, or a splat of one,
that folds to a constant ``C`` once every ``(iv + a) % M == 0`` compare in it is assumed false) and
rewrites the loop into::

    scf.if (no iteration of this loop has iv + a divisible by M, and iv + a never wraps) {
        the loop, each such argument advanced by the constant C, and each of its uses replaced by
        the closed form  init + (iv - lower) / step * C   (affine in iv: the passes can read it)
    } else {
        the original loop, unchanged (marked tritonpatch.versioned)
    }

The check runs once before the loop on the loop's bounds; the fast copy computes, bit for bit,
the values the original computes (the folded increment equals the original one on every
iteration where the assumption holds, and the closed form equals the running sum in the integer
ring of the argument's width, wrap-around included). A modulus below :data:`MIN_MODULUS` is
refused: with a block mask (``SPARSE_MULTIPLE`` 1 or 2) the fast copy would run only for loops of
one or two iterations, so it would add code and never help.

A pass hands a loop it refused to :func:`version_refused_loop`: it plans the versioning
(:func:`plan_versioning`), builds the versioned loop on a trial copy of the module and keeps it
only when the pass's own rewrite then applies to the fast copy (:func:`versioned_rewrite`).

The closed form is for the passes to read; computed anew in every iteration it costs registers the
carried offset did not (FlexAttention's D=64 forward sits at 255 registers: its narrowed fast copy
spilled 204 B per thread, the unpatched kernel 8 B). Once the stage's passes are done,
:func:`restore_carried_offsets` gives each loop made from a fast copy its carried offsets back.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

from .ir import (REGISTER_MOVES, Module, constant_step, has_side_effect, increment_scalar, inline_asm_line, is_movable,
                 loop_advances, renamed, result_used_after, substitute, type_of, without_dead_ops)
from .ir_syntax import (TensorType, base_name, int_width, parse_for, parse_type, with_attribute, with_inits,
                         without_attribute)
from .masks import IROps
from .report import note

VERSIONED = "tritonpatch.versioned"   # the original (cold) copy of a versioned loop: never versioned again
CLOSED_FORMS = "tritonpatch.closed_forms"   # a fast copy (or a copy of one): its offsets' uses read closed forms
_EXIT_MOVES = {**REGISTER_MOVES, "i32": ("mov.b32 $0, $1;", "r"), "i64": ("mov.b64 $0, $1;", "l")}
MIN_MODULUS = 1024
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


@dataclass(frozen=True)
class JumpCompare:
    """``(iv + offset) % modulus == 0`` (``held`` False) or ``!= 0`` (``held`` True), assumed to
    give ``held`` on every iteration of the fast copy."""
    value: str
    offset: int
    modulus: int
    held: bool


@dataclass(frozen=True)
class CarriedOffset:
    """Iteration argument ``position`` advanced by ``step`` per iteration in the fast copy; ``add``
    is the line computing its next value."""
    position: int
    add: int
    step: int


@dataclass(frozen=True)
class Plan:
    offsets: tuple[CarriedOffset, ...]
    compares: tuple[JumpCompare, ...]


def _constant_int(module: Module, name: str) -> int | None:
    """The value of an integer constant, a scalar or a splat tensor (``dense<C>``), else None."""
    index = module.defs.get(base_name(name))
    if index is None or index < 0 or "#" in name or module.lines[index].op != "arith.constant":
        return None
    match = re.match(r"\s*(?:dense<)?(-?\d+)>?\s*:", module.lines[index].body)
    return int(match.group(1)) if match else None


class _Folder:
    """Folds an i32 / i64 scalar computed in the loop body to a constant, assuming the jump
    compares it meets (see :class:`JumpCompare`) give their non-jumping value."""

    def __init__(self, module: Module, loop: int, iv: str):
        self.module, self.loop, self.iv = module, loop, iv
        self.compares: dict[str, JumpCompare] = {}
        self.assumed: set[str] = set()          # the compares the last fold relied on
        self.small_moduli: set[int] = set()     # jump compares refused for their modulus

    def fold(self, name: str) -> int | None:
        constant = _constant_int(self.module, name)
        if constant is not None:
            return constant
        index = self.module.defs.get(base_name(name))
        if index is None or "#" in name or not self.module.inside(index, self.loop):
            return None
        line = self.module.lines[index]
        operands = line.operands
        if line.op in ("arith.extui", "arith.extsi") and len(operands) == 1 \
                and type_of(self.module, operands[0]) == "i1":
            flag = self.fold_flag(operands[0])
            return None if flag is None else (int(flag) if line.op == "arith.extui" else -int(flag))
        if line.op not in ("arith.addi", "arith.subi", "arith.muli") or len(operands) != 2:
            return None
        left, right = self.fold(operands[0]), self.fold(operands[1])
        if line.op == "arith.muli" and 0 in (left, right):
            return 0                                   # 0 * anything, a loaded jump included
        if left is None or right is None:
            return None
        width = int_width(type_of(self.module, name) or "")
        if width is None:                              # wrapping at an unknown width: no value
            return None
        value = left + right if line.op == "arith.addi" else left - right if line.op == "arith.subi" else left * right
        return _wrapped(value, width)

    def fold_flag(self, name: str) -> bool | None:
        """The value of an i1 jump compare ``(iv + a) % M ==/!= 0`` in the fast copy, else None."""
        index = self.module.defs.get(base_name(name))
        if index is None or not self.module.inside(index, self.loop):
            return None
        line = self.module.lines[index]
        pred = line.body.split(",", 1)[0].strip() if line.op == "arith.cmpi" else ""
        if pred not in ("eq", "ne") or len(line.operands) != 2 or _constant_int(self.module, line.operands[1]) != 0:
            return None
        remainder = self.module.defs.get(base_name(line.operands[0]))
        rem = self.module.lines[remainder] if remainder is not None and remainder >= 0 else None
        if rem is None or rem.op != "arith.remsi" or len(rem.operands) != 2:
            return None
        modulus = _constant_int(self.module, rem.operands[1])
        offset = self._iv_plus_constant(rem.operands[0])
        if modulus is not None and offset is not None and 0 < modulus < MIN_MODULUS:
            self.small_moduli.add(modulus)
        if modulus is None or modulus < MIN_MODULUS or offset is None:
            return None
        held = pred == "ne"
        self.compares[name] = JumpCompare(name, offset, modulus, held)
        self.assumed.add(name)
        return held

    def _iv_plus_constant(self, name: str) -> int | None:
        """``a`` when ``name`` is ``iv + a`` (i32, ``a`` a constant), else None."""
        if name == self.iv:
            return 0
        index = self.module.defs.get(base_name(name))
        line = self.module.lines[index] if index is not None and index >= 0 else None
        if line is None or line.op != "arith.addi" or len(line.operands) != 2 or type_of(self.module, name) != "i32":
            return None
        for mine, other in ((0, 1), (1, 0)):
            if line.operands[mine] == self.iv and _constant_int(self.module, line.operands[other]) is not None:
                return _constant_int(self.module, line.operands[other])
        return None


def _wrapped(value: int, width: int) -> int:
    """``value`` as a signed integer of ``width`` bits."""
    value &= (1 << width) - 1
    return value - (1 << width) if value >> (width - 1) else value


def plan_versioning(module: Module, loop: int) -> Plan | str:
    """The iteration arguments a versioned copy would advance by constants, and the compares it
    assumes; or why the loop cannot be versioned ("" when it carries no offset advanced by an
    increment computed in the loop: nothing to say)."""
    head = parse_for(module.lines[loop])
    step = constant_step(module, head.step)
    if VERSIONED in module.lines[module.end_of(loop)].text:
        return "it is the original copy of a versioned loop"
    if step is None or head.iv_type != "i32":
        return "its step is not a positive constant or its induction variable is not i32"
    folder, offsets, candidates = _Folder(module, loop, head.iv), [], 0
    for position, index in loop_advances(module, loop).items():
        increment = module.lines[index].operands[1]
        where = module.defs.get(base_name(increment))
        scalar = increment_scalar(module, increment)
        if where is None or not module.inside(where, loop) or scalar is None or scalar[0] != "value":
            continue
        candidates += 1
        folder.assumed.clear()
        constant = folder.fold(scalar[1])
        if constant is None or not folder.assumed:
            continue
        if constant % step:
            return (f"the increment of {head.iter_args[position][0]} folds to {constant}, not a multiple of the "
                    f"step {step}")
        offsets.append(CarriedOffset(position, index, constant))
    if not offsets and folder.small_moduli:
        return (f"its carried offsets jump every {min(folder.small_moduli)} iterations ((iv + a) % M == 0 with M "
                f"below {MIN_MODULUS}, as with a block mask): a copy without jumps would never run")
    if not offsets:
        return ("" if not candidates else "its carried offsets advance by values that are not constant even without "
                "jumps (loaded in the loop, as a block mask's walk over block indices is)")
    return Plan(tuple(offsets), tuple(folder.compares.values()))


def _no_jump_condition(ops: IROps, lower: str, upper: str, step: int, compares) -> str:
    """i1: no iteration of ``[lower, upper)`` meets a jump, and ``iv + a`` never wraps in i32."""
    trips = ops.select(ops.cmp("slt", lower, upper), ops.ceil_div(ops.add(upper, ops.mul(lower, -1)), step),
                       ops.const(0))
    last = ops.add(lower, ops.mul(ops.add(trips, ops.const(-1)), step))
    holds = ops.cmp("sle", trips, ops.const(0))
    clear = None
    for compare in compares:
        first, final = ops.add(lower, ops.const(compare.offset)), ops.add(last, ops.const(compare.offset))
        in_range = ops.and_(ops.cmp("sge", first, ops.const(_INT32_MIN)), ops.cmp("sle", final, ops.const(_INT32_MAX)))
        next_multiple = ops.mul(ops.ceil_div(first, compare.modulus), compare.modulus)
        no_multiple = ops.and_(in_range, ops.cmp("sgt", next_multiple, final))
        clear = no_multiple if clear is None else ops.and_(clear, no_multiple)
    return ops.or_(holds, clear)


def _fast_copy(module: Module, loop: int, plan: Plan, ops: IROps, step: int) -> list[str]:
    """The loop's lines with each carried offset advanced by its constant and its other uses
    replaced by the closed form (emitted at the top of the body)."""
    head = parse_for(module.lines[loop])
    texts = [module.lines[i].text for i in range(loop, module.end_of(loop) + 1)]
    body_indent = module.lines[module.children(loop)[0]].indent
    loc = module.lines[loop].loc
    iterations = {}                 # width -> (iv - lower), in i64 when an offset is i64
    closed_lines = []
    for offset in plan.offsets:
        arg, init = head.iter_args[offset.position]
        arg_type = head.result_types[offset.position]
        parsed = parse_type(arg_type)
        element = parsed.element if isinstance(parsed, TensorType) else arg_type
        width = int_width(element)
        add = module.lines[offset.add]
        increment = add.operands[1]
        constant = module.fresh("vstep")
        value = f"dense<{offset.step}>" if isinstance(parsed, TensorType) else str(offset.step)
        ops.lines.append(f"{ops.indent}{constant} = arith.constant {value} : {arg_type} {ops.loc}".rstrip())
        texts[offset.add - loop] = add.text.replace(f", {increment} :", f", {constant} :", 1)
        if width not in iterations:
            iv, lower = head.iv, head.lower
            if width == 64:
                iv, lower = module.fresh("viv"), module.fresh("vlb")
                closed_lines += [f"{body_indent}{iv} = arith.extsi {head.iv} : i32 to i64 {loc}".rstrip(),
                                 f"{body_indent}{lower} = arith.extsi {head.lower} : i32 to i64 {loc}".rstrip()]
            distance = module.fresh("vdist")
            closed_lines.append(f"{body_indent}{distance} = arith.subi {iv}, {lower} : i{width} {loc}".rstrip())
            iterations[width] = distance
        factor = module.fresh("vfactor")
        ops.lines.append(f"{ops.indent}{factor} = arith.constant {offset.step // step} : i{width} {ops.loc}".rstrip())
        advance = module.fresh("vadvance")
        closed_lines.append(
            f"{body_indent}{advance} = arith.muli {iterations[width]}, {factor} : i{width} {loc}".rstrip())
        if isinstance(parsed, TensorType):
            splat = module.fresh("vsplat")
            closed_lines.append(f"{body_indent}{splat} = tt.splat {advance} : i{width} -> {arg_type} {loc}".rstrip())
            advance = splat
        closed = module.fresh("vclosed")
        closed_lines.append(f"{body_indent}{closed} = arith.addi {init}, {advance} : {arg_type} {loc}".rstrip())
        for i in range(1, len(texts) - 1):
            if i != offset.add - loop:
                texts[i] = substitute(texts[i], arg, closed)
    texts[-1] = with_attribute(texts[-1], CLOSED_FORMS)
    return remove_dead_ops([texts[0]] + closed_lines + texts[1:], module)


def remove_dead_ops(lines: list[str], module: Module) -> list[str]:
    """Drop ops in the loop whose results are unused (until none is left): movable ops,
    non-volatile loads, and integer divisions by a non-zero constant (of ``module``): the
    block-index computations that only fed the folded increment."""
    return without_dead_ops(lines, lambda line: _removable(line, module))


def _removable(line, module: Module) -> bool:
    if is_movable(line) or (line.op == "tt.load" and not has_side_effect(line)):
        return True
    return line.op in ("arith.divsi", "arith.remsi", "arith.divui", "arith.remui") and len(line.operands) == 2 \
        and _constant_int(module, line.operands[1]) not in (None, 0)


def _distinct_exit(module: Module, loop: int, values: list[str], indent: str, loc: str) -> list[str]:
    """A register move (:data:`_EXIT_MOVES`) of one used tensor result of the cold copy, replacing
    it in ``values``: the lines to emit before the cold branch's ``scf.yield``.

    Why: once Triton lowers ``scf`` to ``cf``, the exits of the two copies are identical blocks
    (the pipeliner's wait and shared-memory deallocations, then a branch to the join) and MLIR's
    block merging folds them into one block that receives either copy's buffers as arguments.
    Triton's shared-memory allocator then sees both copies' buffers as one live value and gives
    them disjoint space: twice the pipelined loop's shared memory (FlexAttention's forward: 208 KB
    instead of 112 KB, one CTA per SM instead of two). The move (free in ptxas, bit for bit the
    value) makes the cold exit differ, so the copies' buffers share their space again. The
    smallest such result (a float or integer tensor) is moved; where there is none the exits stay
    as they are, and a note says so."""
    head = parse_for(module.lines[loop])
    candidates = []
    for position, type_text in enumerate(head.result_types):
        kind = parse_type(type_text)
        element = kind.element if isinstance(kind, TensorType) else None
        if element in _EXIT_MOVES and result_used_after(module, loop, position):
            candidates.append((math.prod(kind.shape), position, type_text, element))
    if not candidates:
        return []
    _, position, type_text, element = min(candidates)
    moved = module.fresh("cold_exit")
    asm, register = _EXIT_MOVES[element]
    line = inline_asm_line(moved, asm, register, [values[position]], type_text, indent, loc)
    values[position] = moved
    return [line]


def version_loop(module: Module, loop: int, plan: Plan) -> tuple[int, str, bool]:
    """Rewrite ``loop`` into ``scf.if (no jump) {fast copy} else {original}`` (the original's exit
    made distinct, :func:`_distinct_exit`); returns the index of the fast copy's head in the
    rewritten module, the prefix its value names were given (``%x`` of the loop is ``%<prefix>_x``
    in the copy) and whether the exit was made distinct."""
    line = module.lines[loop]
    head = parse_for(line)
    step = constant_step(module, head.step)
    ops = IROps(module, line.indent, module.lines[module.end_of(loop)].loc)
    condition = _no_jump_condition(ops, ops.leaf(head.lower), ops.leaf(head.upper), step, plan.compares)
    fast = _fast_copy(module, loop, plan, ops, step)
    cold = [module.lines[i].text for i in range(loop, module.end_of(loop) + 1)]
    cold[-1] = with_attribute(cold[-1], VERSIONED)
    inner = "  "
    results = line.results[0] if line.results else None
    count = len(head.iter_args)
    fast_name, cold_name = module.fresh("fast"), module.fresh("cold")
    closing_loc = module.lines[module.end_of(loop)].loc
    emitted = list(ops.lines)
    if results is not None:
        types = ", ".join(head.result_types)
        emitted.append(f"{line.indent}{results}{f':{count}' if count > 1 else ''} = scf.if {condition} -> "
                       f"({types}) {{")
    else:
        emitted.append(f"{line.indent}scf.if {condition} {{")
    first_fast, prefixes, exit_move = len(emitted), [], []
    for position, (copy, name) in enumerate(((fast, fast_name), (cold, cold_name))):
        if position == 1:
            emitted.append(f"{line.indent}}} else {{")
        if results is not None:
            copy = [re.sub(r"^(\s*)" + re.escape(results) + r"(?=[:\s])", r"\g<1>" + name, copy[0], 1)] + copy[1:]
        prefixes.append(module.fresh("v")[1:])
        emitted += [inner + text for text in renamed(copy, prefixes[-1])]
        if results is not None:
            values = [f"{name}#{k}" for k in range(count)] if count > 1 else [name]
            if position == 1:
                exit_move = _distinct_exit(module, loop, values, line.indent + inner, closing_loc)
                emitted += exit_move
            emitted.append(f"{line.indent}{inner}scf.yield {', '.join(values)} : {types} {closing_loc}".rstrip())
    emitted.append(f"{line.indent}}} {closing_loc}".rstrip())
    texts = [other.text for other in module.lines]
    module.replace(texts[:loop] + emitted + texts[module.end_of(loop) + 1:])
    return loop + first_fast, prefixes[0], bool(exit_move)


def versioned_rewrite(module: Module, loop: int, plan: Plan,
                      rewrite: Callable[[Module, int, Callable[[str], str]], object]) -> object:
    """Try ``rewrite`` (a pass's rewrite of one loop: given the module, the loop's index and the
    map from a value name of the original loop to its name in the copy; returns a reason string
    when it does not apply) on the fast copy of ``loop`` versioned by ``plan`` on a trial copy of
    the module. On success ``module`` holds the versioned, rewritten loop and the rewrite's
    outcome is returned; else ``module`` is untouched and the reason is returned."""
    trial = Module(module.text())
    trial._counter = module._counter
    fast, prefix, distinct_exit = version_loop(trial, loop, plan)
    outcome = rewrite(trial, fast, lambda name: f"%{prefix}_{name[1:]}")
    if isinstance(outcome, str):
        return outcome
    if not distinct_exit:
        note(f"loop {parse_for(module.lines[loop]).iv}: its cold copy's exit is not made distinct (no result used "
             f"after the loop is a tensor of {', '.join(_EXIT_MOVES)}): Triton may keep both copies' pipelined "
             "buffers in shared memory at once")
    counter = trial._counter
    module.replace([line.text for line in trial.lines])
    module._counter = counter
    return outcome


def version_refused_loop(module: Module, loop: int, refusal: str,
                         rewrite: Callable[[Module, int, Callable[[str], str]], object]) -> tuple[bool, object]:
    """For a loop a pass refused with ``refusal``: version it and try ``rewrite`` on the fast copy
    (:func:`versioned_rewrite`). ``(True, the rewrite's outcome)`` when that applied (``module``
    then holds it); else ``(False, refusal)``, extended with why versioning did not help where
    there is something to say."""
    plan = plan_versioning(module, loop)
    if isinstance(plan, str):
        return False, f"{refusal}; not versioned: {plan}" if plan else refusal
    outcome = versioned_rewrite(module, loop, plan, rewrite)
    if isinstance(outcome, str):
        return False, f"{refusal}; in a copy versioned on its carried offsets: {outcome}"
    return True, outcome


# --- the carried offsets back, once the passes are done -----------------------------------------------
@dataclass(frozen=True)
class ClosedForm:
    """``value = init + [splat]((iv' - lower) * factor)`` in a loop's body (``iv'`` the induction
    variable, or its sign extension to i64): the lines computing it, innermost first."""
    value: str
    lines: tuple[int, ...]
    factor: int
    width: int


def _closed_form(module: Module, loop: int, index: int) -> ClosedForm | None:
    """The closed form defined at line ``index`` of ``loop``'s body (as :func:`_fast_copy` emits
    it), else None."""
    iv = parse_for(module.lines[loop]).iv

    def defining(name: str, op: str):
        where = module.defs.get(base_name(name))
        if where is None or where < 0 or "#" in name or not module.inside(where, loop):
            return None, None
        line = module.lines[where]
        return (where, line) if line.op == op else (None, None)

    def outside(name: str) -> bool:        # fixed in the loop: defined before it (not its own block arguments)
        where = module.defs.get(base_name(name))
        return where is not None and where >= 0 and where != loop and not module.inside(where, loop)

    value_line = module.lines[index]
    if value_line.op != "arith.addi" or len(value_line.operands) != 2 or not outside(value_line.operands[0]):
        return None
    chain, advance = [index], value_line.operands[1]
    splat_at, splat = defining(advance, "tt.splat")
    if splat is not None:
        chain.append(splat_at)
        advance = splat.operands[0]
    product_at, product = defining(advance, "arith.muli")
    if product is None or len(product.operands) != 2 or not outside(product.operands[1]):
        return None
    factor = _constant_int(module, product.operands[1])
    distance_at, distance = defining(product.operands[0], "arith.subi")
    if factor is None or distance is None or len(distance.operands) != 2 or not outside(distance.operands[1]):
        return None
    chain += [product_at, distance_at]
    counter = distance.operands[0]
    if counter != iv:
        extend_at, extend = defining(counter, "arith.extsi")
        if extend is None or extend.operands != [iv]:
            return None
        chain.append(extend_at)
    width = int_width(type_of(module, product.results[0]) or "")
    return ClosedForm(value_line.results[0], tuple(chain), factor, width) if width else None


def _advanced_by(module: Module, loop: int, position: int) -> tuple[int, int] | None:
    """The line advancing iteration argument ``position`` of ``loop`` by a constant (``arg' = arg +
    C`` in the body, ``arg'`` read by nothing but the loop's ``scf.yield`` at ``position``) and
    ``C``, else None."""
    where = loop_advances(module, loop).get(position)
    if where is None:
        return None
    line = module.lines[where]
    yield_line = module.children(loop)[-1]
    yielded = module.lines[yield_line].operands
    if module.users(line.results[0], range(loop + 1, module.end_of(loop))) != [yield_line] \
            or yielded.count(yielded[position]) != 1:
        return None                     # the advanced value is read in the iteration as well
    constant = _constant_int(module, line.operands[1])
    return None if constant is None else (where, constant)


def _feeds_addresses(module: Module, loop: int, value: str) -> bool:
    """Whether an address (a ``tt.addptr``) in ``loop`` is computed from ``value``.

    Such a tensor offset keeps its closed form: Triton's pipeliner computes load addresses
    iterations ahead, and a carried tensor is then held across the stages. Compiled for sm_90a,
    FlexAttention's dK/dV loop (its query offsets feed the pointers) reloaded 12-13 values from
    local memory per step with its offsets carried against 1-5 with the closed form, while the
    forward (its key offsets only feed the mask) went from 32-42 to 1 with them carried."""
    body = range(loop + 1, module.end_of(loop))
    pending, seen = [value], set()
    while pending:
        name = pending.pop()
        for index in module.users(base_name(name), body):
            line = module.lines[index]
            if line.op == "tt.addptr":
                return True
            for result in line.results:
                if result not in seen and line.op != "scf.yield":
                    seen.add(result)
                    pending.append(result)
    return False


def _restore_in_loop(module: Module, loop: int) -> int:
    """Give ``loop`` (a copy of a fast copy) its carried offsets back and drop its mark; returns how
    many offsets it carries again."""
    head = parse_for(module.lines[loop])
    step = constant_step(module, head.step)
    end = module.end_of(loop)
    forms = [form for index in module.children(loop) if (form := _closed_form(module, loop, index))]
    line = module.lines[loop]
    indent, loc = line.indent, line.loc
    before, inits, replaced, unread = [], [init for _, init in head.iter_args], {}, 0
    for position, (arg, init) in enumerate(head.iter_args):
        advance = _advanced_by(module, loop, position)
        if step is None or advance is None or result_used_after(module, loop, position):
            continue
        advance_line, constant = advance
        if module.users(arg, range(loop + 1, end)) != [advance_line]:
            continue             # read in the body as well (an offset the loop carried before it was versioned)
        for form in forms:
            if form.value in replaced or type_of(module, form.value) != head.result_types[position] \
                    or _wrapped(form.factor * step, form.width) != _wrapped(constant, form.width) \
                    or (isinstance(parse_type(head.result_types[position]), TensorType)
                        and _feeds_addresses(module, loop, form.value)):
                continue
            # the closed form at the loop's lower bound: the same lines, the induction variable replaced
            names = {module.lines[i].results[0]: module.fresh("carried") for i in form.lines}
            for i in reversed(form.lines):
                text = substitute(module.lines[i].text.strip(), head.iv, head.lower)
                for old, new in names.items():
                    text = substitute(text, old, new)
                before.append(f"{indent}{text}")
            inits[position] = names[form.value]
            replaced[form.value] = arg
            break
        else:
            source = module.defs.get(base_name(init))
            if source is not None and 0 <= source < loop and module.end_of(source) < loop \
                    and module.lines[source].op == "scf.for":
                # only its own advance reads it (a copy without the mask ops): no iteration uses its value,
                # so it need not come from the previous copy, whose closed form can then be restored too
                zero = module.fresh("unread")
                value = "dense<0>" if isinstance(parse_type(head.result_types[position]), TensorType) else "0"
                before.append(f"{indent}{zero} = arith.constant {value} : {head.result_types[position]} {loc}".rstrip())
                inits[position] = zero
                unread += 1
    texts = [other.text for other in module.lines]
    if not replaced and not unread:
        texts[end] = without_attribute(texts[end], CLOSED_FORMS)
        module.replace(texts)
        return 0
    loop_lines = [with_inits(texts[loop], head, inits)]
    for i in range(loop + 1, end + 1):
        text = texts[i]
        if module.lines[i].results[:1] and module.lines[i].results[0] in replaced:
            loop_lines.append(text)                 # the closed form itself: dead from here on
            continue
        for value, arg in replaced.items():
            text = substitute(text, value, arg)
        loop_lines.append(text)
    loop_lines[-1] = without_attribute(loop_lines[-1], CLOSED_FORMS)
    loop_lines = without_dead_ops(loop_lines, is_movable)
    module.replace(texts[:loop] + before + loop_lines + texts[end + 1:])
    return len(replaced)


def restore_carried_offsets(text: str) -> tuple[str, int]:
    """``text`` with the carried offsets of the loops made from fast copies (marked
    :data:`CLOSED_FORMS`) given back, and how many were.

    In such a loop an offset the fast copy advances by a constant ``C`` (``arg' = arg + C``) is
    used through its closed form ``init + (iv - lower) * C / step``. Where the loop's result for it
    is not used after the loop, each use of the closed form becomes a use of ``arg``, and ``arg``
    starts at the closed form of the loop's lower bound. Exact: both start equal and both advance
    by ``C`` per iteration (integer arithmetic, wrap-around included), so every iteration reads the
    value it read before; only the loop's final value of ``arg`` can differ, and it is unused
    (``arg`` and ``arg'`` are read by nothing but the advance and the ``scf.yield``). The loops are
    visited last first, so that a copy whose result only fed the next copy's initial value
    (replaced there) is also restored. The marks are removed. An i64 offset keeps its closed form
    (the fast copy extends the lower bound to i64 inside the body)."""
    if CLOSED_FORMS not in text:
        return text, 0
    module = Module(text)
    restored = 0
    for loop in reversed(module.loops()):       # an edit inserts lines at or after ``loop`` only
        if CLOSED_FORMS in module.lines[module.end_of(loop)].text:
            restored += _restore_in_loop(module, loop)
    return module.text(), restored
