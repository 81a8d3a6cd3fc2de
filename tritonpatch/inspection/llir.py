"""The natural loops of a kernel's LLVM IR and their instruction mix."""
from __future__ import annotations

import collections
import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class LoopStats:
    """One natural loop of the LLVM IR: its blocks and instruction counts by opcode."""

    header: str
    blocks: int
    instructions: int
    opcodes: dict[str, int]


_LLIR_LABEL_RE = re.compile(r"^([\w.$-]+):")
_LLIR_TARGET_RE = re.compile(r"label %([\w.$-]+)")


def _llir_blocks(llir: str) -> dict[str, list[str]]:
    """Blocks (name -> instruction lines) of the first defined function with a body."""
    body = re.search(r"^define [^\n]*\{\n(.*?)^\}", llir, re.S | re.M)
    if not body:
        raise ValueError("no function definition in the LLVM IR")
    blocks: dict[str, list[str]] = {}
    current = "entry"
    blocks[current] = []
    for line in body.group(1).splitlines():
        label = _LLIR_LABEL_RE.match(line)
        if label:
            current = label.group(1)
            blocks[current] = []
        elif line.strip() and not line.lstrip().startswith(";"):
            blocks[current].append(line.strip())
    if not blocks["entry"]:
        del blocks["entry"]
    return blocks


def _opcode(instruction: str) -> str:
    words = instruction.split(" = ", 1)[-1].split()
    words = [w for w in words if w not in ("tail", "musttail", "notail")]
    return words[0] if words else "?"


def llir_loops(llir: str) -> list[LoopStats]:
    """Natural loops of the kernel's LLVM IR (back edges found by depth-first search), largest first.
    Read from the IR text, so it follows whatever LLVM version the Triton in use prints."""
    blocks = _llir_blocks(llir)
    names = list(blocks)
    successors = {name: [t for t in _LLIR_TARGET_RE.findall(blocks[name][-1]) if t in blocks] if blocks[name] else []
                  for name in names}
    predecessors: dict[str, list[str]] = collections.defaultdict(list)
    for name, targets in successors.items():
        for target in targets:
            predecessors[target].append(name)
    back_edges, on_stack, visited = [], set(), set()
    stack = [(names[0], iter(successors[names[0]]))]
    visited.add(names[0])
    on_stack.add(names[0])
    while stack:
        node, children = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            on_stack.discard(node)
        elif child in on_stack:
            back_edges.append((node, child))
        elif child not in visited:
            visited.add(child)
            on_stack.add(child)
            stack.append((child, iter(successors[child])))
    loops: dict[str, set[str]] = collections.defaultdict(set)
    for tail, header in back_edges:
        body, work = {header, tail}, ([tail] if tail != header else [])
        while work:
            for pred in predecessors[work.pop()]:
                if pred not in body:
                    body.add(pred)
                    work.append(pred)
        loops[header] |= body
    stats = []
    for header, body in loops.items():
        opcodes = collections.Counter(_opcode(i) for b in body for i in blocks[b])
        stats.append(LoopStats(header=header, blocks=len(body), instructions=sum(opcodes.values()), opcodes=dict(opcodes)))
    return sorted(stats, key=lambda s: -s.instructions)
