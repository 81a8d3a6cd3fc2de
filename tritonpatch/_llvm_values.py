"""What LLVM options accept, independent of the registry: the option record, the Python value each
settable type takes (validated and canonical), the text LLVM's parser gets, and the options refused
by default because some valid values end the process, touch files, start programs or print LLVM's
internals (:data:`UNSAFE_RULES`)."""
from __future__ import annotations

import dataclasses
import re
import struct
from typing import Any

from .env import bool_word
from .errors import OptionTypeError


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


def typed_value(opt: LLVMOption, value: Any) -> Any:
    """``value`` validated for ``opt``'s type, in its canonical Python form; an OptionTypeError naming
    what the option expects otherwise."""
    kind = opt.type
    if not opt.settable:
        raise OptionTypeError(f"LLVM option {opt.name!r} cannot be set: {not_settable_reason(opt)}")

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


def not_settable_reason(opt: LLVMOption) -> str:
    """Why ``opt`` cannot be set (for an option that is not :attr:`LLVMOption.settable`)."""
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
ANY_TYPE = None
UNSAFE_RULES = tuple((re.compile(pattern), types, reason) for pattern, types, reason in (
    (r"^(start|stop)-(before|after)$", {"string"},
     "it picks the pass where code generation starts or stops: an unknown pass name ends the process, "
     "a known one crashes LLVM or leaves the PTX unfinished"),
    (r"^exec-on-ir-change$|(^|-)(file|files|filename|path|paths|dir|directory|csv|summary|summaries|plugin"
     r"|replay|channel-base|vocab|json|dotcfg|list)(-|$)", {"string"},
     "it names a file, directory or program that LLVM reads, writes or runs; a missing file ends the process"),
    (r"(^|-)view(-|$)", ANY_TYPE,
     "it opens or configures a graph viewer, which writes a temporary file and starts a program during compiles"),
    (r"(^|-)(ml|advisor|interactive|ir2vec|mir2vec)(-|$)", ANY_TYPE,
     "it selects or configures an ML-guided or interactive advisor, which needs models or files Triton "
     "does not ship; LLVM ends the process without them"),
    (r"(^|-)abort(-|$)", ANY_TYPE, "it makes LLVM end the process when what it asks for is unavailable"),
    (r"(^|-)verify(-|$)", ANY_TYPE,
     "it runs one of LLVM's internal verifiers, which end the process at the first problem they find"),
    (r"dwarf|^accel-tables$|^generate-arange-section$", ANY_TYPE,
     "it shapes DWARF debug-info emission, which NVPTX supports only in part: some values abort LLVM, "
     "others give PTX that ptxas rejects"),
    (r"^non-global-value-max-name-size$", ANY_TYPE, "a limit below the length of the names in Triton's IR aborts LLVM"),
    (r"^stackmap-version$", ANY_TYPE, "any version but 3 aborts LLVM"),
    (r"^lsr-complexity-limit$", ANY_TYPE,
     "a low limit (0 or 1 on Triton's attention kernels) trips an assertion in loop strength reduction"),
    (r"^enable-gvn-memoryssa$", ANY_TYPE, "switched on, it trips an assertion in GVN"),
    (r"^enable-implicit-null-checks$", ANY_TYPE,
     "switched on, it aborts LLVM (the pass's machine-function property check fails on NVPTX)"),
    (r"^disable-fp-call-folding$", ANY_TYPE, "switched on, it crashes LLVM (Triton 3.9)"),
    (r"(^|-)trigger-crash$", ANY_TYPE, "it makes LLVM crash on purpose (a test aid)"),
    (r"(^|-)(print|dump|debug|debugify|stats|remarks|verbose)(-|$)|^(aa-trace|time-passes|track-memory)$", ANY_TYPE,
     "it is an LLVM debugging aid: it prints LLVM's internals (to stderr or files) during every compile, "
     "or changes debug-info emission"),
))
FREE_FORM_TEXT = ("it takes free-form text (a pass, function, file or program name) that tritonpatch cannot "
                  "check, and LLVM ends the process on many wrong values")


def unsafe_rule(opt: LLVMOption) -> str | None:
    """The reason ``opt`` is refused by default (the first matching rule), None when it is not."""
    for pattern, types, reason in UNSAFE_RULES:
        if (types is ANY_TYPE or opt.type in types) and pattern.search(opt.name):
            return reason
    return FREE_FORM_TEXT if opt.type == "string" else None


def as_argument(kind: str, value: Any) -> str:
    """The text LLVM's parser gets after ``-name=``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind in ("float", "double"):
        return repr(value)
    return str(value)
