"""The ``TRITONPATCH_*`` environment variables, parsed into Pipeline settings.

Unmodified programs (a training script, ``torch.compile``'s compile workers) reach tritonpatch only
through these variables. Parsing is pure (it takes a mapping) so that it can be tested without
touching ``os.environ``; a malformed value raises :class:`PipelineError` naming the variable and the
offending token.

    TRITONPATCH_DISABLE_LSR=1                        llvm option disable-lsr=true
    TRITONPATCH_LLVM_OPTIONS="disable-lsr,unroll-threshold=50"   ``name`` or ``name=value``, comma separated
    TRITONPATCH_PASSES="hoist-masks,skip-blocks(mode=exact)"     pass specs, comma separated
    TRITONPATCH_PTXAS_OPTIONS="--maxrregcount=200 -O3"           whitespace separated, like Triton's PTXAS_OPTIONS
    TRITONPATCH_LOG=info|debug                       log which Pipeline each kernel compiled with
    TRITONPATCH_STRICT=1                             a failing IR pass raises instead of falling back
    TRITONPATCH_AUTOLOAD=1                           activate at interpreter start (see _autoload)
    TRITONPATCH_COMPILE_THREADS=N                    threads the attention tuners compile candidates on
    TRITONPATCH_TUNING_CACHE=DIR|0                   where the attention tuners keep decisions (0: memory only)
    TRITONPATCH_FAST_LAUNCH=0                        attention kernels launch through Triton's JIT every call
"""
from __future__ import annotations

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

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_LLVM_NAME = re.compile(r"^-{0,2}[A-Za-z0-9][A-Za-z0-9_.$-]*$")


def _bad(variable: str, value: str, token: str, expected: str) -> PipelineError:
    return PipelineError(f"{variable}={value!r}: bad token {token!r}; expected {expected}")


def parse_bool(variable: str, environ: Mapping[str, str] | None = None) -> bool:
    """``1/true/yes/on`` -> True, unset or ``0/false/no/off/''`` -> False; anything else raises."""
    environ = os.environ if environ is None else environ
    value = environ.get(variable, "")
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise _bad(variable, value, value.strip(), "1/true/yes/on or 0/false/no/off")


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
    """Whitespace separated ptxas flags, each ``-flag`` or ``-flag=value``."""
    tokens = value.split()
    for token in tokens:
        if not token.startswith("-") or token in ("-", "--"):
            raise _bad(variable, value, token, "ptxas flags such as --maxrregcount=128 (one token each, no spaces)")
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
    """``TRITONPATCH_COMPILE_THREADS``: how many threads ``tritonpatch.kernels`` compiles its tuning
    candidates on (unset: the CPU count, at most 16; ``1``: one after the other)."""
    environ = os.environ if environ is None else environ
    value = environ.get(COMPILE_THREADS, "")
    if not value.strip():
        return min(os.cpu_count() or 1, 16)
    if not value.strip().isdigit() or int(value) < 1:
        raise _bad(COMPILE_THREADS, value, value.strip(), "a positive integer")
    return int(value)


def tuning_cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """``TRITONPATCH_TUNING_CACHE``: the directory for the attention tuners' decisions (unset:
    ``~/.cache/tritonpatch/tuning``), or None for ``0/off/false/no`` (decisions stay in memory)."""
    environ = os.environ if environ is None else environ
    value = environ.get(TUNING_CACHE, "").strip()
    if not value:
        return os.path.join(os.path.expanduser("~"), ".cache", "tritonpatch", "tuning")
    return None if value.lower() in _FALSE else value


def fast_launch(environ: Mapping[str, str] | None = None) -> bool:
    """``TRITONPATCH_FAST_LAUNCH`` (default on): ``tritonpatch.kernels`` replays a call's kernel launches
    on later calls with the same shapes and options instead of binding every argument through Triton's
    JIT again; ``0`` turns that off (every launch goes through ``kernel[grid](...)``)."""
    environ = os.environ if environ is None else environ
    if not environ.get(FAST_LAUNCH, "").strip():
        return True
    return parse_bool(FAST_LAUNCH, environ)
