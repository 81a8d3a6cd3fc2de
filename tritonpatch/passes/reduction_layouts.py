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

So the patched TTGIR's reductions are compared with the unpatched TTGIR's by source location. Every
patched reduction whose combiner rounds (anything but max, min, compares, selects and integer ops: a
float sum, a library or inline-assembly add) and whose operand is a dot's result (an MMA layout, the
one AccelerateMatmul chooses from the loop around the dot) must reduce an operand of a type (shape,
element, layout) that an unpatched reduction at the same location reduces; one at a location where
the unpatched kernel has none is refused too. An MMA layout's instruction shape is left out of the
comparison where the layout has one warp along N: a wgmma of N=32 repeated twice over 64 columns then
gives each thread the columns, in the registers' order, that one of N=64 does (with warps along N it
does not, so there the shape is compared).

Not compared: reductions of operands in other (blocked) layouts. In elide-uniform-masks' output the
ones that change layout are in all-false copies (the dot gone, a tile of -inf or of zeros and NaNs
derived from it, the same in any order, reduced in a blocked layout; a loop mark does not survive
Triton's pipeliner to tell them apart), so comparing them refuses exact kernels; a pass that changes
the blocked layout of a real sum is not caught here, and the GPU fuzzer remains the check for that.
Dots are not compared: an MMA's accumulation order along K is the instruction's, whichever warps hold
which output tiles.
"""
from __future__ import annotations

import re

from .ir import Module, region_ops

_ALIAS = re.compile(r"^(#[\w.$-]+)\s*=\s*(.*?)\s*$")
_REFERENCE = re.compile(r"#[A-Za-z_][\w.$-]*")
_CLOSES = re.compile(r"^\s*\}\)\s*:\s*\((.*)\)\s*->\s*(.*?)\s*loc\((.*)\)\s*$")
_EXACT_COMBINERS = {"arith.maxnumf", "arith.minnumf", "arith.maximumf", "arith.minimumf", "arith.cmpf", "arith.cmpi",
                    "arith.select", "arith.maxsi", "arith.minsi", "arith.maxui", "arith.minui", "arith.addi",
                    "arith.subi", "arith.muli", "arith.andi", "arith.ori", "arith.xori", "arith.constant",
                    "tt.reduce.return", "tt.scan.return"}
_MMA = "#ttg.nvidia_mma<"            # the layout of a dot's result (resolved), as AccelerateMatmul chose it
_ONE_WARP_ALONG_N = re.compile(r"warpsPerCTA\s*=\s*\[\d+,\s*1\]")
_INSTRUCTION_SHAPE = re.compile(r",\s*instrShape\s*=\s*\[[^\]]*\]")


def _aliases(lines: list[str]) -> dict:
    """``#name`` -> its definition (attribute and location aliases of the printed module)."""
    return {m.group(1): m.group(2) for m in map(_ALIAS.match, lines) if m}


def _resolved(text: str, aliases: dict, depth: int = 0) -> str:
    """``text`` with every alias reference replaced by its definition, recursively."""
    if depth > 16:
        return text
    return _REFERENCE.sub(lambda m: _resolved(aliases[m.group(0)], aliases, depth + 1) if m.group(0) in aliases
                          else m.group(0), text)


def _normalised(operand: str) -> str:
    """An operand type with an MMA layout's instruction shape left out where the layout has one warp
    along N (see the module docstring)."""
    return _INSTRUCTION_SHAPE.sub("", operand) if _ONE_WARP_ALONG_N.search(operand) else operand


def reductions(ttgir: str) -> dict:
    """``(kind, source location) -> set of operand types`` of the module's reductions and scans whose
    combiner rounds, with layouts and locations spelled out (aliases resolved)."""
    module = Module(ttgir)
    aliases = _aliases(ttgir.splitlines())
    found: dict = {}
    for index, line in enumerate(module.lines):
        if line.op not in ("tt.reduce", "tt.scan") or set(region_ops(module, index)) <= _EXACT_COMBINERS:
            continue
        closed = _CLOSES.match(module.lines[module.end_of(index)].text)
        if closed:
            location = _resolved(closed.group(3), aliases)
            found.setdefault((line.op[3:], location), set()).add(_normalised(_resolved(closed.group(1), aliases)))
    return found


def reduction_layout_changes(unpatched_ttgir: str, patched_ttgir: str) -> list[str]:
    """Where a rounding reduction of a dot's result in ``patched_ttgir`` runs on an operand layout that
    no reduction of ``unpatched_ttgir`` at the same source location has, or has no counterpart there:
    one line per case (empty: none)."""
    before, after = reductions(unpatched_ttgir), reductions(patched_ttgir)
    changes = []
    for (kind, location), all_types in sorted(after.items()):
        types = {t for t in all_types if _MMA in t}
        known = before.get((kind, location))
        if not types:
            continue
        if known is None:
            changes.append(f"{_short(location)}: a tt.{kind} that the unpatched kernel does not have there, so its "
                           "order cannot be compared")
            continue
        for operand in sorted(types - known):
            changes.append(f"{_short(location)}: a tt.{kind} of {_layout(operand)}, where the unpatched kernel reduces "
                           f"{' or '.join(sorted(_layout(t) for t in known))}")
    return changes


def _short(location: str) -> str:
    """``file.py:line:column`` of a resolved location (its innermost file position)."""
    match = re.search(r'"([^"]*)":(\d+):(\d+)', location)
    return f"{match.group(1).rsplit('/', 1)[-1]}:{match.group(2)}:{match.group(3)}" if match else location[:120]


def _layout(operand: str) -> str:
    """The part of an operand type that says how it is spread: the layout's warps, threads, registers
    per thread and instruction shape where they are given."""
    parts = [m.group(0) for m in re.finditer(r"(warpsPerCTA|threadsPerWarp|sizePerThread|instrShape)\s*=\s*\[[^\]]*\]",
                                             operand)]
    return f"{operand.split(',', 1)[0]}, ...> ({', '.join(parts)})" if parts else operand[:160]
