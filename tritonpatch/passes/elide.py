"""``elide-uniform-masks``: skip the mask ops on tiles where the mask is uniform.

For ``%r = arith.select %mask, %x, %c`` directly in an ``scf.for`` body, with ``%mask`` an
analysable combination of affine index compares (:mod:`.masks`), the pass emits the per-tile
verdict as scalar ops and computes the mask only on mixed tiles::

    %m = scf.if %all_true_or_all_false { yield splat(%all_true) }
         else { <loop-variant mask ops>; yield %mask }
    %r = arith.select %m, %x, %c

The select itself stays, with the same floating-point operands: the floating-point dataflow is
unchanged, so the backend contracts (FMA) exactly as in the unpatched kernel and the result is
bitwise identical. (Yielding ``%x`` / ``%c`` from the branches instead was measured faster on H200,
1.13 vs 1.29 of unmasked, but lets LLVM fuse the multiply after the select into an FMA on
all-true tiles, which changes low bits; a branch yielding the fill constant also made Triton's
pipeliner fail and its layout pass duplicate the softmax chain.) Loop-invariant mask ops stay where
they are (Triton's LICM hoists them).
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


def elide_select(module: Module, loop: int, select: int, max_atoms: int) -> int | None:
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
    all_true, all_false = guarded_verdict(ops, mask, analysis.checks)
    uniform = ops.or_(all_true, all_false)
    mask_type = split_top_level(line.body.rsplit(" : ", 1)[1])[0]
    mask_value, constant = module.fresh(ELIDED_IF_HINT), module.fresh("uniform_mask")
    out = list(ops.lines)
    out.append(f"{indent}{mask_value} = scf.if {uniform} -> ({mask_type}) {{")
    out.append(f"{indent}  {constant} = tt.splat {all_true} : i1 -> {mask_type} {loc}".rstrip())
    out.append(f"{indent}  scf.yield {constant} : {mask_type} {loc}".rstrip())
    out.append(f"{indent}}} else {{")
    out += [indent + "  " + module.lines[i].text.lstrip() for i in moved]
    out.append(f"{indent}  scf.yield {mask_name} : {mask_type} {loc}".rstrip())
    out.append(f"{indent}}} {loc}".rstrip())
    out.append(f"{indent}{line.results[0]} = arith.select {mask_value}, {true_value}, {false_value} : "
               f"{mask_type}, {value_type} {loc}".rstrip())
    texts = [l.text for l in module.lines]
    new_texts = []
    for index, text in enumerate(texts):
        if index == select:
            new_texts += out
        elif index not in moved:
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
                moved = elide_select(module, loop, index, options["max_atoms"])
                if moved is not None:
                    counts["selects_elided"] += 1
                    counts["mask_ops_moved"] += moved
                    progress = True
                    break
            if progress:
                break
    return module.text(), counts
