"""The ``TRITONPATCH_*`` environment variables, parsed into Pipeline settings.

Unmodified programs (a training script, ``torch.compile``'s compile workers) reach tritonpatch only
through these variables. Parsing is pure (it takes a mapping) so that it can be tested without
touching ``os.environ``; a malformed value raises :class:`PipelineError` naming the variable and the
offending token.

    TRITONPATCH_DISABLE_LSR=1                        llvm option disable-lsr=true
    TRITONPATCH_LLVM_OPTIONS="disable-lsr,unroll-threshold=50"   ``name`` or ``name=value``, comma separated
    TRITONPATCH_PASSES="hoist-masks,elide-uniform-masks(max_atoms=4)"  pass specs, comma separated
    TRITONPATCH_PTXAS_OPTIONS="--def-load-cache=cg -O3"         whitespace separated, like Triton's PTXAS_OPTIONS
    TRITONPATCH_LOG=info|debug                       log which Pipeline each kernel compiled with
    TRITONPATCH_STRICT=1                             a failing IR pass raises instead of falling back
    TRITONPATCH_AUTOLOAD=1                           activate at interpreter start (see _autoload)
    TRITONPATCH_COMPILE_THREADS=N                    worker processes the attention tuners compile candidates in
    TRITONPATCH_TUNING_CACHE=DIR|0                   where the attention tuners keep decisions (0: memory only)
    TRITONPATCH_FAST_LAUNCH=0                        attention kernels launch through Triton's JIT every call

:func:`check_environment` parses every one of them at once (autoload does, so that any bad value
disables it with one warning). Values quoted in messages are cut to :data:`QUOTE_LIMIT` characters.
"""
from __future__ import annotations

import difflib
import os
import re
from typing import Any, Mapping

from .errors import PipelineError

DISABLE_LSR = "TRITONPATCH_DISABLE_LSR"
LLVM_OPTIONS = "TRITONPATCH_LLVM_OPTIONS"
PASSES = "TRITONPATCH_PASSES"
PTXAS_OPTIONS = "TRITONPATCH_PTXAS_OPTIONS"
LOG = "TRITONPATCH_LOG"
STRICT = "TRITONPATCH_STRICT"
AUTOLOAD = "TRITONPATCH_AUTOLOAD"
COMPILE_THREADS = "TRITONPATCH_COMPILE_THREADS"
TUNING_CACHE = "TRITONPATCH_TUNING_CACHE"
FAST_LAUNCH = "TRITONPATCH_FAST_LAUNCH"

PIPELINE_VARIABLES = (DISABLE_LSR, LLVM_OPTIONS, PASSES, PTXAS_OPTIONS)
LOG_LEVELS = ("warning", "info", "debug")

MAX_COMPILE_THREADS = 1024
QUOTE_LIMIT = 80

# The boolean words of the TRITONPATCH_* variables, pass options and LLVM bool values (read by
# bool_word; tritonpatch_autoload.pth repeats FALSE_WORDS, as it runs before tritonpatch is imported).
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
BOOL_WORDS = f"{'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}"
_LLVM_NAME = re.compile(r"^-{0,2}[A-Za-z0-9][A-Za-z0-9_.$-]*$")
_ASCII_DIGITS = re.compile(r"^[0-9]+$")
# ptxas flags that tritonpatch cannot pass on (long and short spelling): Triton gives ptxas the target,
# the input and the output itself, and the others would make ptxas compile nothing (or only a named
# entry) or read unchecked flags.
_PTXAS_RESERVED = {
    name: reason
    for names, reason in ((("gpu-name", "arch"), "Triton sets the target"),
                          (("output-file", "o"), "Triton sets the output file"),
                          (("input-as-string", "ias"), "Triton sets the input"),
                          (("options-file", "optf"), "flags read from a file cannot be checked"),
                          (("help", "h"), "ptxas would print its help and compile nothing"),
                          (("version", "V"), "ptxas would print its version and compile nothing"),
                          (("list-version", "version-ls"), "ptxas would list its PTX versions and compile nothing"),
                          (("list-arch", "arch-ls"), "ptxas would list its GPU architectures and compile nothing"),
                          (("entry", "e"), "it restricts the entry functions ptxas compiles, and a name other "
                                           "than the kernel's leaves it nothing to compile"),
                          (("apply-controls",), "compiler controls read from a file cannot be checked"))
    for name in names
}


def did_you_mean(name: Any, known) -> str:
    """`` (did you mean 'x'?)`` for the entry of ``known`` closest to ``name`` (a misspelling), or ``""``
    where none is close: the hint the errors for an unknown name end with."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters: a 100,000-character
    string shows as its first ``limit`` characters and ``… (100000 characters)``."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}… ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit + 2 else f"{text[:limit]}… ({len(text)} characters)"


def _bad(variable: str, value: str, token: str, expected: str) -> PipelineError:
    return PipelineError(f"{variable}={quote(value)}: bad token {quote(token)}; expected {expected}")


def bool_word(text: str) -> bool | None:
    """``1/true/yes/on`` -> True, ``0/false/no/off`` -> False (any case, surrounding blanks
    ignored), anything else -> None: the one reading of a boolean word in variables, pass options
    and LLVM option values."""
    word = text.strip().lower()
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


def parse_bool(variable: str, environ: Mapping[str, str] | None = None) -> bool:
    """``1/true/yes/on`` -> True, unset, blank or ``0/false/no/off`` -> False; anything else raises."""
    environ = os.environ if environ is None else environ
    value = environ.get(variable, "")
    flag = bool_word(value) if value.strip() else False
    if flag is None:
        raise _bad(variable, value, value.strip(), BOOL_WORDS)
    return flag


def parse_llvm_options(value: str, variable: str = LLVM_OPTIONS) -> dict[str, Any]:
    """``"disable-lsr,unroll-threshold=50"`` -> ``{"disable-lsr": True, "unroll-threshold": "50"}``.
    Values stay strings here; the Pipeline validates them against each option's LLVM type."""
    settings: dict[str, Any] = {}
    for raw in value.split(","):
        token = raw.strip()
        if not token:
            if value.strip():  # "a,,b" or a trailing comma
                raise _bad(variable, value, raw, "`name` or `name=value` between commas")
            continue
        name, sep, setting = token.partition("=")
        name = name.strip()
        if not _LLVM_NAME.match(name) or (sep and not setting.strip()):
            raise _bad(variable, value, token, "`name` or `name=value` (an LLVM option name, e.g. disable-lsr)")
        settings[name.lstrip("-")] = setting.strip() if sep else True
    return settings


def split_pass_list(value: str, variable: str = PASSES) -> list[str]:
    """Split ``"a,b(x=1,y=2),c"`` on the commas outside parentheses."""
    specs, depth, start = [], 0, 0
    for i, ch in enumerate(value + ","):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise _bad(variable, value, value[start:i + 1].strip(), "balanced parentheses")
        elif ch == "," and depth == 0:
            token = value[start:i].strip()
            if token:
                specs.append(token)
            elif value.strip():
                raise _bad(variable, value, value[start:i], "a pass spec `name` or `name(key=value,...)` between commas")
            start = i + 1
    if depth:
        raise _bad(variable, value, value[start:].strip(), "balanced parentheses")
    return specs


def parse_ptxas_options(value: str, variable: str = PTXAS_OPTIONS) -> list[str]:
    """Whitespace separated ptxas flags, each ``-flag`` or ``-flag=value``. Refused: NUL characters
    (a process argument ends at the first one, so ptxas would see another flag), and the flags that
    set what Triton sets itself (target, input, output) or that make ptxas compile nothing."""
    if "\0" in value:
        raise PipelineError(f"{variable}={quote(value)}: contains a NUL character; ptxas flags are plain text "
                            "such as --def-load-cache=cg")
    tokens = value.split()
    for token in tokens:
        if not token.startswith("-") or token in ("-", "--"):
            raise _bad(variable, value, token, "ptxas flags such as --def-load-cache=cg (one token each, no spaces)")
        reason = _PTXAS_RESERVED.get(token.lstrip("-").split("=", 1)[0])
        if reason:
            raise _bad(variable, value, token, f"a flag tritonpatch can pass on ({reason}); "
                                                "code-generation flags such as --def-load-cache=cg or -O3")
    return tokens


def pipeline_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``Pipeline(**settings)`` keywords the environment asks for (empty when none)."""
    environ = os.environ if environ is None else environ
    settings: dict[str, Any] = {}
    llvm = parse_llvm_options(environ.get(LLVM_OPTIONS, ""))
    # TRITONPATCH_DISABLE_LSR=0 means Triton's default, not an explicit `disable-lsr=false` (which
    # would give every kernel a new cache key for the same code).
    if parse_bool(DISABLE_LSR, environ):
        if "disable-lsr" in llvm:
            raise PipelineError(f"{DISABLE_LSR} and {LLVM_OPTIONS} both set disable-lsr; set it in one place")
        llvm["disable-lsr"] = True
    if llvm:
        settings["llvm"] = llvm
    passes = split_pass_list(environ.get(PASSES, ""))
    if passes:
        settings["passes"] = passes
    ptxas = parse_ptxas_options(environ.get(PTXAS_OPTIONS, ""))
    if ptxas:
        settings["ptxas"] = ptxas
    return settings


def log_level(environ: Mapping[str, str] | None = None) -> str | None:
    """``TRITONPATCH_LOG``: None when unset, else one of :data:`LOG_LEVELS`."""
    environ = os.environ if environ is None else environ
    value = environ.get(LOG, "")
    level = value.strip().lower()
    if not level:
        return None
    if level not in LOG_LEVELS:
        raise _bad(LOG, value, value.strip(), "one of " + ", ".join(LOG_LEVELS))
    return level


def strict(environ: Mapping[str, str] | None = None) -> bool:
    """``TRITONPATCH_STRICT``: a failing IR pass raises instead of falling back with a warning."""
    return parse_bool(STRICT, environ)


def compile_threads(environ: Mapping[str, str] | None = None) -> int:
    """``TRITONPATCH_COMPILE_THREADS``: how many forked worker processes (and threads loading their
    results) ``tritonpatch.kernels`` compiles its tuning candidates in (unset: the CPU count, at most 16;
    ``1``: one after the other, in this process)."""
    environ = os.environ if environ is None else environ
    value = environ.get(COMPILE_THREADS, "")
    if not value.strip():
        return min(os.cpu_count() or 1, 16)
    # ASCII digits only: str.isdigit() accepts '²', which int() refuses.
    digits = value.strip()
    if not _ASCII_DIGITS.match(digits) or len(digits) > 4 or not 1 <= int(digits) <= MAX_COMPILE_THREADS:
        raise _bad(COMPILE_THREADS, value, digits, f"a positive integer (at most {MAX_COMPILE_THREADS})")
    return int(digits)


def tuning_cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """``TRITONPATCH_TUNING_CACHE``: the directory for the attention tuners' decisions (unset:
    ``~/.cache/tritonpatch/tuning``), or None for ``0/off/false/no`` (decisions stay in memory).
    ``1/true/yes/on`` are refused rather than taken as a directory of that name (write ``./1`` for
    one); so is a NUL character, which no path can hold."""
    environ = os.environ if environ is None else environ
    raw = environ.get(TUNING_CACHE, "")
    value = raw.strip()
    if not value:
        return os.path.join(os.path.expanduser("~"), ".cache", "tritonpatch", "tuning")
    flag = bool_word(value)
    if flag is False:
        return None
    if flag is True:
        raise _bad(TUNING_CACHE, raw, value, f"a directory, or 0 to keep tuning decisions in memory only "
                                             f"(for a directory named {value!r}, write ./{value})")
    if "\0" in value:
        raise _bad(TUNING_CACHE, raw, value, "a directory path (no NUL characters), or 0")
    return value


def fast_launch(environ: Mapping[str, str] | None = None) -> bool:
    """``TRITONPATCH_FAST_LAUNCH`` (default on): ``tritonpatch.kernels`` replays a call's kernel launches
    on later calls with the same shapes and options instead of binding every argument through Triton's
    JIT again; ``0`` turns that off (every launch goes through ``kernel[grid](...)``)."""
    environ = os.environ if environ is None else environ
    if not environ.get(FAST_LAUNCH, "").strip():
        return True
    return parse_bool(FAST_LAUNCH, environ)


VARIABLES = (DISABLE_LSR, LLVM_OPTIONS, PASSES, PTXAS_OPTIONS, LOG, STRICT, AUTOLOAD, COMPILE_THREADS, TUNING_CACHE,
             FAST_LAUNCH)
_TEST_PREFIX = "TRITONPATCH_TEST_"   # reserved for the test suite's own switches


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per set ``TRITONPATCH_*`` variable that tritonpatch does not read (a misspelling would
    otherwise leave the program unpatched without a word), with the closest known name."""
    import difflib

    environ = os.environ if environ is None else environ
    lines = []
    for name in sorted(environ):
        if name.startswith("TRITONPATCH_") and name not in VARIABLES and not name.startswith(_TEST_PREFIX):
            prefix = len("TRITONPATCH_")   # compared without the prefix they all share
            close = difflib.get_close_matches(name[prefix:], [known[prefix:] for known in VARIABLES], n=1)
            hint = (f"; did you mean TRITONPATCH_{close[0]}?" if close else
                    f"; the variables are {', '.join(VARIABLES)}")
            lines.append(f"{name} is not a tritonpatch variable and is ignored{hint}")
    return lines


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Parse every ``TRITONPATCH_*`` variable now; the first malformed one raises
    :class:`PipelineError`. (LLVM option names and pass names are checked against Triton's LLVM and
    the pass registry later, when the Pipeline is built.)"""
    environ = os.environ if environ is None else environ
    pipeline_settings(environ)
    log_level(environ)
    strict(environ)
    parse_bool(AUTOLOAD, environ)
    compile_threads(environ)
    tuning_cache_dir(environ)
    fast_launch(environ)
