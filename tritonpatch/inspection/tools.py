"""The CUDA tools Triton ships (ptxas, cuobjdump, nvdisasm): where they are, and running one."""
from __future__ import annotations

import os
import subprocess

from .._ptxas import ptxas_path


def tool_path(name: str, capability: int = 90) -> str:
    """Path of the CUDA tool Triton itself uses (``ptxas``, ``cuobjdump``, ``nvdisasm``)."""
    from triton import knobs

    path = ptxas_path(capability) if name == "ptxas" else getattr(knobs.nvidia, name).path
    if not path or not os.path.exists(path):
        raise FileNotFoundError(f"Triton's {name} was not found ({path!r}); reinstall triton")
    return path


def run_tool(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"{os.path.basename(command[0])} failed: {result.stderr.strip()[:2000]}")
    return result.stdout + result.stderr
