"""The exactness check of a patched compile: every loop of the patched PTX fuses multiplies into
FMAs where the unpatched kernel's loop does.

The passes copy and narrow loops; each copy computes the values the unpatched loop computes, but the
backend decides per instruction whether a multiply and an add become one ``fma.rn`` (one rounding
instead of two), and that decision rests on facts it proves about the loop. Two were seen to differ
between an unpatched loop and its copies, and changed low bits of the output:

* the unpatched loop runs from a constant in steps of a power of two, so LLVM knows the low bits of
  the induction variable; it then proves some mask compares true element by element (``offs + 64 !=
  pid * 8`` on the odd columns), drops their selects and fuses ``s * scale - m`` into an FMA there.
  A copy that starts at a bound computed at run time has no such facts: it does not fuse;
* the all-true copy keeps a rounding boundary where the select sat (elide-uniform-masks), which
  is exact for the elements whose select the unpatched loop kept, not for those it dropped.

So after a patched compile the unpatched module is compiled to PTX as well, and each loop of the
patched PTX is matched to the unpatched loop it came from (by the source locations of its
instructions, then by the number of operations at each; a copy that agrees with one of several
equally close loops passes: a helper inlined into a masked and an unmasked loop gives both the same
locations). At every source location where both loops do the same number of floating-point
operations, the number of FMAs must be the same: an add that became an FMA (or stopped being one)
keeps its location and its count. A location whose count differs is one where the copy folded work
away (an all-false copy computing with a constant, a boundary added where the select sat), not a
contraction the copy made differently. A difference makes the compile fall back to the unpatched
kernel (hooks.py) and names the location.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_LABEL = re.compile(r"^(\$L__\w+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__\w+)\s*;")
_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+(\d+)")
_FLOAT_OP = re.compile(r"^\s*(?:@!?%\w+\s+)?(fma|mul|add|sub)((?:\.\w+)*)\.(f16x2|bf16x2|f16|bf16|f32|f64)\s")
_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"(?:\s*,\s*"([^"]*)")?')


@dataclass(frozen=True)
class PtxLoop:
    """One innermost loop of a PTX function: its first line and, per source location
    ``(file, line, column)``, the floating-point operations by kind (``fma.f32``, ``add.f32``, ...;
    rounding modifiers dropped)."""
    first_line: int
    operations: dict

    def locations(self) -> set:
        return set(self.operations)


def ptx_loops(ptx: str) -> list[PtxLoop]:
    """The innermost loops of ``ptx`` (a label with a backward branch to it), each with its
    floating-point operations per source location."""
    lines = ptx.splitlines()
    labels, spans = {}, []
    for index, line in enumerate(lines):
        label = _LABEL.match(line)
        if label:
            labels[label.group(1)] = index
        branch = _BRANCH.search(line)
        if branch and branch.group(1) in labels and labels[branch.group(1)] < index:
            spans.append((labels[branch.group(1)], index))
    innermost = [(a, b) for a, b in spans if not any(a < c and d <= b and (c, d) != (a, b) for c, d in spans)]
    owner = {}
    for a, b in innermost:
        for index in range(a, b + 1):
            owner[index] = (a, b)
    operations = {span: {} for span in innermost}
    location = None
    for index, line in enumerate(lines):
        loc = _LOC.match(line)
        if loc:
            location = tuple(int(part) for part in loc.groups())
            continue
        op = _FLOAT_OP.match(line)
        if op and index in owner and location is not None:
            kind = f"{op.group(1)}.{op.group(3)}"
            operations[owner[index]].setdefault(location, Counter())[kind] += 1
    return [PtxLoop(a, ops) for (a, _), ops in sorted(operations.items())]


def _source_files(ptx: str) -> dict:
    files = {}
    for line in ptx.splitlines():
        match = _FILE.match(line)
        if match:
            files[int(match.group(1))] = match.group(2).rsplit("/", 1)[-1]
    return files


def _fused(counts: Counter) -> int:
    return sum(n for kind, n in counts.items() if kind.startswith("fma."))


def contraction_changes(unpatched_ptx: str, patched_ptx: str) -> list[str]:
    """Where a loop of ``patched_ptx`` fuses a different number of multiply-adds than the loop of
    ``unpatched_ptx`` it came from, at a source location where both do the same number of
    floating-point operations: one line per location (empty when the contraction is the same)."""
    originals = [loop for loop in ptx_loops(unpatched_ptx) if loop.operations]
    files = _source_files(patched_ptx)
    changes = []
    for loop in ptx_loops(patched_ptx):
        if not loop.operations or not originals:
            continue
        verdicts = [_changes(original, loop, files) for original in _closest(originals, loop)]
        if all(verdicts):          # a copy that agrees with one of the loops it may have come from passes
            changes += verdicts[0]
    return list(dict.fromkeys(changes))


def _closest(originals: list, loop: PtxLoop) -> list:
    """The unpatched loops ``loop`` most likely came from: most source locations shared, then the
    closest number of floating-point operations per location (a helper inlined into two loops, one
    masked and one not, gives both the same locations; the masked one's copies keep its counts)."""
    def score(original):
        shared = original.locations() & loop.locations()
        distance = sum(abs(sum(original.operations.get(at, Counter()).values()) - sum(loop.operations.get(at, Counter()).values()))
                       for at in original.locations() | loop.locations())
        return len(shared), -distance
    scores = [score(original) for original in originals]
    best = max(scores)
    return [original for original, value in zip(originals, scores) if value == best]


def _changes(original: PtxLoop, loop: PtxLoop, files: dict) -> list[str]:
    changes = []
    for location in sorted(loop.locations() & original.locations()):
        before, after = original.operations[location], loop.operations[location]
        if sum(before.values()) == sum(after.values()) and _fused(before) != _fused(after):
            file, line, column = location
            changes.append(f"{files.get(file, 'file ' + str(file))}:{line}:{column}: the unpatched loop does "
                           f"{_describe(before)}, a patched loop {_describe(after)}")
    return changes


def _describe(counts: Counter) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
