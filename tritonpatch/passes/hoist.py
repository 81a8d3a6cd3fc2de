"""``hoist-masks``: loop-invariant code motion for mask computations, after ``make_ttgir``.

Triton's LICM hoists invariant ops at the top level of a loop body but leaves those nested under
``scf.if`` and hoists invariant broadcasts, which keeps a full-tile tensor live across the loop.
This pass

* hoists single-line ops without side effects that neither read memory nor trap (an allow-list,
  :func:`~tritonpatch.passes.ir.is_movable`: no loads, no integer division, no inline assembly or
  external calls, pure or not) whose operands are defined outside the loop (or by ops it already
  hoisted) from anywhere inside the loop body except nested loops; a
  ``tt.broadcast`` moves only together with a user (alone it would only widen a live value), and
* with ``sink_broadcasts``, moves a ``tt.broadcast`` defined just outside a loop, and used only
  inside it, back in front of its first use inside the loop.

Pure code motion of side-effect-free ops: bitwise exact.
"""
from __future__ import annotations

from .ir import Module, is_movable


def _defined_outside(module: Module, loop: int, name: str, hoisted: set[str]) -> bool:
    where = module.defs.get(name)
    return name in hoisted or (where is not None and where != loop and not module.inside(where, loop))


def _hoistable(module: Module, loop: int) -> list[int]:
    """Lines inside ``loop`` (outside nested loops) that can move in front of it, in order."""
    hoisted_names: set[str] = set()
    found = []
    for index in range(loop + 1, module.end_of(loop)):
        line = module.lines[index]
        if (line.opens or line.closes or len(line.results) != 1 or not is_movable(line)
                or line.op == "arith.constant"):
            continue
        if any(module.lines[o].op == "scf.for" for o in module.enclosing_ops(index) if o != loop and module.inside(o, loop)):
            continue
        if all(_defined_outside(module, loop, name, hoisted_names) for name in module.uses(index)):
            hoisted_names.add(line.results[0])
            found.append(index)
    # a broadcast none of whose users moves stays in the loop: hoisting it alone only widens a live value
    body = range(loop + 1, module.end_of(loop))
    moving = set(found)
    return [i for i in found if module.lines[i].op != "tt.broadcast"
            or any(u in moving for u in module.users(module.lines[i].results[0], body))]


def _sinkable(module: Module, loop: int) -> list[tuple[int, int]]:
    """(broadcast line, first use line inside the loop) for broadcasts worth sinking."""
    parent = module.parent_of[loop]
    siblings = module.children(parent) if parent is not None else []
    body = range(loop + 1, module.end_of(loop))
    after = range(module.end_of(loop) + 1, len(module.lines))
    moves = []
    for index in siblings:
        if index >= loop:
            break
        line = module.lines[index]
        if line.op != "tt.broadcast" or len(line.results) != 1:
            continue
        name = line.results[0]
        users = module.users(name, range(index + 1, len(module.lines)))
        if users and all(u in body for u in users) and not module.users(name, after):
            top = [c for c in module.children(loop) if any(c == u or module.inside(u, c) for u in users)]
            if top:
                moves.append((index, top[0]))
    return moves


def run(text: str, options) -> tuple[str, dict[str, int]]:
    module = Module(text)
    counts = {"ops_hoisted": 0, "broadcasts_sunk": 0}
    for loop in reversed(module.loops()):
        hoist = _hoistable(module, loop)
        sink = _sinkable(module, loop) if options["sink_broadcasts"] else []
        if not hoist and not sink:
            continue
        indent = module.lines[loop].indent
        texts = [line.text for line in module.lines]
        moved_in = {target: [] for _, target in sink}
        for source, target in sink:
            moved_in[target].append(module.lines[target].indent + texts[source].lstrip())
        skip = set(hoist) | {source for source, _ in sink}
        new = []
        for index, text_line in enumerate(texts):
            if index == loop:
                new += [indent + texts[i].lstrip() for i in hoist]
            if index in moved_in:
                new += moved_in[index]
            if index not in skip:
                new.append(text_line)
        module.replace(new)
        counts["ops_hoisted"] += len(hoist)
        counts["broadcasts_sunk"] += len(sink)
    return (module.text() if any(counts.values()) else text), counts
