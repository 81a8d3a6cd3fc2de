"""The layout half of the exactness check: every reduction of a patched kernel runs on the layout the
unpatched kernel gives it.

A reduction (``tt.reduce``: a row max, a row sum; ``tt.scan``) combines each thread's elements first,
then the threads' partial results, so the order in which it adds floats follows from how its operand
is laid out over threads and warps. Triton assigns those layouts after the IR passes run, from the
shape of the whole loop: AccelerateMatmul, for example, gives the ``q @ k`` dot of an attention loop
``warpsPerCTA = [8, 1]`` when it sees the dot's result feed the ``p @ v`` dot, and ``[4, 2]`` when
something hides that chain (an ``scf.if`` between the two dots did). The rewritten loop then computes
the same values in another order, and its results differ in the low bits, which the PTX comparison
of contractions (:mod:`.float_contraction`) cannot see: each thread does different work.

So the patched TTGIR's reductions are compared with the unpatched TTGIR's by source location: at every
location where both have a reduction whose combiner rounds (a sum; a max or min gives the same value in
any order), each patched one that reduces a dot's result (an operand in an
MMA layout, the layout AccelerateMatmul chooses from the loop around the dot) must reduce an operand
of a type (shape, element, layout) that an unpatched one reduces there. A reduction of values no dot
produced is not compared: in elide-uniform-masks' output that is an all-false copy, whose dot is gone
and whose tile is -inf or derived from it (the same value in any order), reduced in a blocked layout.
Dots are not compared either: an MMA's accumulation order along K is the instruction's, whichever
warps hold which output tiles. Nor is an MMA layout's instruction shape: a wgmma of N=32 repeated
twice over 64 columns gives each thread the columns, in the registers' order, that one of N=64 does
(the GPU fuzzer's kernels that differ only there are bitwise equal), so only the layout's version and
its warps are compared.
"""
from __future__ import annotations

import re

_ALIAS = re.compile(r"^(#[\w.$-]+)\s*=\s*(.*?)\s*$")
_REFERENCE = re.compile(r"#[A-Za-z_][\w.$-]*")
_OPENS = re.compile(r'"tt\.(reduce|scan)"\(')
_MMA = "#ttg.nvidia_mma<"            # the layout of a dot's result (resolved), as AccelerateMatmul chose it
_ROUNDING = re.compile(r"\b(?:arith\.(?:addf|subf|mulf|divf)|math\.fma)\b")   # a combiner whose result depends on the order
_INSTRUCTION_SHAPE = re.compile(r",\s*instrShape\s*=\s*\[[^\]]*\]")
_CLOSES = re.compile(r"^\s*\}\)\s*:\s*\((.*)\)\s*->\s*(.*?)\s*loc\((.*)\)\s*$")


def _aliases(lines: list[str]) -> dict:
    """``#name`` -> its definition (attribute and location aliases of the printed module)."""
    return {m.group(1): m.group(2) for m in map(_ALIAS.match, lines) if m}


def _resolved(text: str, aliases: dict, depth: int = 0) -> str:
    """``text`` with every alias reference replaced by its definition, recursively."""
    if depth > 16:
        return text
    return _REFERENCE.sub(lambda m: _resolved(aliases[m.group(0)], aliases, depth + 1) if m.group(0) in aliases
                          else m.group(0), text)


def reductions(ttgir: str) -> dict:
    """``(kind, source location) -> set of operand types`` of the module's reductions and scans whose
    combiner rounds (a float add, multiply, ...: a sum, not a max), with layouts and locations spelled
    out (aliases resolved, an MMA layout's instruction shape left out)."""
    lines = ttgir.splitlines()
    aliases = _aliases(lines)
    found: dict = {}
    open_kinds: list[list] = []       # [kind, indentation, whether its combiner rounds] of the reductions being read
    for line in lines:
        opened = _OPENS.search(line)
        if opened:
            open_kinds.append([opened.group(1), len(line) - len(line.lstrip()), False])
            continue
        if open_kinds and _ROUNDING.search(line):
            open_kinds[-1][2] = True
        closed = _CLOSES.match(line)
        if closed and open_kinds and len(line) - len(line.lstrip()) == open_kinds[-1][1]:
            kind, _, rounds = open_kinds.pop()
            if rounds:
                location = _resolved(closed.group(3), aliases)
                operand = _INSTRUCTION_SHAPE.sub("", _resolved(closed.group(1), aliases))
                found.setdefault((kind, location), set()).add(operand)
    return found


def reduction_layout_changes(unpatched_ttgir: str, patched_ttgir: str) -> list[str]:
    """Where a reduction of a dot's result in ``patched_ttgir`` runs on an operand layout that no
    reduction of ``unpatched_ttgir`` at the same source location has: one line per location (empty:
    none)."""
    before, after = reductions(unpatched_ttgir), reductions(patched_ttgir)
    changes = []
    for (kind, location), types in sorted(after.items()):
        known = before.get((kind, location))
        if known is None:
            continue
        for operand in sorted(t for t in types - known if _MMA in t):
            changes.append(f"{_short(location)}: a tt.{kind} of {_layout(operand)}, where the unpatched kernel reduces "
                           f"{' or '.join(sorted(_layout(t) for t in known))}")
    return changes


def _short(location: str) -> str:
    """``file.py:line:column`` of a resolved location (its innermost file position)."""
    match = re.search(r'"([^"]*)":(\d+):(\d+)', location)
    return f"{match.group(1).rsplit('/', 1)[-1]}:{match.group(2)}:{match.group(3)}" if match else location[:120]


def _layout(operand: str) -> str:
    """The part of an operand type that says how it is spread: the layout's warps, threads and
    registers per thread where they are given."""
    parts = [m.group(0) for m in re.finditer(r"(warpsPerCTA|threadsPerWarp|sizePerThread)\s*=\s*\[[^\]]*\]",
                                             operand)]
    return f"{operand.split(',', 1)[0]}, ...> ({', '.join(parts)})" if parts else operand[:160]
