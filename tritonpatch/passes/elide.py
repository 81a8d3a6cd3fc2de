"""``elide-uniform-masks``: skip the mask ops on tiles where the mask is uniform.

For ``%r = arith.select %mask, %x, %c`` directly in an ``scf.for`` body, with ``%mask`` an
analysable combination of affine index compares (:mod:`.masks`), the pass emits the per-tile
verdict as scalar ops and replaces the select by::

    %r = scf.if %all_true { yield %x }
         else { %m = scf.if %all_false { yield dense<false> } else { <loop-variant mask ops>; yield %mask }
                yield select(%m, %x, %c) }

Loop-invariant mask ops stay where they are (Triton's LICM hoists them). Bitwise exact: on a
uniform tile the select would have returned exactly ``%x`` or ``%c``.
"""
from __future__ import annotations

from .ir import Module, TensorType, base_name, parse_for, parse_type, split_top_level
from .masks import Analysis, IROps, guarded_verdict

ELIDED_IF_HINT = "uniform"


def select_parts(module: Module, index: int):
    """(mask, true value, false value, result type) of a tensor-mask select line, else None."""
    line = module.lines[index]
    if line.op != "arith.select" or len(line.results) != 1:
        return None
    operands = line.operands
    types = split_top_level(line.body.rsplit(" : ", 1)[1]) if " : " in line.body else []
    if len(operands) != 3 or len(types) != 2 or not isinstance(parse_type(types[0]), TensorType):
        return None
    return operands[0], operands[1], operands[2], types[1]


def loop_invariant(module: Module, loop: int) -> set[int]:
    """Top-level body lines of ``loop`` that are pure single-line ops whose operands are defined
    outside the loop or by other such lines (what a LICM pass may hoist)."""
    invariant: set[int] = set()
    for index in module.children(loop):
        line = module.lines[index]
        if line.opens or not is_pure(line.op):
            continue
        if all(not (module.defs.get(n) == loop or module.inside(module.defs.get(n, -1), loop))
               or module.defs.get(n) in invariant for n in module.uses(index)):
            invariant.add(index)
    return invariant


def is_pure(op: str) -> bool:
    """Side-effect-free ops that never trap (no integer division: it may be UB when hoisted)."""
    if op in ("arith.divsi", "arith.divui", "arith.remsi", "arith.remui", "arith.ceildivsi", "arith.floordivsi",
              "arith.ceildivui"):
        return False
    return op.startswith(("arith.", "math.")) or op in (
        "tt.splat", "tt.broadcast", "tt.expand_dims", "tt.make_range", "tt.reshape", "tt.trans",
        "ttg.convert_layout", "tt.addptr", "tt.bitcast", "tt.int_to_ptr", "tt.ptr_to_int")


def movable_mask_ops(module: Module, loop: int, analysis: Analysis, select: int, keep: set[str]) -> list[int]:
    """Loop-variant mask ops at the top level of the loop body used only by the mask and the select."""
    top_level = set(module.children(loop))
    candidates = {i for i in analysis.ops if i in top_level} - loop_invariant(module, loop)
    candidates = {i for i in candidates if not any(r in keep for r in module.lines[i].results)}
    body = range(loop + 1, module.end_of(loop))
    changed = True
    while changed:
        changed = False
        for index in sorted(candidates):
            for result in module.lines[index].results:
                users = {user for user in module.users(result, body)}
                outside = {u for u in users if u != select and not any(u == c or module.inside(u, c) for c in candidates)}
                if outside:
                    candidates.discard(index)
                    changed = True
                    break
    return sorted(candidates)


def elide_select(module: Module, loop: int, select: int, max_atoms: int, all_false: bool) -> int | None:
    """Rewrite one select; returns how many mask ops moved under the branch, or None (module
    untouched) when the mask is not analysable."""
    parts = select_parts(module, select)
    if parts is None:
        return None
    mask_name, true_value, false_value, value_type = parts
    analysis = Analysis(module)
    mask = analysis.mask(mask_name)
    if mask is None or not 0 < mask.atoms() <= max_atoms:
        return None
    moved = movable_mask_ops(module, loop, analysis, select, {base_name(true_value), base_name(false_value)})
    line = module.lines[select]
    indent, loc = line.indent, line.loc
    ops = IROps(module, indent, loc)
    all_true_flag, all_false_flag = guarded_verdict(ops, mask, analysis.checks)
    result, mask_type = line.results[0], split_top_level(line.body.rsplit(" : ", 1)[1])[0]
    out = list(ops.lines)
    out.append(f"{indent}{result} = scf.if {all_true_flag} -> ({value_type}) {{")
    out.append(f"{indent}  scf.yield {true_value} : {value_type} {loc}".rstrip())
    out.append(f"{indent}}} else {{")
    if all_false:
        # On all-false tiles the select runs on a constant-false mask: yielding the fill value from
        # a branch makes Triton rematerialise the softmax chain in two layouts (measured in TTGIR).
        mask_value, inner = module.fresh(ELIDED_IF_HINT), indent + "    "
        none = module.fresh("none")
        out.append(f"{indent}  {mask_value} = scf.if {all_false_flag} -> ({mask_type}) {{")
        out.append(f"{inner}{none} = arith.constant dense<false> : {mask_type} {loc}".rstrip())
        out.append(f"{inner}scf.yield {none} : {mask_type} {loc}".rstrip())
        out.append(f"{indent}  }} else {{")
        out += [inner + module.lines[i].text.lstrip() for i in moved]
        out.append(f"{inner}scf.yield {mask_name} : {mask_type} {loc}".rstrip())
        out.append(f"{indent}  }} {loc}".rstrip())
    else:
        mask_value = mask_name
        out += [indent + "  " + module.lines[i].text.lstrip() for i in moved]
    masked = module.fresh("masked")
    out.append(f"{indent}  {masked} = arith.select {mask_value}, {true_value}, {false_value} : "
               f"{mask_type}, {value_type} {loc}".rstrip())
    out.append(f"{indent}  scf.yield {masked} : {value_type} {loc}".rstrip())
    out.append(f"{indent}}} {loc}".rstrip())
    texts = [l.text for l in module.lines]
    new_texts = []
    for index, text in enumerate(texts):
        if index in moved:
            continue
        if index == select:
            new_texts += out
        else:
            new_texts.append(text)
    module.replace(new_texts)
    return len(moved)


def run(text: str, options) -> tuple[str, dict[str, int]]:
    """Elide the mask of every analysable select in every loop body."""
    module = Module(text)
    counts = {"selects_elided": 0, "mask_ops_moved": 0}
    done: set[str] = set()
    progress = True
    while progress:
        progress = False
        for loop in module.loops():
            if parse_for(module.lines[loop]) is None:
                continue
            for index in module.children(loop):
                line = module.lines[index]
                if line.op != "arith.select" or not line.results or line.results[0] in done:
                    continue
                done.add(line.results[0])
                moved = elide_select(module, loop, index, options["max_atoms"], options["all_false"])
                if moved is not None:
                    counts["selects_elided"] += 1
                    counts["mask_ops_moved"] += moved
                    progress = True
                    break
            if progress:
                break
    return module.text(), counts
