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

Values are set only through LLVM's own command-line parser, after validation, and read back.
Restoring is exact: an option that had never been specified goes back through
``Option::reset()`` (LLVM code tests ``getNumOccurrences()``), its occurrence count included.

Options whose setting runs a callback (``cl::cb``) are never set: the callback changes LLVM state
outside the option, which no restore undoes. Options whose valid values can still end the process
inside LLVM, touch files, start programs or print LLVM's internals are refused unless allowed by
name with ``allow_unsafe_options(name, ...)``; ``unsafe_reason(name)`` says why.

Only :mod:`._llvm_gate`, :mod:`.env` and :mod:`.errors` are imported from tritonpatch: the scope
that applies options around compiles (:mod:`._llvm_scope`) and the Pipeline layers sit above this
module. Two imports wait for the first opening of the registry, for optional parts: the native
extension (absent when tritonpatch was installed without building it) and Triton itself.
"""
from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import os
import re
import struct
import threading
from collections import Counter
from typing import Any, Mapping

from ._llvm_gate import gate
from .env import bool_word
from .errors import NativeUnavailableError, OptionTypeError, UnknownOptionError, UnsafeOptionError

__all__ = [
    "LLVMOption", "SETTABLE_TYPES", "available", "native_info", "native_registry", "list_options", "get_option",
    "snapshot", "normalize_value", "apply_options", "restore_options", "allow_unsafe_options", "unsafe_reason",
]

_INT_RANGES = {
    "int": (-(2**31), 2**31 - 1),
    "unsigned": (0, 2**32 - 1),
    "long": (-(2**63), 2**63 - 1),
    "long long": (-(2**63), 2**63 - 1),
    "unsigned long": (0, 2**64 - 1),
    "unsigned long long": (0, 2**64 - 1),
}
_FLOAT_MAX = struct.unpack("f", bytes.fromhex("ffff7f7f"))[0]  # the largest finite float32
SETTABLE_TYPES = frozenset({"bool", "float", "double", "string", "boolOrDefault", "enum", *_INT_RANGES})


@dataclasses.dataclass(frozen=True)
class LLVMOption:
    """One registered LLVM option as it is now.

    ``type`` is one of ``bool, int, unsigned, long, unsigned long, long long, unsigned long long,
    float, double, string, boolOrDefault, enum`` (settable) or ``list, bits, other`` (listed only).
    ``boolOrDefault`` values are ``True``, ``False`` or ``None`` (unset); enum values are the choice
    names, ``choice_values`` the integers LLVM stores for them (two names with one integer are
    aliases). ``value``/``default`` are ``None`` where LLVM holds none or it cannot be read safely.
    ``callback`` is ``"none"``, ``"custom"`` (setting it runs a ``cl::cb`` callback) or
    ``"unknown"`` (it could not be checked); only ``"none"`` can be set.
    """

    name: str
    type: str
    value: Any
    default: Any
    specified: bool
    help: str
    choices: tuple[str, ...] | None = None
    external: bool = False
    choice_values: tuple[int, ...] | None = None
    callback: str = "none"

    @property
    def settable(self) -> bool:
        return (self.type in SETTABLE_TYPES and (self.type != "enum" or bool(self.choices))
                and self.callback == "none")

    @property
    def changed(self) -> bool:
        """True when the option was given explicitly, or its value differs from a declared default."""
        return self.specified or (self.default is not None and self.value != self.default)


_lock = threading.RLock()
_registry_instance = None


def _reset_lock_in_child() -> None:
    """A fork while another thread held the lock must not leave the child deadlocked."""
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_reset_lock_in_child)


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


def _raw(name: str) -> Mapping[str, Any]:
    if not isinstance(name, str) or not name:
        raise UnknownOptionError(f"an LLVM option name must be a non-empty string, got {name!r}")
    raw = native_registry().option(name.lstrip("-"))
    if raw is None:
        raise _unknown(name)
    return raw


def list_options(pattern: str | None = None) -> list[LLVMOption]:
    """All registered options sorted by name; ``pattern`` is a case-insensitive substring, or a
    glob when it contains ``*?[``."""
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
    value = _normalize_type(opt, value)
    reason = _unsafe_reason(opt)
    if reason is not None and not _allowed_unsafe[opt.name]:
        raise UnsafeOptionError(
            f"LLVM option {opt.name!r} is refused: {reason}. To set it anyway, accepting that, call "
            f"tritonpatch.llvm.allow_unsafe_options({opt.name!r}) first")
    return value


def _normalize_type(opt: LLVMOption, value: Any) -> Any:
    kind = opt.type
    if not opt.settable:
        raise OptionTypeError(f"LLVM option {opt.name!r} cannot be set: {_not_settable_reason(opt)}")

    def bad(expected: str) -> OptionTypeError:
        return OptionTypeError(f"LLVM option {opt.name!r} ({kind}) expects {expected}, got {value!r}")

    if kind in ("bool", "boolOrDefault"):
        if kind == "boolOrDefault" and (value is None or isinstance(value, str) and value.strip().lower() == "unset"):
            return None
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        word = bool_word(value) if isinstance(value, str) else None
        if word is not None:
            return word
        unset = " or None/'unset'" if kind == "boolOrDefault" else ""
        raise bad(f"a bool (True/False, 1/0, 'true'/'false', 'on'/'off', 'yes'/'no'){unset}")
    if kind in _INT_RANGES:
        lo, hi = _INT_RANGES[kind]
        if isinstance(value, str):
            try:
                value = int(value.strip(), 0)
            except ValueError:
                raise bad(f"an integer in [{lo}, {hi}]") from None
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise bad(f"an integer in [{lo}, {hi}]")
        return int(value)
    if kind in ("float", "double"):
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise bad("a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise bad("a finite number")
        if kind == "double":
            return value
        rounded = struct.unpack("f", struct.pack("f", value))[0]  # what a float holds: the nearest float32
        if rounded in (float("inf"), float("-inf")):
            raise bad(f"a number a float can hold (magnitude at most {_FLOAT_MAX!r})")
        return rounded
    if kind == "string":
        if not isinstance(value, str):
            raise bad("a string")
        if "\0" in value:
            raise bad("a string without NUL characters (LLVM's parser would cut it at the first one)")
        return value
    if kind == "enum":
        if not isinstance(value, str) or value not in opt.choices:
            raise bad(f"one of {', '.join(repr(c) for c in opt.choices)}")
        # Names that share one stored value are aliases; LLVM reads back the first of them.
        stored = opt.choice_values[opt.choices.index(value)]
        return opt.choices[opt.choice_values.index(stored)]
    raise bad("a settable type")  # pragma: no cover - SETTABLE_TYPES covers every branch above


def _not_settable_reason(opt: LLVMOption) -> str:
    if opt.type not in SETTABLE_TYPES:
        return f"type {opt.type!r} is read-only here"
    if opt.type == "enum" and not opt.choices:
        return "enum choices could not be read"
    if opt.callback == "custom":
        return ("setting it runs a callback (cl::cb) that changes LLVM state outside the option, which no "
                "restore can undo: later compiles would inherit it")
    return "whether setting it runs a callback (cl::cb) could not be checked, and a callback's effects cannot be undone"


# Options refused unless allowed by name. Values that fit their types still end the process inside
# LLVM (Triton's LLVM is built with assertions), touch the file system or start programs, or print
# LLVM's internals during every compile. Rules are (name pattern, the types it covers, reason): the
# first that matches gives the reason. Other string options are refused as free-form text.
_ANY_TYPE = None
_UNSAFE_RULES = tuple((re.compile(pattern), types, reason) for pattern, types, reason in (
    (r"^(start|stop)-(before|after)$", {"string"},
     "it picks the pass where code generation starts or stops: an unknown pass name ends the process, "
     "a known one crashes LLVM or leaves the PTX unfinished"),
    (r"^exec-on-ir-change$|(^|-)(file|files|filename|path|paths|dir|directory|csv|summary|summaries|plugin"
     r"|replay|channel-base|vocab|json|dotcfg|list)(-|$)", {"string"},
     "it names a file, directory or program that LLVM reads, writes or runs; a missing file ends the process"),
    (r"(^|-)view(-|$)", _ANY_TYPE,
     "it opens or configures a graph viewer, which writes a temporary file and starts a program during compiles"),
    (r"(^|-)(ml|advisor|interactive|ir2vec|mir2vec)(-|$)", _ANY_TYPE,
     "it selects or configures an ML-guided or interactive advisor, which needs models or files Triton "
     "does not ship; LLVM ends the process without them"),
    (r"(^|-)abort(-|$)", _ANY_TYPE, "it makes LLVM end the process when what it asks for is unavailable"),
    (r"(^|-)verify(-|$)", _ANY_TYPE,
     "it runs one of LLVM's internal verifiers, which end the process at the first problem they find"),
    (r"dwarf|^accel-tables$|^generate-arange-section$", _ANY_TYPE,
     "it shapes DWARF debug-info emission, which NVPTX supports only in part: some values abort LLVM, "
     "others give PTX that ptxas rejects"),
    (r"^non-global-value-max-name-size$", _ANY_TYPE, "a limit below the length of the names in Triton's IR aborts LLVM"),
    (r"^stackmap-version$", _ANY_TYPE, "any version but 3 aborts LLVM"),
    (r"^lsr-complexity-limit$", _ANY_TYPE,
     "a low limit (0 or 1 on Triton's attention kernels) trips an assertion in loop strength reduction"),
    (r"^enable-gvn-memoryssa$", _ANY_TYPE, "switched on, it trips an assertion in GVN"),
    (r"^enable-implicit-null-checks$", _ANY_TYPE,
     "switched on, it aborts LLVM (the pass's machine-function property check fails on NVPTX)"),
    (r"^disable-fp-call-folding$", _ANY_TYPE, "switched on, it crashes LLVM (Triton 3.9)"),
    (r"(^|-)trigger-crash$", _ANY_TYPE, "it makes LLVM crash on purpose (a test aid)"),
    (r"(^|-)(print|dump|debug|debugify|stats|remarks|verbose)(-|$)|^(aa-trace|time-passes|track-memory)$", _ANY_TYPE,
     "it is an LLVM debugging aid: it prints LLVM's internals (to stderr or files) during every compile, "
     "or changes debug-info emission"),
))
_FREE_FORM_TEXT = ("it takes free-form text (a pass, function, file or program name) that tritonpatch cannot "
                   "check, and LLVM ends the process on many wrong values")
_allowed_unsafe: Counter = Counter()  # option name -> allow_unsafe_options() grants in force


def unsafe_reason(name: str) -> str | None:
    """Why option ``name`` is refused by default (``None`` when it is not), whether or not it has
    been allowed with :func:`allow_unsafe_options`."""
    return _unsafe_reason(_to_option(_raw(name)))


def _unsafe_reason(opt: LLVMOption) -> str | None:
    for pattern, types, reason in _UNSAFE_RULES:
        if (types is _ANY_TYPE or opt.type in types) and pattern.search(opt.name):
            return reason
    return _FREE_FORM_TEXT if opt.type == "string" else None


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
            raise OptionTypeError(f"LLVM option {opt.name!r} cannot be allowed: {_not_settable_reason(opt)}")
        canonical.append(opt.name)
    with _lock:
        _allowed_unsafe.update(canonical)
    return _UnsafeGrant(tuple(canonical))


def _as_argument(kind: str, value: Any) -> str:
    """The text LLVM's parser gets after ``-name=``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind in ("float", "double"):
        return repr(value)
    return str(value)


def _set(opt: LLVMOption, value: Any) -> None:
    reg = native_registry()
    if value is None:  # an unset boolOrDefault: LLVM's parser has no spelling for it
        reg.unset(opt.name)
    else:
        reg.parse(opt.name, _as_argument(opt.type, value))
    now = reg.option(opt.name)["value"]
    if now != value:
        raise OptionTypeError(
            f"LLVM did not take {opt.name}={value!r} (reads back {now!r}); the option was restored")


def apply_options(settings: Mapping[str, Any]) -> list:
    """Set several options in LLVM now, process-wide, all or nothing; return the saved states for
    :func:`restore_options`. Low level, for code that does not compile: a compile in any thread
    until the restore is neither scoped nor keyed (it sees these values and is cached under plain
    keys). To compile with options use :func:`llvm_options` or ``tritonpatch.options(llvm=...)``."""
    with _lock:
        reg = native_registry()
        planned = []
        for name, value in settings.items():
            opt = _to_option(_raw(name))
            planned.append((opt, _normalize(opt, value)))
        saved: list = []
        try:
            for opt, value in planned:
                saved.append(reg.snapshot(opt.name))
                _set(opt, value)
        except BaseException:
            restore_options(saved)
            raise
        return saved


def restore_options(saved: list) -> None:
    """Restore states saved by :func:`apply_options` (or the native ``snapshot``), newest first.
    Low level, like :func:`apply_options`: compiles in between are neither scoped nor keyed."""
    with _lock:
        reg = native_registry()
        errors = []
        for state in reversed(saved):
            try:
                reg.restore(state)
            except RuntimeError as exc:  # keep restoring the others, then report
                errors.append(str(exc))
        if errors:
            raise RuntimeError("could not restore LLVM options exactly: " + "; ".join(errors))
