"""Registers, shared and local memory of a cubin (cuobjdump), spills and warnings (ptxas -v)."""
from __future__ import annotations

import dataclasses
import os
import re
import tempfile

from .tools import run_tool, tool_path


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
    warnings: tuple[str, ...] = ()  # ptxas -v warnings, e.g. C7510-C7517: wgmma serialized (async overlap lost)


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


def ptxas_warnings(text: str) -> tuple[str, ...]:
    """The warning lines of ``ptxas -v`` output (``ptxas ... warning : ...``), without the file path."""
    return tuple(line.split("warning", 1)[1].lstrip(" :") for line in text.splitlines() if " warning " in line)


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
        usage = parse_resource_usage(run_tool([tool_path("cuobjdump"), "--dump-resource-usage", cubin_path]))
        log = run_tool([tool_path("ptxas", capability), "-v", *ptxas_options, f"--gpu-name={_gpu_name(capability)}",
                        ptx_path, "-o", os.path.join(tmp, "check.cubin")])
    verbose = parse_ptxas_verbose(log)
    return Resources(registers=usage["registers"], spill_stores=verbose["spill_stores"],
                     spill_loads=verbose["spill_loads"], stack_frame=verbose["stack_frame"],
                     local_memory=usage["local"], static_shared=usage["shared"], dynamic_shared=dynamic_shared,
                     warnings=ptxas_warnings(log))
