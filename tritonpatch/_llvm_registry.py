"""The native layer of LLVM options: the ``cl::opt`` registry inside Triton, typed and reversible.

Triton links LLVM statically into ``libtriton.so`` and exports none of it. The native module
(``tritonpatch._native``) finds LLVM's option registry in the loaded library; this module gives it
a typed Python face (``tritonpatch.llvm`` re-exports it, with the Pipeline-level calls on top):

    list_options(pattern)           every registered option with its type, value and default
    get_option(name)                one option
    snapshot(*names)                the current values of the settable options (or of those named)
    normalize_value(name, value)    a value validated for its option, without touching LLVM
    unsafe_reason, allow_unsafe_options   the options refused by default, and letting them through
    apply_options / restore_options change LLVM's live values now (low level, for code that
                                    does not compile: compiles in between are neither scoped nor keyed)

How values are set and restored, and which options are refused: :mod:`tritonpatch.llvm`.

Only :mod:`._llvm_gate`, :mod:`._llvm_values` (what each option accepts) and :mod:`.errors` are
imported from tritonpatch: the scope that applies options around compiles (:mod:`._llvm_scope`) and
the Pipeline layers sit above this module. Two imports wait for the first opening of the registry,
for optional parts: the native extension (absent when tritonpatch was installed without building it) and Triton itself.
"""
from __future__ import annotations

import difflib
import fnmatch
import reprlib
import threading
from collections import Counter
from typing import Any, Mapping

from ._fork_safety import renew_in_child
from ._llvm_gate import gate
from ._llvm_values import SETTABLE_TYPES, LLVMOption, as_argument, not_settable_reason, typed_value, unsafe_rule
from .errors import NativeUnavailableError, OptionTypeError, UnknownOptionError, UnsafeOptionError

__all__ = [
    "LLVMOption", "SETTABLE_TYPES", "available", "native_info", "native_registry", "list_options", "get_option",
    "snapshot", "normalize_value", "apply_options", "restore_options", "allow_unsafe_options", "unsafe_reason",
    "option_name", "check_settings",
]


_lock = threading.RLock()
renew_in_child(globals(), _lock=threading.RLock)
_registry_instance = None


def native_registry():
    """The native registry of the LLVM inside the loaded libtriton.so (opened once).

    Opening it calibrates by flipping ``disable-lsr`` and ``unroll-threshold`` through LLVM's
    parser, so it holds the LLVM option gate exclusively: no compile that goes through
    tritonpatch is in its LLVM stages meanwhile (they hold the gate there: ``tritonpatch._llvm_scope``)."""
    global _registry_instance
    if _registry_instance is not None:
        return _registry_instance
    if gate.depth():
        raise RuntimeError("tritonpatch: LLVM's option registry cannot be opened from inside a compile's "
                           "llir/ptx stage (the stage holds the LLVM option scope); open it before "
                           "compiling, e.g. with tritonpatch.llvm.available()")
    try:  # Triton first, outside the gate: under TRITONPATCH_AUTOLOAD its import installs tritonpatch, which
        from . import _triton_compat  # noqa: F401 - may open this registry itself (and needs the gate)
    except ImportError:
        pass   # _open_registry says what is missing
    if _registry_instance is not None:
        return _registry_instance
    with gate.exclusive(unless=lambda: _registry_instance is not None):
        if _registry_instance is None:
            _registry_instance = _open_registry()
    return _registry_instance


def _open_registry():
    """The native extension's Registry of the loaded libtriton.so. Both imports are of optional
    parts, so they wait until here: a missing extension or Triton is an error that says so."""
    try:
        from . import _native
    except ImportError as exc:
        raise NativeUnavailableError(
            f"tritonpatch._native is not built ({exc}); reinstall tritonpatch with "
            "`pip install -e .` (it needs a C++17 compiler, CMake and pybind11)") from exc
    try:
        from ._triton_compat import libtriton_path

        library = libtriton_path()
    except ImportError as exc:
        raise NativeUnavailableError(f"cannot import Triton's libtriton ({exc}); install triton") from exc
    try:
        return _native.Registry(library)
    except RuntimeError as exc:
        import triton
        # A library replaced on disk is a fact about this process, not about the Triton version.
        support = "" if "no longer the file loaded" in str(exc) else (
            " Supported: triton 3.6.0 to 3.9.0 with an unstripped libtriton.so;")
        raise NativeUnavailableError(
            f"LLVM options are unavailable with triton {triton.__version__} ({library}): {exc}."
            f"{support} the rest of tritonpatch works without this.") from exc


def available() -> bool:
    """Whether LLVM options can be listed and set in this process."""
    try:
        native_registry()
        return True
    except NativeUnavailableError:
        return False


def native_info() -> dict:
    """How the native module found LLVM: library path, registry layout, calibrated offsets."""
    return dict(native_registry().info())


def _to_option(raw: Mapping[str, Any]) -> LLVMOption:
    choices, choice_values = raw.get("choices"), raw.get("choice_values")
    return LLVMOption(
        name=raw["name"], type=raw["type"], value=raw["value"], default=raw["default"],
        specified=raw["occurrences"] > 0, help=raw["help"],
        choices=tuple(choices) if choices is not None else None, external=raw["external"],
        choice_values=tuple(choice_values) if choice_values is not None else None,
        callback=raw.get("callback", "none"))


def _unknown(name: str) -> UnknownOptionError:
    close = difflib.get_close_matches(name, native_registry().names(), n=5, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return UnknownOptionError(
        f"unknown LLVM option {name!r}{hint} (`tritonpatch llvm-options PATTERN` lists them)")


def option_name(name: Any) -> str:
    """``name`` without its leading dashes, checked without opening the registry: a name that is
    not a string is an :class:`OptionTypeError`, an empty one an :class:`UnknownOptionError`."""
    if not isinstance(name, str):
        raise OptionTypeError(f"an LLVM option name is a string such as 'disable-lsr', got {reprlib.repr(name)} "
                              f"({type(name).__name__})")
    canonical = name.lstrip("-")
    if not canonical:
        raise UnknownOptionError(f"an LLVM option name must not be empty, got {name!r} "
                                 "(`tritonpatch llvm-options PATTERN` lists them)")
    return canonical


def check_settings(settings: Any, where: str) -> None:
    """An :class:`OptionTypeError` unless ``settings`` is a mapping of option name to value, as
    ``where`` (the function given them) takes: a name or a list of names is a common slip."""
    if not isinstance(settings, Mapping):
        raise OptionTypeError(f"{where} takes a mapping of option name to value such as {{'disable-lsr': True}}, "
                              f"got {reprlib.repr(settings)}")


def _raw(name: str) -> Mapping[str, Any]:
    raw = native_registry().option(option_name(name))
    if raw is None:
        raise _unknown(name)
    return raw


def list_options(pattern: str | None = None) -> list[LLVMOption]:
    """All registered options sorted by name; ``pattern`` is a case-insensitive substring, or a
    glob when it contains ``*?[``."""
    if pattern is not None and not isinstance(pattern, str):
        raise OptionTypeError(f"list_options() takes a pattern string such as 'lsr' or 'unroll-*' (or None for "
                              f"every option), got {reprlib.repr(pattern)}")
    options = [_to_option(raw) for raw in native_registry().options()]
    if pattern:
        pat = pattern.lower()
        if any(ch in pat for ch in "*?["):
            options = [o for o in options if fnmatch.fnmatchcase(o.name.lower(), pat)]
        else:
            options = [o for o in options if pat in o.name.lower()]
    return sorted(options, key=lambda o: o.name)


def get_option(name: str) -> LLVMOption:
    """The option ``name`` (leading dashes allowed) as it is now."""
    return _to_option(_raw(name))


def snapshot(*names: str) -> dict[str, Any]:
    """The current value of every settable option (:attr:`LLVMOption.settable`), or of the options
    ``names`` (any registered option, leading dashes allowed), by name in sorted order.

    Read-only: a record to compare against, e.g. ``assert llvm.snapshot() == before`` to show that
    nothing changed a value. It holds values only (``get_option(name).specified`` tells whether an
    option was given) and is no saved state: :func:`restore_options` takes what
    :func:`apply_options` returns."""
    if not names:
        return {opt.name: opt.value for opt in list_options() if opt.settable}
    named = sorted((get_option(name) for name in names), key=lambda opt: opt.name)
    return {opt.name: opt.value for opt in named}


def normalize_value(name: str, value: Any) -> Any:
    """Validate ``value`` for option ``name`` without touching LLVM; return its canonical Python
    form (bool, int, float, str, or None for an unset boolOrDefault). Raises
    :class:`UnsafeOptionError` for an option refused by default (see :func:`unsafe_reason`)."""
    return _normalize(_to_option(_raw(name)), value)


def _normalize(opt: LLVMOption, value: Any) -> Any:
    value = typed_value(opt, value)
    reason = unsafe_rule(opt)
    if reason is not None and not _allowed_unsafe[opt.name]:
        raise UnsafeOptionError(
            f"LLVM option {opt.name!r} is refused: {reason}. To set it anyway, accepting that, call "
            f"tritonpatch.llvm.allow_unsafe_options({opt.name!r}) first")
    return value


_allowed_unsafe: Counter = Counter()  # option name -> allow_unsafe_options() grants in force


def unsafe_reason(name: str) -> str | None:
    """Why option ``name`` is refused by default (``None`` when it is not), whether or not it has
    been allowed with :func:`allow_unsafe_options`."""
    return unsafe_rule(_to_option(_raw(name)))


class _UnsafeGrant:
    """What :func:`allow_unsafe_options` returns: the grant is in force from the call on; used as a
    context manager, it ends with the ``with`` block."""

    def __init__(self, names: tuple[str, ...]):
        self._names = names

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info) -> None:
        with _lock:
            _allowed_unsafe.subtract(self._names)
            for name in self._names:
                if _allowed_unsafe[name] <= 0:
                    del _allowed_unsafe[name]


def allow_unsafe_options(*names: str) -> _UnsafeGrant:
    """Let the named options, refused by default (:func:`unsafe_reason` says why), be set from now
    on: process-wide, or for a ``with allow_unsafe_options(...):`` block only. Allowing accepts what
    the refusal names: such a value may end the process inside LLVM. Options whose setting runs a
    callback stay refused: their effects cannot be restored."""
    canonical = []
    for name in names:
        opt = _to_option(_raw(name))
        if opt.callback != "none":
            raise OptionTypeError(f"LLVM option {opt.name!r} cannot be allowed: {not_settable_reason(opt)}")
        canonical.append(opt.name)
    with _lock:
        _allowed_unsafe.update(canonical)
    return _UnsafeGrant(tuple(canonical))


def _set(opt: LLVMOption, value: Any) -> None:
    reg = native_registry()
    if value is None:  # an unset boolOrDefault: LLVM's parser has no spelling for it
        reg.unset(opt.name)
    else:
        reg.parse(opt.name, as_argument(opt.type, value))
    now = reg.option(opt.name)["value"]
    if now != value:
        raise OptionTypeError(
            f"LLVM did not take {opt.name}={value!r} (reads back {now!r}); the option was restored")


def apply_options(settings: Mapping[str, Any]) -> list:
    """Set several options in LLVM now, process-wide, all or nothing; return the saved states for
    :func:`restore_options`. Low level, for code that does not compile: a compile in any thread
    until the restore is neither scoped nor keyed (it sees these values and is cached under plain
    keys). To compile with options use :func:`llvm_options` or ``tritonpatch.options(llvm=...)``."""
    check_settings(settings, "apply_options()")
    saved: list = []
    apply_options_into(settings, saved)
    return saved


def apply_options_into(settings: Mapping[str, Any], saved: list) -> None:
    """:func:`apply_options`, appending each option's saved state to ``saved`` before setting it, so that
    ``saved`` covers every change made so far at any moment (a fork in the middle: the child restores what
    the parent had changed). On an error the changes are undone and ``saved`` is as it was."""
    with _lock:
        reg = native_registry()
        planned = []
        for name, value in settings.items():
            opt = _to_option(_raw(name))
            planned.append((opt, _normalize(opt, value)))
        start = len(saved)
        try:
            for opt, value in planned:
                saved.append(reg.snapshot(opt.name))
                _set(opt, value)
        except BaseException:
            _restore_popping(reg, saved, keep=start)
            raise


def restore_options(saved: list) -> None:
    """Restore states saved by :func:`apply_options` (or the native ``snapshot``), newest first.
    Low level, like :func:`apply_options`: compiles in between are neither scoped nor keyed.
    Anything else in ``saved`` is an :class:`OptionTypeError` before any option is restored."""
    restore_options_from(_saved_states(saved))


def _saved_states(saved: Any) -> list:
    """``saved`` as a new list of the native registry's saved states, each checked."""
    native_registry()  # the native extension is importable once the registry is open
    from . import _native

    expected = "restore_options() takes the list apply_options() returned"
    if not isinstance(saved, (list, tuple)):
        raise OptionTypeError(f"{expected}, got {reprlib.repr(saved)}")
    for state in saved:
        if not isinstance(state, _native.OptionState):
            raise OptionTypeError(f"{expected}; it holds {reprlib.repr(state)} ({type(state).__name__}), "
                                  "which is no saved option state")
    return list(saved)


def restore_options_from(saved: list) -> None:
    """:func:`restore_options`, removing each state from ``saved`` once it is restored (newest first), so
    that ``saved`` always holds what is still to restore (a fork in the middle: the child restores the rest)."""
    with _lock:
        _restore_popping(native_registry(), saved)


def _restore_popping(reg, saved: list, keep: int = 0) -> None:
    """Restore and pop the states of ``saved`` after its first ``keep``, newest first."""
    errors = []
    while len(saved) > keep:
        try:
            reg.restore(saved[-1])
        except RuntimeError as exc:  # keep restoring the others, then report
            errors.append(str(exc))
        saved.pop()
    if errors:
        raise RuntimeError("could not restore LLVM options exactly: " + "; ".join(errors))
