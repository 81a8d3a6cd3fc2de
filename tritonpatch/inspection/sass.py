"""SASS: the instruction classes, the instruction mix of a cubin and of its loops, and which
exponentials run under an in-flight wgmma (nvdisasm)."""
from __future__ import annotations

import collections
import dataclasses
import os
import re
import tempfile

from .tools import run_tool, tool_path

# SASS opcode (the part before the first '.') -> instruction class.
SASS_CLASSES: dict[str, tuple[str, ...]] = {
    "tensor-core": ("HGMMA", "HMMA", "IMMA", "DMMA", "QGMMA", "IGMMA", "BGMMA", "UTCHMMA", "UTCQMMA"),
    "fp": ("FFMA", "FADD", "FMUL", "FMNMX", "FSETP", "FSEL", "FCHK", "FSET", "FRND", "HADD2", "HMUL2", "HFMA2",
           "HMNMX2", "HSETP2", "DADD", "DMUL", "DFMA", "DSETP", "FSWZADD"),
    "int": ("IMAD", "IADD3", "IADD", "VIADD", "LOP3", "LOP", "SHF", "SHL", "SHR", "ISETP", "IMNMX", "VIMNMX", "LEA",
            "SEL", "PRMT", "IABS", "POPC", "FLO", "BREV", "SGXT", "IDP", "BMSK", "IMUL", "ISCADD", "BFE", "BFI"),
    "convert": ("F2F", "F2FP", "F2I", "I2F", "I2FP", "F2IP", "I2I"),
    "mufu": ("MUFU",),
    "move": ("MOV", "S2R", "S2UR", "CS2R", "R2UR", "SHFL", "MOVM"),
    "predicate": ("PLOP3", "P2R", "R2P", "VOTE", "VOTEU"),
    "uniform": ("UIADD3", "UIMAD", "ULOP3", "USHF", "UMOV", "ULEA", "USEL", "UISETP", "UPRMT", "USGXT", "UFLO",
                "UPOPC", "UBMSK", "ULOP", "UBREV", "UPLOP3", "USETMAXREG"),
    "load-global": ("LDG", "LD", "LDGSTS", "LDGDEPBAR"),
    "store-global": ("STG", "ST"),
    "shared": ("LDS", "STS", "LDSM", "STSM"),
    "local": ("LDL", "STL"),
    "constant": ("LDC", "ULDC"),
    "atomic": ("ATOM", "ATOMG", "ATOMS", "RED", "REDG", "REDUX"),
    "tma": ("UTMALDG", "UTMASTG", "UBLKCP", "UTMAPF", "UTMACCTL", "UTMACMDFLUSH", "UTMAREDG"),
    "barrier": ("BAR", "WARPGROUP", "MEMBAR", "DEPBAR", "FENCE", "ERRBAR", "CCTL", "SYNCS", "ARRIVES", "WARPSYNC",
                "BSSY", "BSYNC", "NANOSLEEP", "YIELD"),
    "branch": ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "CALL", "BPT", "KILL"),
}
_CLASS_OF = {opcode: name for name, opcodes in SASS_CLASSES.items() for opcode in opcodes}


def sass_class(opcode: str) -> str:
    """The class of a SASS opcode such as ``HGMMA.64x64x16.F32.BF16`` (``other`` if unknown)."""
    return _CLASS_OF.get(opcode.split(".")[0], "other")


_SASS_LINE_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")
_SASS_LABEL_RE = re.compile(r"^\s*(\.L_x_\d+):")
_SASS_BRANCH_RE = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")


@dataclasses.dataclass(frozen=True)
class SassStats:
    """SASS instruction counts by class for the whole kernel and for its main loop."""

    total: dict[str, int]
    main_loop: dict[str, int]
    loops: int
    opcodes: dict[str, int]


def _sass_instructions(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Opcodes of ``nvdisasm`` output in address order, and its loops as (first, last) instruction
    indices of each backward branch. Branches from the out-of-line blocks after the kernel's last
    unpredicated ``EXIT`` (the mbarrier wait retries of TMA kernels, which jump back into the loop
    they came from) are not loops of the kernel."""
    instructions: list[str] = []  # opcode per instruction, in address order
    labels: dict[str, int] = {}
    back_edges: list[tuple[int, int]] = []
    last_exit = None
    for line in text.splitlines():
        label = _SASS_LABEL_RE.match(line)
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        match = _SASS_LINE_RE.search(line)
        if not match:
            continue
        branch = _SASS_BRANCH_RE.search(line)
        # A branch to a label seen already is a loop, except the branch-to-itself trap after EXIT.
        if branch and branch.group(1) in labels and labels[branch.group(1)] < len(instructions):
            back_edges.append((labels[branch.group(1)], len(instructions)))
        if match.group(3) == "EXIT" and not match.group(2):
            last_exit = len(instructions)
        instructions.append(match.group(3))
    if not instructions:
        raise ValueError("no SASS instructions found")
    if last_exit is not None:
        back_edges = [(start, end) for start, end in back_edges if end < last_exit]
    return instructions, back_edges


def loop_instructions(text: str) -> list[list[str]]:
    """The instructions (opcodes with their modifiers) of every loop of ``nvdisasm`` output, in address
    order."""
    instructions, back_edges = _sass_instructions(text)
    return [instructions[start:end + 1] for start, end in back_edges]


def sass_loops(text: str) -> list[collections.Counter]:
    """Opcode counts (the part before the first '.') of every loop of ``nvdisasm`` output, in
    address order."""
    return [collections.Counter(op.split(".")[0] for op in body) for body in loop_instructions(text)]


def analyze_sass(text: str) -> SassStats:
    """Classify ``nvdisasm`` output. Loops are backward branches; the main loop is the one with the
    most tensor-core instructions (then the longest)."""
    instructions, back_edges = _sass_instructions(text)

    def count(opcodes) -> dict[str, int]:
        return dict(collections.Counter(sass_class(op) for op in opcodes))

    main: list[str] = []
    if back_edges:
        start, end = max(back_edges, key=lambda e: (sum(sass_class(op) == "tensor-core" for op in instructions[e[0]:e[1] + 1]),
                                                    e[1] - e[0]))
        main = instructions[start:end + 1]
    return SassStats(total=count(instructions), main_loop=count(main), loops=len(back_edges),
                     opcodes=dict(collections.Counter(op.split(".")[0] for op in instructions)))


_WGMMA_WAIT_RE = re.compile(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x([0-9a-f]+)")


def wgmma_overlap(text: str) -> list[int]:
    """For every wait that leaves one wgmma group in flight (``WARPGROUP.DEPBAR.LE gsb0, 0x1``), the
    number of ``MUFU.EX2`` before the next full wait (``... 0x0``), in address order: in attention,
    the exponentials of tile j's softmax that run while ``P_{j-1} V_{j-1}`` is still in flight. An empty
    list: the kernel never keeps two wgmma groups in flight. (ptxas decides where a wait goes: the
    order in the PTX does not tell.)"""
    windows, current = [], None
    for line in text.splitlines():
        wait = _WGMMA_WAIT_RE.search(line)
        if wait is not None:
            if int(wait.group(1), 16) == 1:
                current = 0
            elif int(wait.group(1), 16) == 0 and current is not None:
                windows.append(current)
                current = None
        elif current is not None and "MUFU.EX2" in line:
            current += 1
    return windows


def disassemble(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return run_tool([tool_path("nvdisasm"), "-c", path])
