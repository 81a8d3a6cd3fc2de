"""Every difference between the supported Triton versions (3.6.0 to 3.9.x) that tritonpatch's
hooks depend on, in one place.

- Stages hook (``knobs.runtime.add_stages_inspection_hook``): 3.6 calls it only as
  ``hook(backend, stages, options, language, capability)`` at the end of ``add_stages`` and
  puts its effect in no cache key. 3.7+ also call it with no arguments, in ``compile()`` and on
  every ``JITFunction.run``, and fold the returned ``(key, hash)`` into the disk key and the
  in-memory JIT key. 3.4/3.5 have no hook at all (unsupported).
- Cache keys on 3.6: ``get_cache_key`` (``triton.runtime.cache``) is bound by name into
  ``triton.compiler.compiler`` and ``triton.runtime.jit``; the in-memory key is
  ``triton.runtime.jit.compute_cache_key``. tritonpatch rebinds all of them (3.6 only).
- Async compile (``AsyncCompileMode``, 3.6+): the compile runs in an executor thread that does
  not inherit the caller's context, and futures are deduplicated by a disk key that on 3.7+ lacks
  the hook's key. ``submit`` is wrapped to run the compile in a copy of the caller's context and
  to add the Pipeline tag to the deduplication key (3.9 added a ``cleanup_fn`` argument: passed on).
- ptxas options: every version builds the ptxas command from ``options.ptx_options`` inside
  ``CUDABackend.make_cubin(src, metadata, options, arch)``; the cubin stage is rebuilt with a copy
  of the (frozen) options whose ``ptx_options`` has the extra flags appended.
- LLVM flags: 3.6-3.8 set Triton's own flags and the ``DISABLE_LLVM_OPT`` list with
  ``*opt = true`` and never reset them; 3.9 wraps its LLVM runs in ``ScopedLLVMOptions``.
  tritonpatch never uses Triton's scope (holding it across a compile would block every other
  compile asking for a different set); it snapshots the ``DISABLE_LLVM_OPT`` names itself on
  every version, which is a no-op where Triton already restores them.
- 3.9's nanobind ``llvm.translate_to_asm`` (``sched4reg=``): tritonpatch wraps the stage callables
  and never calls it, so the binding change needs no adapter.
- Gluon kernels (``@gluon.jit``) compile from ``triton.experimental.gluon._runtime.GluonASTSource``
  (3.6-3.9); :func:`ast_source` picks it for them.
- Element type names (3.6-3.9): ``triton._utils.type_canonicalisation_dict`` maps torch dtype names and
  signature spellings to the names a launch specializes a pointer with (:func:`element_type`).
- Remote cache (3.6-3.9): Triton's ``RedisRemoteCacheBackend`` reads its settings from
  ``knobs.cache.redis``, but the Redis knobs (``TRITON_REDIS_HOST``, ``TRITON_REDIS_PORT``,
  ``TRITON_REDIS_KEY_FORMAT``) are ``knobs.redis``: every compile under that backend raises
  AttributeError. :func:`link_redis_knobs` gives ``knobs.cache`` the attribute.
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import os
import re
from typing import Callable

import triton
import triton.compiler.compiler as _compiler_module
import triton.runtime._async_compile as _async_module
import triton.runtime.cache as _cache_module
import triton.runtime.jit as _jit_module
from triton import knobs
from triton.backends.compiler import Language

from .errors import TritonpatchError

MINIMUM = (3, 6)
MAXIMUM_EXCLUSIVE = (3, 10)


def _parse_version(text: str) -> tuple[int, int]:
    match = re.match(r"^(\d+)\.(\d+)", text)
    if not match:
        raise TritonpatchError(f"cannot read the Triton version {text!r}")
    return int(match.group(1)), int(match.group(2))


TRITON_VERSION = _parse_version(triton.__version__)
# 3.7+: the hook's zero-argument call puts (key, hash) into both cache keys.
HOOK_GIVES_CACHE_KEYS = TRITON_VERSION >= (3, 7)


def check_supported() -> None:
    """Raise a clear error on a Triton that lacks the stages hook or is newer than tested."""
    if not hasattr(knobs, "runtime") or not hasattr(knobs.runtime, "add_stages_inspection_hook"):
        raise TritonpatchError(
            f"triton {triton.__version__} has no knobs.runtime.add_stages_inspection_hook; tritonpatch "
            "pipelines need triton 3.6.0 to 3.9.x (pip install 'triton>=3.6,<3.10')")
    if not MINIMUM <= TRITON_VERSION < MAXIMUM_EXCLUSIVE:
        raise TritonpatchError(
            f"triton {triton.__version__} is not supported by tritonpatch pipelines (3.6.0 to 3.9.x)")


def get_stages_hook():
    return knobs.runtime.add_stages_inspection_hook


def set_stages_hook(hook) -> None:
    knobs.runtime.add_stages_inspection_hook = hook


def is_triton_language(language) -> bool:
    """True for kernels written in Triton (not Gluon, whose TTGIR is written by hand)."""
    return language == Language.TRITON


# --- cache keys on 3.6 --------------------------------------------------------------------------

_DISK_KEY_BINDINGS = (_cache_module, _compiler_module, _jit_module)
_originals: dict[tuple[object, str], Callable] = {}
_tagging = [False]  # read by the wrappers; False after uninstall where a wrapper could not be unbound


def _tagged_disk_key(original: Callable, tag: Callable[[], str]) -> Callable:
    @functools.wraps(original)
    def get_cache_key(*args, **kwargs):
        key = original(*args, **kwargs)
        suffix = tag() if _tagging[0] else ""
        return key + suffix if suffix else key

    get_cache_key.__tritonpatch_original__ = original
    return get_cache_key


def _tagged_memory_key(original: Callable, tag: Callable[[], str]) -> Callable:
    @functools.wraps(original)
    def compute_cache_key(kernel_key_cache, specialization, options):  # on every launch: keep it lean
        key = original(kernel_key_cache, specialization, options)
        suffix = tag() if _tagging[0] else ""
        return key + suffix if suffix else key

    compute_cache_key.__tritonpatch_original__ = original
    return compute_cache_key


def patch_cache_keys(memory_tag: Callable[[], str], disk_tag: Callable[[], str]) -> None:
    """Make Triton's keys follow the tags (empty for an empty Pipeline): on 3.6 the disk key
    (``disk_tag``: it also marks the Pipeline of the compile about to run) and the in-memory JIT
    key; on every version the async-compile path (context and dedup key)."""
    bindings = [(_async_module.AsyncCompileMode, "submit", _context_carrying_submit, memory_tag)]
    if not HOOK_GIVES_CACHE_KEYS:
        bindings += [(module, "get_cache_key", _tagged_disk_key, disk_tag) for module in _DISK_KEY_BINDINGS]
        bindings.append((_jit_module, "compute_cache_key", _tagged_memory_key, memory_tag))
    for module, name, wrap, tag in bindings:
        original = getattr(module, name)
        _originals[(module, name)] = original
        setattr(module, name, wrap(original, tag))
    _tagging[0] = True


def _context_carrying_submit(original: Callable, tag: Callable[[], str]) -> Callable:
    @functools.wraps(original)
    def submit(self, key, compile_fn, *rest):
        context = contextvars.copy_context()
        suffix = tag() if _tagging[0] and HOOK_GIVES_CACHE_KEYS else ""
        return original(self, key + suffix if suffix else key, lambda: context.run(compile_fn), *rest)

    submit.__tritonpatch_original__ = original
    return submit


def unpatch_cache_keys() -> None:
    """Put back the original functions wherever our wrapper is still the one bound (a wrapper that
    someone else bound on top stays in their chain and adds nothing from now on)."""
    _tagging[0] = False
    for (module, name), original in list(_originals.items()):
        if getattr(getattr(module, name), "__tritonpatch_original__", None) is original:
            setattr(module, name, original)
        del _originals[(module, name)]


# --- stages -------------------------------------------------------------------------------------

def ast_source(fn, signature, constexprs, attrs):
    """The compile source of a ``@triton.jit`` or ``@gluon.jit`` function, as a launch builds it."""
    from triton.compiler import ASTSource

    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)


def element_type(name: str) -> str | None:
    """Triton's canonical name of an element type, from a torch dtype name (``"float16"``, ``"bool"``) or
    a signature's element (``"fp16"``, ``"i1"``): ``"fp16"``, ``"u1"``; None for a name Triton does not
    know. Read from the table Triton specializes launches with (``triton._utils``, 3.6-3.9)."""
    from triton._utils import type_canonicalisation_dict

    return type_canonicalisation_dict.get(name)


def libtriton_path() -> str:
    """The file of Triton's native library (``triton._C.libtriton``): the LLVM the native module reads."""
    import triton._C.libtriton as libtriton

    return libtriton.__file__


def parse_mlir_file(path: str, context):
    """An MLIR module parsed from ``path`` in ``context`` by Triton's bindings (every version)."""
    from triton._C.libtriton import ir

    return ir.parse_mlir_module(path, context)


def is_mlir_module(value) -> bool:
    """True for the MLIR modules the ``ttir`` / ``ttgir`` stages return (every version: ``ir.module``)."""
    from triton._C.libtriton import ir

    return isinstance(value, ir.module)


def ir_locations_from_stored_files() -> bool:
    """Whether ``TRITON_USE_IR_LOC`` is set: Triton then rewrites a stored stage output's locations
    in place before handing it to the next stage (every version reads ``knobs.compilation.use_ir_loc``)."""
    return bool(knobs.compilation.use_ir_loc)


def cubin_stage_with_ptxas_options(backend, options, flags: tuple[str, ...]) -> Callable:
    """The NVIDIA cubin stage, with ``flags`` appended to the options' own ``ptx_options``."""
    extra = " ".join(flags)
    merged = f"{options.ptx_options} {extra}" if options.ptx_options else extra
    patched = dataclasses.replace(options, ptx_options=merged)
    arch = backend.target.arch
    return lambda src, metadata: backend.make_cubin(src, metadata, patched, arch)


_BOOL_WORDS = frozenset({"1", "true", "on"})      # Triton's own reading of DISABLE_LLVM_OPT (C++), not tritonpatch's


def disable_llvm_opt_names() -> tuple[str, ...]:
    """The LLVM options Triton's ``DISABLE_LLVM_OPT`` will set during this compile.

    Triton reads the variable in C++: a boolean value (``1/true/on``) switches optimization off
    without touching any option; anything else is a comma-separated list of option names."""
    value = os.environ.get("DISABLE_LLVM_OPT", "")
    if not value or value.strip().lower() in _BOOL_WORDS:
        return ()
    return tuple(name for name in (part.strip() for part in value.split(",")) if name)


def forced_llvm_flags() -> tuple[str, ...]:
    """The LLVM options Triton's ptx stage sets to true itself (the flags of ``translate_to_asm``), after
    tritonpatch applied a Pipeline's: 3.6-3.8 pass ``nvptx-mad-wide-opt``, 3.9 also ``nvptx-short-ptr``
    (``get_llvm_flags``)."""
    from triton.backends.nvidia import compiler as nvidia

    flags = getattr(nvidia, "get_llvm_flags", None)
    return tuple(flags()) if flags is not None else ("nvptx-mad-wide-opt",)


# --- remote cache -------------------------------------------------------------------------------

def link_redis_knobs() -> None:
    """Make Triton's own ``RedisRemoteCacheBackend`` find its settings: it reads ``knobs.cache.redis``,
    which 3.6-3.9 do not have (their Redis knobs are ``knobs.redis``). Idempotent; a Triton whose
    ``knobs.cache`` has the attribute is left alone. Not undone by ``uninstall()``: it only adds the
    attribute Triton's class expects, and changes nothing that worked before. A read-only property
    of the class, not an attribute of the instance: ``knobs.cache.scope()`` and ``reset()`` restore
    the instance's attributes and would drop one set inside a scope."""
    if not hasattr(knobs.cache, "redis") and hasattr(knobs, "redis"):
        type(knobs.cache).redis = property(lambda _: knobs.redis, doc="Triton's Redis knobs (knobs.redis)")
