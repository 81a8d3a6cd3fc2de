"""Compare a kernel compiled under two pipelines: registers, spills, SASS mix, loops, IR diffs.

Everything here works without a GPU: Triton compiles for any ``sm_XX`` on the CPU and ships
``ptxas``, ``cuobjdump`` and ``nvdisasm``. ::

    a = compile_report(kernel, signature, constexprs)                        # plain Triton
    b = compile_report(kernel, signature, constexprs, Pipeline(disable_lsr=True))
    print(format_comparison(compare(a, b)))
"""
from __future__ import annotations

import collections
import dataclasses
import difflib
import html
import math
import os
import re
import statistics
import subprocess
import tempfile
import time
from typing import Any, Mapping

from .env import quote
from .hooks import FALLBACK_KEY, FINGERPRINT_KEY, PIPELINE_KEY
from .pipeline import Pipeline
from .scope import use_pipeline
from .targets import compile_for_target, parse_target, ptxas_path

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


def _tool(name: str, capability: int = 90) -> str:
    """Path of the CUDA tool Triton itself uses (``ptxas``, ``cuobjdump``, ``nvdisasm``)."""
    from triton import knobs

    path = ptxas_path(capability) if name == "ptxas" else getattr(knobs.nvidia, name).path
    if not path or not os.path.exists(path):
        raise FileNotFoundError(f"Triton's {name} was not found ({path!r}); reinstall triton")
    return path


def _run(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"{os.path.basename(command[0])} failed: {result.stderr.strip()[:2000]}")
    return result.stdout + result.stderr


# --- resources ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Resources:
    """Per-thread and per-block resources of the compiled kernel."""

    registers: int
    spill_stores: int  # bytes, from ptxas -v
    spill_loads: int
    stack_frame: int
    local_memory: int
    static_shared: int  # bytes declared in the cubin
    dynamic_shared: int  # bytes Triton requests at launch


_RESOURCE_RE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_SPILL_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_resource_usage(text: str) -> dict[str, int]:
    """``cuobjdump --dump-resource-usage`` output -> registers, stack, shared, local."""
    match = _RESOURCE_RE.search(text)
    if not match:
        raise ValueError("no 'REG:.. STACK:.. SHARED:.. LOCAL:..' line in cuobjdump output")
    registers, stack, shared, local = map(int, match.groups())
    return {"registers": registers, "stack": stack, "shared": shared, "local": local}


def parse_ptxas_verbose(text: str) -> dict[str, int]:
    """``ptxas -v`` output -> stack frame and spill bytes (``Used N registers`` too)."""
    spills = _SPILL_RE.search(text)
    registers = re.search(r"Used (\d+) registers", text)
    if not spills or not registers:
        raise ValueError("no spill/register lines in ptxas -v output")
    stack, stores, loads = map(int, spills.groups())
    return {"stack_frame": stack, "spill_stores": stores, "spill_loads": loads, "registers": int(registers.group(1))}


def _gpu_name(capability: int) -> str:
    return f"sm_{capability}{'a' if capability >= 90 else ''}"


def measure_resources(cubin: bytes, ptx: str, capability: int, ptxas_options: tuple[str, ...],
                      dynamic_shared: int) -> Resources:
    """Registers/shared/local from the cubin itself; spills from ``ptxas -v`` rerun with the same
    options (Triton discards its own ptxas log)."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin_path = os.path.join(tmp, "kernel.cubin")
        ptx_path = os.path.join(tmp, "kernel.ptx")
        with open(cubin_path, "wb") as f:
            f.write(cubin)
        with open(ptx_path, "w") as f:
            f.write(ptx)
        usage = parse_resource_usage(_run([_tool("cuobjdump"), "--dump-resource-usage", cubin_path]))
        verbose = parse_ptxas_verbose(_run([_tool("ptxas", capability), "-v", *ptxas_options, f"--gpu-name={_gpu_name(capability)}",
                                            ptx_path, "-o", os.path.join(tmp, "check.cubin")]))
    return Resources(registers=usage["registers"], spill_stores=verbose["spill_stores"],
                     spill_loads=verbose["spill_loads"], stack_frame=verbose["stack_frame"],
                     local_memory=usage["local"], static_shared=usage["shared"], dynamic_shared=dynamic_shared)


# --- SASS -----------------------------------------------------------------------------------------

_SASS_LINE_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")
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
    indices of each backward branch."""
    instructions: list[str] = []  # opcode per instruction, in address order
    labels: dict[str, int] = {}
    back_edges: list[tuple[int, int]] = []
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
        instructions.append(match.group(2))
    if not instructions:
        raise ValueError("no SASS instructions found")
    return instructions, back_edges


def sass_loops(text: str) -> list[collections.Counter]:
    """Opcode counts (the part before the first '.') of every loop of ``nvdisasm`` output, in
    address order."""
    instructions, back_edges = _sass_instructions(text)
    return [collections.Counter(op.split(".")[0] for op in instructions[start:end + 1]) for start, end in back_edges]


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


def disassemble(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return _run([_tool("nvdisasm"), "-c", path])


# --- LLVM IR loops --------------------------------------------------------------------------------

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


# --- the report -----------------------------------------------------------------------------------

@dataclasses.dataclass
class CompileReport:
    """What one compile of one kernel under one Pipeline produced."""

    kernel: str
    target: str
    pipeline: Pipeline
    compile_seconds: float
    resources: Resources
    sass: SassStats
    loops: list[LoopStats]
    passes: list[dict]
    asm: dict[str, str]  # ttir, ttgir, llir, ptx, sass
    runtime_ms: float | None = None
    warmed_up: bool = False  # compile_seconds was measured after one untimed compile of the same kernel

    def to_dict(self, include_asm: bool = False) -> dict:
        out = {
            "kernel": self.kernel, "target": self.target, "pipeline": self.pipeline.to_dict(),
            "fingerprint": self.pipeline.fingerprint(), "compile_seconds": round(self.compile_seconds, 4),
            "compile_warmed_up": self.warmed_up,
            "resources": dataclasses.asdict(self.resources), "sass": dataclasses.asdict(self.sass),
            "llir_loops": [dataclasses.asdict(loop) for loop in self.loops], "passes": self.passes,
            "runtime_ms": self.runtime_ms,
        }
        if include_asm:
            out["asm"] = self.asm
        return out


def describe_pass(report: Mapping[str, Any]) -> str:
    """``elide-uniform-masks on ttir: loops_split=1`` (+ fell back, if so)."""
    counts = ", ".join(f"{k}={v}" for k, v in report.get("counts", {}).items()) or "no change"
    kept = "" if report.get("kept", True) else " (fell back to the unpatched IR)"
    return f"{report['name']} on {report['stage']}: {counts}{kept}"


def _pass_reports(collected) -> list[dict]:
    return [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r) for r in collected]


def compile_report(kernel, signature: Mapping[str, str], constexprs: Mapping[str, Any] | None = None,
                   pipeline: Pipeline | None = None, target: str = "sm_90", warm_up: bool = False,
                   repeat: int = 1, **compile_options) -> CompileReport:
    """Compile ``kernel`` for ``target`` with exactly ``pipeline`` (default: plain Triton) — a real
    compile, never a cache hit — and measure what came out.

    ``warm_up=True`` compiles once untimed first, so that ``compile_seconds`` leaves out what only
    the first compile in a process pays (imports, LLVM and pass set-up); two reports compare
    compile times fairly only when both were warmed up. ``repeat`` compiles that many times and
    keeps the median time (one compile's time varies by tens of percent on a busy machine)."""
    from .passes import collect_reports

    pipeline = pipeline if pipeline is not None else Pipeline()
    capability = parse_target(target).arch
    previous = os.environ.get("TRITON_ALWAYS_COMPILE")
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    try:
        if warm_up:
            with use_pipeline(pipeline), collect_reports():
                compile_for_target(kernel, signature, constexprs, target=target, **compile_options)
        times = []
        for _ in range(max(1, repeat)):
            with use_pipeline(pipeline), collect_reports() as reports:
                start = time.perf_counter()
                compiled = compile_for_target(kernel, signature, constexprs, target=target, **compile_options)
                times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
    finally:
        if previous is None:
            os.environ.pop("TRITON_ALWAYS_COMPILE", None)
        else:
            os.environ["TRITON_ALWAYS_COMPILE"] = previous
    sass = disassemble(compiled.asm["cubin"])
    asm = {stage: compiled.asm[stage] for stage in ("ttir", "ttgir", "llir", "ptx")}
    asm["sass"] = sass
    return CompileReport(
        kernel=compiled.metadata.name, target=target, pipeline=pipeline, compile_seconds=seconds,
        resources=measure_resources(compiled.asm["cubin"], compiled.asm["ptx"], capability, pipeline.ptxas,
                                    compiled.metadata.shared),
        sass=analyze_sass(sass), loops=llir_loops(compiled.asm["llir"]), passes=_pass_reports(reports), asm=asm,
        warmed_up=warm_up)


# --- running on a GPU ------------------------------------------------------------------------------

_INITS = ("randn", "zeros", "nan")


def check_launch(launch: Mapping[str, Any]) -> None:
    """Validate a spec's ``[launch]`` section: ``grid``, ``outputs`` naming tensor arguments, and
    ``[launch.args]`` where a table ``{shape, dtype, init}`` is a tensor (``init``: randn (default),
    zeros, or nan to poison an output) and anything else a scalar."""
    import torch

    def sizes(value, most: int) -> bool:
        return isinstance(value, list) and len(value) <= most and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value)

    if not isinstance(launch.get("grid"), list) or not isinstance(launch.get("args"), Mapping):
        raise ValueError("[launch] needs grid = [...] and a [launch.args] table")
    if not (launch["grid"] and sizes(launch["grid"], 3) and all(launch["grid"])):
        raise ValueError(f"[launch] grid must be 1 to 3 positive integers, got {quote(launch['grid'])}")
    for name, value in launch["args"].items():
        if isinstance(value, Mapping) and not (
                value.get("init", "randn") in _INITS and sizes(value.get("shape"), 8)
                and isinstance(getattr(torch, str(value.get("dtype", "")), None), torch.dtype)):
            raise ValueError(f"launch argument {name!r}: expected {{shape = [...], dtype = \"float16\"|..., "
                             f"init = {'|'.join(_INITS)}}}, got {quote(dict(value))}")
    for name in launch.get("outputs", ()):
        if not isinstance(launch["args"].get(name), Mapping):
            raise ValueError(f"launch output {name!r} is not a tensor argument of [launch.args]")


def launch_inputs(launch: Mapping[str, Any], seed: int = 0) -> dict[str, Any]:
    """The kernel arguments of a checked ``[launch]`` section, on the GPU; the same seed gives the
    same inputs."""
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)
    args: dict[str, Any] = {}
    for name, value in launch["args"].items():
        if not isinstance(value, Mapping):
            args[name] = value
            continue
        init, dtype, shape = value.get("init", "randn"), getattr(torch, value["dtype"]), value["shape"]
        if init == "randn":
            args[name] = torch.randn(shape, generator=generator, device="cuda").to(dtype)
        else:
            args[name] = torch.full(shape, 0 if init == "zeros" else float("nan"), device="cuda", dtype=dtype)
    return args


def run_on_gpu(kernel, launch: Mapping[str, Any], constexprs: Mapping[str, Any], options: Mapping[str, Any],
               pipeline: Pipeline) -> tuple[float, dict]:
    """Launch ``kernel`` under exactly ``pipeline`` on fresh inputs: the ``do_bench`` median (ms,
    warm-up excluded) and copies of the spec's ``outputs`` after one run."""
    import torch
    import triton

    args = launch_inputs(launch)
    grid = tuple(int(n) for n in launch["grid"])

    def run():
        kernel[grid](**args, **constexprs, **options)

    with use_pipeline(pipeline):
        run()
        torch.cuda.synchronize()
        outputs = {name: args[name].clone() for name in launch.get("outputs", ())}
        milliseconds = triton.testing.do_bench(run, return_mode="median")
    return milliseconds, outputs


def bitwise_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Same bytes in every output tensor (NaN payloads included)."""
    import torch

    return a.keys() == b.keys() and all(
        a[n].shape == b[n].shape and torch.equal(a[n].contiguous().view(torch.uint8), b[n].contiguous().view(torch.uint8))
        for n in a)


# --- comparing two reports ------------------------------------------------------------------------

DIFF_STAGES = ("ttgir", "ptx")


@dataclasses.dataclass
class Comparison:
    a: CompileReport
    b: CompileReport
    rows: list[tuple[str, Any, Any]]  # (metric, a, b)
    diffs: dict[str, str]  # stage -> the whole unified diff ("" when identical)
    outputs_equal: bool | None = None  # bitwise, when both ran on a GPU

    def to_dict(self) -> dict:
        return {"a": self.a.to_dict(), "b": self.b.to_dict(),
                "rows": [{"metric": m, "a": x, "b": y, "change": change_text(m, x, y)} for m, x, y in self.rows],
                "diffs": self.diffs, "outputs_bitwise_equal": self.outputs_equal}


def _unified_diff(a: str, b: str, name: str) -> str:
    return "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), f"a/{name}", f"b/{name}", n=2, lineterm=""))


def diff_counts(diff: str) -> tuple[int, int, int]:
    """Lines of a unified diff: (all of them, added, removed); the ``---``/``+++`` header lines are
    counted in the first number only."""
    lines = diff.splitlines()
    added = sum(line.startswith("+") and not line.startswith("+++ ") for line in lines)
    removed = sum(line.startswith("-") and not line.startswith("--- ") for line in lines)
    return len(lines), added, removed


def sass_classes(*reports: CompileReport) -> set[str]:
    """The SASS classes that occur in any of the reports (whole kernel or main loop)."""
    return {cls for r in reports for counts in (r.sass.total, r.sass.main_loop) for cls, n in counts.items() if n}


def metrics(report: CompileReport, classes: set[str] | None = None) -> dict[str, Any]:
    """The report's numbers by metric name, in display order; SASS rows for ``classes`` (default:
    the classes that occur in this report)."""
    classes = sass_classes(report) if classes is None else classes
    out: dict[str, Any] = {"compile time (s)": round(report.compile_seconds, 3)}
    for field in dataclasses.fields(Resources):
        out[field.name.replace("_", " ")] = getattr(report.resources, field.name)
    for scope, counts in (("SASS", report.sass.total), ("SASS main loop", report.sass.main_loop)):
        out[f"{scope} instructions"] = sum(counts.values())
        out.update({f"{scope} {cls}": counts.get(cls, 0) for cls in [*SASS_CLASSES, "other"] if cls in classes})
    out["LLIR loops"] = len(report.loops)
    out["LLIR main loop instructions"] = report.loops[0].instructions if report.loops else 0
    if report.runtime_ms is not None:
        out["runtime (ms)"] = report.runtime_ms
    return out


# Metrics where a smaller number is better: registers, spills, instruction counts, times. The rest
# (shared memory, loop counts) have no direction: more loops can be the point of a pass.
_LOWER_IS_BETTER = ("registers", "spill stores", "spill loads", "stack frame", "local memory",
                    "compile time (s)", "runtime (ms)")


def lower_is_better(metric: str) -> bool:
    """Whether a drop in ``metric`` is an improvement (registers, spills, instructions, times)."""
    return metric in _LOWER_IS_BETTER or metric.startswith("SASS ") or metric.endswith(" instructions")


def _number(value) -> str:
    """An integer as an integer; a float with 4 significant digits in positional notation (never
    ``1.2e+04``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    if isinstance(value, int) or not math.isfinite(value) or value == 0:
        return str(value)
    decimals = max(0, 3 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if decimals else text


def _numeric(*values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def change_direction(metric: str, a, b, lower_better: bool | None = None) -> str:
    """``better``, ``worse`` or ``same`` for a metric with a direction (``lower_better``, default:
    :func:`lower_is_better`); ``""`` for one without, or values that are not numbers."""
    if not _numeric(a, b):
        return ""
    if a == b:
        return "same"
    if not (lower_is_better(metric) if lower_better is None else lower_better):
        return ""
    return "better" if b < a else "worse"


def change_text(metric: str, a, b, lower_better: bool | None = None) -> str:
    """B against A: ``+90 (+70.3%) worse``, ``-0.048 (-19.2%) better``, ``same``, ``+2 (+200.0%)``
    for a metric without a direction; ``""`` when either value is not a number."""
    direction = change_direction(metric, a, b, lower_better)
    if not _numeric(a, b):
        return ""
    if a == b:
        return "same"
    delta = b - a
    text = ("+" if delta > 0 else "-") + _number(abs(delta))
    if a:
        text += f" ({delta / a:+.1%})"
    return f"{text} {direction}".rstrip()


def compare(a: CompileReport, b: CompileReport, outputs_equal: bool | None = None) -> Comparison:
    """Side-by-side metrics and whole IR diffs (TTGIR, PTX) of two reports of the same kernel
    (``outputs_equal``: whether both variants' GPU outputs were bitwise equal, if they ran)."""
    classes = sass_classes(a, b)
    metrics_a, metrics_b = metrics(a, classes), metrics(b, classes)
    rows = [(m, metrics_a.get(m), metrics_b.get(m)) for m in metrics_a | metrics_b]
    diffs = {stage: _unified_diff(a.asm[stage], b.asm[stage], f"{a.kernel}.{stage}") for stage in DIFF_STAGES}
    return Comparison(a=a, b=b, rows=rows, diffs=diffs, outputs_equal=outputs_equal)


def describe_pipeline(pipeline: Pipeline) -> str:
    return "plain Triton" if pipeline.is_empty else repr(pipeline)


def _compile_time_note(a: CompileReport, b: CompileReport) -> str:
    if a.warmed_up and b.warmed_up:
        return "compile time: each pipeline compiled once untimed, then the median of timed compiles (no cache hits)"
    return ("compile time: not warmed up, so the first compile in the process also pays for start-up "
            "(compile_report(..., warm_up=True) times both warm)")


def _diff_summary(stage: str, diff: str, html_path: str | None) -> str:
    if not diff:
        return f"{stage}: identical"
    lines, added, removed = diff_counts(diff)
    where = f"the full diff is in {html_path}" if html_path else "--html FILE writes the full diff"
    return f"{stage}: {lines} diff lines (+{added} -{removed}); {where}"


def format_comparison(comparison: Comparison, html_path: str | None = None) -> str:
    """A terminal table: metric, A, B and the change (better/worse where the metric has a direction);
    then the passes, the IR diffs' sizes (``html_path``: where the full diffs were written)."""
    a, b = comparison.a, comparison.b
    lines = [f"kernel {a.kernel} for {a.target}",
             f"  A: {describe_pipeline(a.pipeline)}", f"  B: {describe_pipeline(b.pipeline)}", ""]
    width = max(len(m) for m, _, _ in comparison.rows)
    lines.append(f"{'metric'.ljust(width)}  {'A':>8}  {'B':>8}  change (B vs A)")
    for metric, x, y in comparison.rows:
        lines.append(f"{metric.ljust(width)}  {_number(x):>8}  {_number(y):>8}  {change_text(metric, x, y)}".rstrip())
    lines.append("")
    lines.append(_compile_time_note(a, b))
    for report, label in ((a, "A"), (b, "B")):
        lines.extend(f"pass ({label}) {describe_pass(p)}" for p in report.passes)
    lines.extend(_diff_summary(stage, diff, html_path) for stage, diff in comparison.diffs.items())
    if comparison.outputs_equal is not None:
        lines.append(f"GPU outputs bitwise equal: {'yes' if comparison.outputs_equal else 'NO'}")
    return "\n".join(lines)


# --- the HTML report ------------------------------------------------------------------------------

_HTML_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.6em}
table{border-collapse:collapse} td,th{padding:3px 12px;text-align:left}
table.metrics td.num,table.metrics th.num{text-align:right;font-variant-numeric:tabular-nums}
table.metrics tr:nth-child(even){background:#f7f7f7}
table.metrics tr.changed{background:#fff4d6} table.metrics tr.changed td:first-child{font-weight:600}
td.better{color:#1a7f37} td.worse{color:#b42318}
table.meta th{color:#555;font-weight:normal;padding-left:0}
.tag{display:inline-block;color:#fff;padding:0 .5em;border-radius:3px;font-weight:600}
.tag.a,.bar.a{background:#4477aa} .tag.b,.bar.b{background:#ee6677}
.charts{display:flex;flex-wrap:wrap;gap:3em} h3{font-size:1em;margin:.4em 0}
table.chart td{padding:1px 8px;vertical-align:middle} table.chart td.cls{text-align:right;white-space:nowrap}
.barline{display:flex;align-items:center;gap:6px;height:15px;font-size:12px;white-space:nowrap}
.bar{height:11px;min-width:1px}
pre.diff{background:#f6f8fa;padding:1em;overflow:auto;max-height:40em;font-size:12px;line-height:1.35}
pre.diff span{display:block} .add{background:#e6ffec;color:#116329} .del{background:#ffebe9;color:#82071e}
.hunk{color:#0550ae;background:#eef4ff} .file{font-weight:600;color:#555}
"""


def report_environment() -> dict[str, str]:
    """The versions an HTML report is headed with: tritonpatch, Triton, torch."""
    import triton

    from . import __version__

    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    return {"tritonpatch": __version__, "triton": triton.__version__, "torch": torch_version}


def _diff_html(diff: str) -> str:
    """A unified diff as one span per line, classed add / del / hunk / file for colour."""
    out = []
    for line in diff.splitlines():
        if line.startswith(("--- ", "+++ ")):
            cls = "file"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = "ctx"
        out.append(f"<span class={cls}>{html.escape(line) or ' '}</span>")
    return "".join(out)


def _chart_html(title: str, counts_a: Mapping[str, int], counts_b: Mapping[str, int]) -> str:
    """Horizontal bars, one pair (A, B) per SASS class, each count written after its bar."""
    classes = [c for c in [*SASS_CLASSES, "other"] if counts_a.get(c) or counts_b.get(c)]
    peak = max([counts_a.get(c, 0) for c in classes] + [counts_b.get(c, 0) for c in classes] + [1])
    rows = []
    for cls in classes:
        bars = "".join(
            f"<div class=barline><div class='bar {side}' style='width:{300 * counts.get(cls, 0) / peak:.0f}px'></div>"
            f"{counts.get(cls, 0)}</div>" for side, counts in (("a", counts_a), ("b", counts_b)))
        rows.append(f"<tr><td class=cls>{html.escape(cls)}</td><td>{bars}</td></tr>")
    return (f"<div class=chart><h3>{html.escape(title)}</h3>"
            f"<table class=chart>{''.join(rows)}</table></div>")


def comparison_html(comparison: Comparison, command: str | None = None, generated: str | None = None,
                    environment: Mapping[str, str] | None = None) -> str:
    """A standalone HTML report: a header (versions, ``command``, date), the metrics with a change
    column and the changed rows highlighted, bar charts of the SASS classes of the main loop and of
    the whole kernel, and the whole IR diffs coloured (+ green, - red)."""
    import datetime

    a, b = comparison.a, comparison.b
    environment = report_environment() if environment is None else environment
    generated = generated or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    meta = [*((f"{name} version", version) for name, version in environment.items()),
            ("command", command or "(Python API)"), ("date", generated)]
    meta_rows = "".join(f"<tr><th>{html.escape(k)}</th><td><code>{html.escape(v)}</code></td></tr>" for k, v in meta)
    rows = []
    for metric, x, y in comparison.rows:
        change, direction = change_text(metric, x, y), change_direction(metric, x, y)
        changed = " class=changed" if x != y else ""
        rows.append(f"<tr{changed}><td>{html.escape(metric)}</td><td class=num>{html.escape(_number(x))}</td>"
                    f"<td class=num>{html.escape(_number(y))}</td>"
                    f"<td class='num {direction}'>{html.escape(change)}</td></tr>")
    notes = [_compile_time_note(a, b), *(f"pass ({label}) {describe_pass(p)}" for report, label in ((a, "A"), (b, "B"))
                                        for p in report.passes)]
    if comparison.outputs_equal is not None:
        notes.append(f"GPU outputs bitwise equal: {'yes' if comparison.outputs_equal else 'NO'}")
    diffs = []
    for stage, diff in comparison.diffs.items():
        if not diff:
            diffs.append(f"<h2>{stage} diff</h2><p>identical</p>")
            continue
        lines, added, removed = diff_counts(diff)
        diffs.append(f"<h2>{stage} diff</h2><p>{lines} lines: <span class=add>+{added}</span> "
                     f"<span class=del>-{removed}</span> (the whole diff)</p><pre class=diff>{_diff_html(diff)}</pre>")
    title = f"{a.kernel} for {a.target}"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>tritonpatch compare {html.escape(title)}</title>
<style>{_HTML_STYLE}</style></head><body>
<h1>tritonpatch compare: {html.escape(title)}</h1>
<p><span class='tag a'>A</span> {html.escape(describe_pipeline(a.pipeline))}<br>
<span class='tag b'>B</span> {html.escape(describe_pipeline(b.pipeline))}</p>
<table class=meta>{meta_rows}</table>
<h2>Metrics</h2>
<table class=metrics><tr><th>metric</th><th class=num>A</th><th class=num>B</th><th class=num>change (B vs A)</th></tr>
{''.join(rows)}</table>
<ul>{''.join(f'<li>{html.escape(n)}</li>' for n in notes)}</ul>
<h2>SASS instructions by class</h2>
<p><span class='tag a'>A</span> upper bar, <span class='tag b'>B</span> lower bar; the main loop is the loop with
the most tensor-core instructions (then the longest)</p>
<div class=charts>{_chart_html("main loop", a.sass.main_loop, b.sass.main_loop)}
{_chart_html("whole kernel", a.sass.total, b.sass.total)}</div>
{''.join(diffs)}</body></html>"""


# --- kernels already in a Triton cache ------------------------------------------------------------



def _option_text(name: str, value) -> str:
    """``name`` for a true flag, else ``name=value`` (booleans as true/false, as the CLI reads them)."""
    if value is True:
        return name
    return f"{name}={str(value).lower() if isinstance(value, bool) else value}"


def describe_recorded_pipeline(metadata: Mapping[str, Any]) -> str:
    """The Pipeline a cache entry was built with, from its metadata, in the CLI's ``--a``/``--b``
    form (``disable-lsr``, ``llvm:unroll-threshold=0``, ``passes:skip-masked-blocks``, ...);
    ``plain Triton`` when the metadata records none; `` (passes fell back)`` appended when they did."""
    record = metadata.get(PIPELINE_KEY)
    if isinstance(record, str):
        text = record
    elif isinstance(record, Mapping) and any(record.get(k) for k in ("llvm", "passes", "ptxas")):
        items = []
        llvm = [(name, value) for name, value in record.get("llvm", ())]
        items.extend("disable-lsr" for name, value in llvm if name == "disable-lsr" and value is True)
        other = [_option_text(name, value) for name, value in llvm if not (name == "disable-lsr" and value is True)]
        if other:
            items.append("llvm:" + ",".join(other))
        passes = []
        for name, options in record.get("passes", ()):
            settings = ",".join(_option_text(k, v) for k, v in options)
            passes.append(f"{name}({settings})" if settings else name)
        if passes:
            items.append("passes:" + ",".join(passes))
        if record.get("ptxas"):
            items.append("ptxas:" + " ".join(record["ptxas"]))
        text = ";".join(items)
    else:
        text = "plain Triton"
    return text + (" (passes fell back)" if metadata.get(FALLBACK_KEY) else "")

def _cache_entry_report(root: str, name: str) -> dict:
    """Resources and SASS mix of one cubin of a Triton cache, with the Pipeline and launch settings
    its metadata file records."""
    import json

    with open(os.path.join(root, name), "rb") as f:
        cubin = f.read()
    meta_path = os.path.join(root, name[:-len(".cubin")] + ".json")
    meta = {}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(cubin)
        usage = parse_resource_usage(_run([_tool("cuobjdump"), "--dump-resource-usage", path]))
    sass = analyze_sass(disassemble(cubin))
    return {"pipeline": describe_recorded_pipeline(meta), "fingerprint": meta.get(FINGERPRINT_KEY),
            "num_warps": meta.get("num_warps"), "num_stages": meta.get("num_stages"),
            "dynamic_shared": meta.get("shared"), **usage, "sass_total": sass.total, "sass_main_loop": sass.main_loop}


def cache_dir_reports(cache_dir: str) -> list[dict]:
    """Resources and SASS mix of every cubin in a Triton cache directory (no recompile). An entry that
    cannot be read (a truncated file, a GPU the shipped tools do not decode) is listed with ``error``
    saying why instead of its numbers, so that one bad entry does not hide the others."""
    out = []
    for root, _dirs, files in os.walk(cache_dir):
        for name in sorted(f for f in files if f.endswith(".cubin")):
            entry = {"kernel": name[:-len(".cubin")], "directory": os.path.relpath(root, cache_dir)}
            try:
                entry.update(_cache_entry_report(root, name))
            except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as exc:
                entry["error"] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            out.append(entry)
    return out
