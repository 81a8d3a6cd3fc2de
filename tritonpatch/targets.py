"""Compile a Triton kernel for a named GPU target without a GPU (Triton ships ptxas).

The target, the kernel's arguments and the compile options are checked before Triton sees them,
so that a mistake is one error naming the problem, not a traceback from deep inside the compiler
(or, for an unknown option, nothing at all: Triton ignores options it does not know).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from ._ptxas import gpu_capabilities, ptxas_path
from .env import did_you_mean, quote

_TARGET_RE = re.compile(r"^sm_?(\d+)a?$")
_WARPS = (1, 2, 4, 8, 16, 32)  # a CUDA block holds at most 1024 threads
_CTAS = (1, 2, 4, 8, 16)  # the largest cluster Hopper and Blackwell launch
_TARGET_OPTIONS = ("arch", "backend_name")  # they belong to the target, not to the kernel


# Shared memory one block may use (opt-in maximum), by compute capability: CUDA C++ Programming
# Guide, "Technical Specifications per Compute Capability".
_SHARED_MEMORY_PER_BLOCK = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448,
                            101: 232448, 103: 232448, 110: 232448, 120: 101376, 121: 101376}


def shared_memory_per_block(capability) -> int | None:
    """The bytes of shared memory a block may use on GPUs of ``capability`` (e.g. 90), None where
    the table does not know the capability."""
    return _SHARED_MEMORY_PER_BLOCK.get(capability) if isinstance(capability, int) else None


def supported_capabilities() -> tuple[int, ...]:
    """Every capability ``NN`` that ``sm_NN`` compiles for: those the ptxas Triton uses for ``NN``
    lists for ``--gpu-name``. Triton ships more than one ptxas (an older one for older GPUs), so
    this starts from the one for sm_90 and follows each capability it lists to the ptxas Triton
    uses for that, until every ptxas reached has been asked."""
    supported, asked, pending = set(), set(), [ptxas_path(90)]
    while pending:
        path = pending.pop()
        if path in asked:
            continue
        asked.add(path)
        for capability in gpu_capabilities(path):
            owner = ptxas_path(capability)
            if owner == path:
                supported.add(capability)
            else:
                pending.append(owner)
    return tuple(sorted(supported))


def parse_target(target: str, where: str = "target"):
    """``"sm_90"`` (or ``"sm90"``, ``"sm_90a"``) -> ``GPUTarget("cuda", 90, 32)``. The capability must
    be one the ptxas Triton uses for it compiles for; ``where`` names the target in the error, which
    lists every capability any of Triton's ptxas binaries compiles for (:func:`supported_capabilities`)."""
    from triton.backends.compiler import GPUTarget

    match = _TARGET_RE.match(target.strip().lower()) if isinstance(target, str) else None
    if not match:
        raise ValueError(f"{where} {quote(target)}: expected sm_NN, a CUDA compute capability such as sm_90 or sm_80")
    capability = int(match.group(1))
    own = gpu_capabilities(ptxas_path(capability))
    if own and capability not in own:
        supported = supported_capabilities() or own   # own: when the ptxas for sm_90 cannot be asked
        raise ValueError(f"{where} {quote(target)}: expected sm_NN with NN >= {supported[0]} that Triton's ptxas "
                         f"compiles for: {', '.join(str(n) for n in supported)}")
    return GPUTarget("cuda", capability, 32)


def _kernel_signature(fn) -> str:
    return f"{fn.__name__}({', '.join(fn.arg_names)})"


def check_argument_names(fn, mapping: Mapping[str, Any], where: str) -> None:
    """Raise ValueError, with the closest argument name as a hint, for a key of ``mapping`` that is
    not an argument of the @triton.jit function ``fn``; ``where`` names the mapping."""
    for name in mapping:
        if name not in fn.arg_names:
            hint = did_you_mean(name, fn.arg_names)
            raise ValueError(f"{quote(name)} in {where} is not an argument of {_kernel_signature(fn)}{hint}")


def check_kernel_arguments(fn, signature: Mapping[str, Any], constexprs: Mapping[str, Any],
                           where: tuple[str, str] = ("signature", "constexprs")) -> None:
    """Raise ValueError unless ``fn`` is a ``@triton.jit`` function and ``signature`` (argument ->
    Triton type such as ``"*fp16"``) and ``constexprs`` (argument -> value) cover exactly its
    arguments, with tl.constexpr parameters among the constexprs. ``where`` names the two mappings."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    if not isinstance(fn, JITFunction):
        wrapped = getattr(fn, "fn", None)
        if type(fn).__name__ == "InterpretedFunction":   # @triton.jit or @tritonpatch.jit under TRITON_INTERPRET=1
            hint = (" (TRITON_INTERPRET=1 is set: Triton then runs kernels in its interpreter and compiles "
                    "nothing; unset it to compile for a GPU target)")
        elif wrapped is not None:
            hint = (" (a triton.autotune/heuristics wrapper: name the @triton.jit function inside and give "
                    "one config's values)")
        else:
            hint = ""
        name = getattr(fn, "__name__", None) or quote(fn)
        kind = type(fn).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        raise ValueError(f"{name!s} is {article} {kind}, not a @triton.jit function{hint}")
    sig_where, const_where = where
    for mapping, name in ((signature, sig_where), (constexprs, const_where)):
        if not isinstance(mapping, Mapping):
            raise ValueError(f"{name} must map argument names to values, got {quote(mapping)}")
        check_argument_names(fn, mapping, name)
    for param in fn.params:
        name = param.name
        if name not in signature and name not in constexprs:
            default = f" (its default {quote(param.default)} applies only at a launch)" if param.has_default else ""
            raise ValueError(f"argument {name!r} of {_kernel_signature(fn)} is in neither {sig_where} (a type) "
                             f"nor {const_where} (a value){default}")
        ty = signature.get(name, "constexpr")
        if param.is_constexpr and name not in constexprs and ty != "constexpr":
            raise ValueError(f"{name!r} is a tl.constexpr parameter of {fn.__name__}: give its value in "
                             f"{const_where}, not a type in {sig_where}")
        if ty != "constexpr":
            try:
                tl.str_to_ty(ty, None)
            except Exception:
                raise ValueError(f"{name!r} in {sig_where} has type {quote(ty)}, which Triton does not know; "
                                 "e.g. '*fp16', '*bf16', '*i32', 'i32', 'i64', 'fp32'") from None


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_compile_options(options: Mapping[str, Any], capability: int, where: str = "the compile options") -> None:
    """Raise ValueError for an option Triton's CUDA backend does not know (Triton itself ignores
    those), one that belongs to the target, a value of the wrong type, or a num_warps / num_ctas /
    num_stages / maxnreg out of range. ``where`` names the options in the error."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    backend = make_backend(GPUTarget("cuda", capability, 32))
    defaults = backend.parse_options({})
    known = [field.name for field in dataclasses.fields(defaults) if field.name not in _TARGET_OPTIONS]
    for key, value in options.items():
        if key in _TARGET_OPTIONS:
            raise ValueError(f"{key!r} in {where} is set by the target; choose the target instead")
        if key not in known:
            hint = did_you_mean(key, known)
            raise ValueError(f"unknown key {quote(key)} in {where}{hint}; known keys: {', '.join(known)}")
        default = getattr(defaults, key)
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValueError(f"{key} in {where} must be true or false, got {quote(value)}")
        if _integer(default) and not _integer(value):
            raise ValueError(f"{key} in {where} must be an integer, got {quote(value)}")
    checks = (("num_warps", lambda n: n in _WARPS, "a power of two (" + ", ".join(map(str, _WARPS)) + ")"),
              ("num_ctas", lambda n: n in _CTAS and (n == 1 or capability >= 90),
               "a power of two (" + ", ".join(map(str, _CTAS)) + "), above 1 only for sm_90 and later"),
              ("num_stages", lambda n: n >= 1, "a positive integer (1: no software pipelining)"),
              ("maxnreg", lambda n: n >= 1, "a positive integer (registers per thread)"))
    for key, valid, expected in checks:
        value = options.get(key)
        if value is not None and not (_integer(value) and valid(value)):
            raise ValueError(f"{key} in {where} must be {expected}, got {quote(value)}")
    try:
        backend.parse_options(dict(options))
    except (AssertionError, ValueError, TypeError) as exc:  # Triton's own checks of the values
        raise ValueError(f"{where}: Triton refuses {quote(dict(options))}: {exc}") from None


def aligned_pointer_attrs(fn, signature: Mapping[str, str]) -> dict:
    """Triton's per-argument attributes marking every pointer argument of ``signature`` 16-byte
    aligned (``tt.divisibility = 16``), as a launch with torch tensors specializes them. Without
    them a compile for a target assumes nothing about alignment and vectorizes no load or store,
    so its code (and its shared memory and registers) is not what the GPU runs. (A launch also
    marks integer arguments that are multiples of 16; pass those as constexprs or attrs of your
    own where they matter.)"""
    names = list(fn.arg_names)
    return {(names.index(name),): [["tt.divisibility", 16]] for name, kind in signature.items()
            if str(kind).startswith("*")}


def compile_for_target(fn, signature: Mapping[str, str], constexprs: Mapping[str, Any] | None = None,
                       target: str = "sm_90", *, aligned_pointers: bool = False, **options):
    """Run Triton's whole pipeline (ttir -> ... -> cubin; Gluon kernels from ttgir) for ``target``
    and return the ``CompiledKernel`` (``.asm`` holds every stage). ``signature`` maps argument names to Triton
    types (``"*fp16"``, ``"i32"``, ``"constexpr"``); ``aligned_pointers`` compiles as a launch with
    16-byte aligned tensors would (:func:`aligned_pointer_attrs`); ``options`` are Triton compile
    options (``num_warps``, ``num_stages``, ...). Target, arguments and options are checked first. A
    ``tritonpatch.jit(pipeline=...)`` kernel compiles under its Pipeline, as its launches do."""
    import contextlib

    import triton

    from ._triton_compat import ast_source

    gpu_target = parse_target(target)
    constexprs = dict(constexprs or {})
    check_kernel_arguments(fn, signature, constexprs)
    check_compile_options(options, gpu_target.arch)
    sig = dict(signature)
    for name in constexprs:
        sig.setdefault(name, "constexpr")
    attrs = aligned_pointer_attrs(fn, sig) if aligned_pointers else None
    pipeline_scope = getattr(fn, "pipeline_scope", contextlib.nullcontext)   # a tritonpatch.jit kernel's block
    with pipeline_scope():
        return triton.compile(ast_source(fn, sig, constexprs, attrs), target=gpu_target, options=dict(options))


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
