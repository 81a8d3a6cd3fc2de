"""Typed, reversible control of the LLVM command-line options (``cl::opt``) inside Triton.

Triton links LLVM statically into ``libtriton.so`` and exports none of it. The native module
(``tritonpatch._native``) finds LLVM's option registry in the loaded library; this module is its
public face:

    list_options(pattern)           every registered option with its type, value and default
    get_option(name)                one option
    snapshot(*names)                the current values of the settable options (or of those named)
    llvm_options({...})             a block whose compiles use these options (a scoped Pipeline)
    set_option(name, value)         every later compile uses it (a process-wide Pipeline layer)
    apply_options / restore_options change LLVM's live values now (low level, for code that
                                    does not compile: compiles in between are neither scoped nor keyed)

Values are set only through LLVM's own command-line parser, after validation, and read back.
Restoring is exact: an option that had never been specified goes back through
``Option::reset()`` (LLVM code tests ``getNumOccurrences()``), its occurrence count included.

Options whose setting runs a callback (``cl::cb``) are never set: the callback changes LLVM state
outside the option, which no restore undoes. Options whose valid values can still end the process
inside LLVM, touch files, start programs or print LLVM's internals are refused unless allowed by
name with ``allow_unsafe_options(name, ...)``; ``unsafe_reason(name)`` says why.

The registry calls live in :mod:`._llvm_registry` (the native layer, which imports nothing above
it); :func:`llvm_options` and :func:`set_option` are Pipeline settings, so this module imports the
Pipeline's process layer and blocks on top of it, one way.
"""
from __future__ import annotations

from typing import Any, Mapping

from ._current import set_process_llvm_option
from ._llvm_registry import (SETTABLE_TYPES, LLVMOption, allow_unsafe_options, apply_options, available,
                             check_settings, get_option, list_options, native_info, normalize_value,
                             restore_options, snapshot, unsafe_reason)
from .errors import NativeUnavailableError, OptionTypeError, UnknownOptionError, UnsafeOptionError
from .scope import ensure_installed, options

__all__ = [
    "LLVMOption", "SETTABLE_TYPES", "available", "native_info", "list_options", "get_option", "snapshot", "set_option",
    "normalize_value", "apply_options", "restore_options", "llvm_options", "allow_unsafe_options",
    "unsafe_reason", "NativeUnavailableError", "UnknownOptionError", "OptionTypeError", "UnsafeOptionError",
]


def set_option(name: str, value: Any) -> Any:
    """Set option ``name`` for every later compile in every thread; return the previous setting.

    This is a process-wide layer of the compile Pipeline, between the ``TRITONPATCH_*`` variables
    and ``tritonpatch.options()`` blocks (a per-kernel Pipeline ignores it): the option is applied
    only around each compile's ``llir``/``ptx`` stages and joins the cache keys, so no compile
    without it sees it or shares its artifacts. LLVM itself is not changed here: outside a
    compile ``get_option(name)`` still reads LLVM's own value. ``None`` takes the option out of the
    layer (back to LLVM's unspecified state and, with nothing else set, plain Triton's cache keys);
    any other value is given to LLVM as set, even one equal to the default, because LLVM code can
    tell a given option from an untouched one. Returns the layer's previous value, ``None`` when
    it had none, so ``set_option(name, previous)`` undoes the call. Installs tritonpatch into Triton.
    A name that is not a string raises :class:`OptionTypeError`, as :func:`get_option` does."""
    previous = set_process_llvm_option(name, value)
    ensure_installed()
    return previous


def llvm_options(settings: Mapping[str, Any]) -> options:
    """A block (or decorator) whose compiles use these LLVM options: ``tritonpatch.options(llvm=settings)``.

    The options are validated now and held in a context variable: compiles in the block (this
    thread or asyncio task only) get them around their ``llir``/``ptx`` stages, with the options'
    fingerprint in their cache keys; other threads, the code after the block and other processes
    are unaffected. LLVM itself is not changed while the block runs: inside it, outside a compile,
    ``get_option`` reads LLVM's default. Code that must change LLVM's live values without compiling
    uses :func:`apply_options` / :func:`restore_options`."""
    check_settings(settings, "llvm_options()")
    return options(llvm=settings)
