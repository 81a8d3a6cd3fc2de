"""Compile a Triton kernel for a named GPU target without a GPU (Triton ships ptxas)."""
from __future__ import annotations

import re
from typing import Any, Mapping

_TARGET_RE = re.compile(r"^sm_?(\d+)([a-z]?)$")


def parse_target(target: str):
    """``"sm_90"`` (or ``"sm90"``, ``"sm_90a"``) -> ``GPUTarget("cuda", 90, 32)``."""
    from triton.backends.compiler import GPUTarget

    match = _TARGET_RE.match(target.strip().lower()) if isinstance(target, str) else None
    if not match:
        raise ValueError(f"unknown target {target!r}; use a CUDA compute capability such as 'sm_90' or 'sm_80'")
    return GPUTarget("cuda", int(match.group(1)), 32)


def compile_for_target(fn, signature: Mapping[str, str], constexprs: Mapping[str, Any] | None = None,
                       target: str = "sm_90", **options):
    """Run Triton's whole pipeline (ttir -> ... -> cubin) for ``target`` and return the
    ``CompiledKernel`` (``.asm`` holds every stage). ``signature`` maps argument names to Triton
    types (``"*fp16"``, ``"i32"``, ``"constexpr"``); ``options`` are Triton compile options
    (``num_warps``, ``num_stages``, ...)."""
    import triton
    from triton.compiler import ASTSource

    constexprs = dict(constexprs or {})
    sig = dict(signature)
    for name in constexprs:
        sig.setdefault(name, "constexpr")
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=parse_target(target), options=dict(options))


class CompileOnlyDriver:
    """Enough of a Triton driver for ``JITFunction.warmup`` to compile for ``target`` without a GPU
    (install it with ``triton.runtime.driver.set_active(CompileOnlyDriver())``)."""

    def __init__(self, target: str = "sm_90"):
        self.target = parse_target(target)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0
