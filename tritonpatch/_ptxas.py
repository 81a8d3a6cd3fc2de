"""The ptxas binaries Triton runs, what their ``--help`` lists, and the checks a Pipeline's ptxas flags get
against it.

Triton ships one ptxas for older GPUs and one for newer (the same file on some versions). Each binary's
``--help`` is read once per process. ptxas spells an option ``--long-name[=value]`` or
``-short[=value]``, and ``-O`` and ``-m`` also with the value attached (``-O3``, ``-m64``). An option
that takes a value (the help shows it, as ``--fmad <true|false>``; the cache options such as
``--def-load-cache`` take one it does not show) needs it in the same token: Triton splits ptxas flags
at spaces, so a separate value would be read as the next flag (or as Triton's ``--gpu-name``). Flags
the help does not list are passed on with a warning: ptxas also takes switches its help does not show.
Where no ptxas can be run or its help not read, nothing is checked here and ptxas reports what it
does not take at compile time. (The flags tritonpatch never passes on, whatever ptxas lists, are
refused by :func:`tritonpatch.env.parse_ptxas_options`.)
"""
from __future__ import annotations

import difflib
import functools
import re
import subprocess

from . import _user_warnings as user_warnings
from .env import quote
from .errors import PipelineError

# One option of `ptxas --help`: "--long-name <value>   (-short)", the value part only where it shows one.
_HELP_LINE = re.compile(r"^--([A-Za-z][\w-]*)( <[^>]*>)?[^\n(]*(?:\(-([A-Za-z][\w-]*)\))?", re.MULTILINE)
_REGISTER_CAP_FLAGS = frozenset({"--maxrregcount", "-maxrregcount"})
_OVERRIDE_DIRECTIVES_FLAGS = frozenset({"--override-directive-values", "-override-directive-values"})
# The cache options take a value (cg, ca, ...) that ptxas --help does not show beside them.
_UNSHOWN_VALUE = frozenset({"def-load-cache", "def-store-cache", "force-load-cache", "force-store-cache"})
_ATTACHED_VALUE = ("-O", "-m")   # the options ptxas also takes with a number attached: -O3, -m64
_warned: set = set()   # the flags warned about in this process


def ptxas_path(capability: int) -> str:
    """The ptxas Triton uses for ``sm_<capability>`` (Triton ships one for older GPUs and one for newer)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(capability).path


@functools.lru_cache(maxsize=None)
def help_text(path: str) -> str | None:
    """``path --help``'s output, None when ptxas cannot be run."""
    try:
        return subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


@functools.lru_cache(maxsize=None)
def gpu_capabilities(path: str) -> tuple[int, ...]:
    """The ``sm_NN`` that ``path --help`` lists for ``--gpu-name`` (empty if ptxas cannot be asked)."""
    return tuple(sorted({int(n) for n in re.findall(r"'sm_(\d+)a?'", help_text(path) or "")}))


@functools.lru_cache(maxsize=None)
def _spellings(paths: tuple[str, ...]) -> dict[str, tuple[str, str | None]] | None:
    """Every spelling (``--long``, ``-short``) of an option the ptxas binaries ``paths`` list, to
    ``(long name, value placeholder or None)``; None when no help could be read (no ``--help`` line)."""
    spellings = {}
    for path in paths:
        options = [(m.group(1), m.group(3), m.group(2) and m.group(2).strip())
                   for m in _HELP_LINE.finditer(help_text(path) or "")]
        if not any(long == "help" for long, _, _ in options):
            continue
        for long, short, placeholder in options:
            placeholder = placeholder or ("<mode>" if long in _UNSHOWN_VALUE else None)
            spellings[f"--{long}"] = (long, placeholder)
            if short:
                spellings[f"-{short}"] = (long, placeholder)
    return spellings or None


def listed_spellings() -> dict[str, tuple[str, str | None]] | None:
    """:func:`_spellings` of the ptxas binaries Triton runs (for older GPUs and for newer) that can be
    found; None when none can be asked (no Triton, no ptxas, a help this does not read)."""
    paths = set()
    for capability in (80, 100):
        try:
            paths.add(ptxas_path(capability))
        except (ImportError, RuntimeError, OSError):   # no Triton, or no ptxas for these GPUs
            continue
    return _spellings(tuple(sorted(paths))) if paths else None


def check_flags(tokens) -> None:
    """:func:`check_flag` of each of ``tokens``, then :func:`warn_on_ignored_register_cap`."""
    for token in tokens:
        check_flag(token)
    warn_on_ignored_register_cap(tokens)


def check_flag(token: str) -> None:
    """Check one ptxas flag token (of the form :func:`tritonpatch.env.parse_ptxas_options` accepts)
    against the options Triton's ptxas lists: a :class:`PipelineError` for a listed option missing
    the value it takes; a warning, once per process and flag, for a flag the help does not list
    (naming the close ones)."""
    spellings = listed_spellings()
    if not spellings:
        return
    name, equals, _ = token.partition("=")
    option = spellings.get(name)
    has_value = bool(equals)
    if option is None and name[:2] in _ATTACHED_VALUE and name[2:].isdigit():
        option, has_value = spellings.get(name[:2]), True
    if option is None:
        close = difflib.get_close_matches(name, spellings, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        _warn_once(token, f"tritonpatch: ptxas flag {quote(token)} is not among the options Triton's ptxas "
                          f"lists in its --help{hint}; it is passed on as given, and ptxas reports it at "
                          "compile time if it does not take it")
    elif option[1] and not has_value:
        raise PipelineError(f"ptxas flag {quote(token)}: --{option[0]} takes a value {option[1]} in the same "
                            f"token: {name}=VALUE (Triton splits ptxas flags at spaces, so a separate value "
                            "would be read as the next flag)")


def warn_on_ignored_register_cap(tokens) -> None:
    """Warn when ``tokens`` cap registers with ``--maxrregcount=N`` without
    ``--override-directive-values``: Triton's PTX declares launch bounds (``.reqntid`` from num_warps,
    ``.maxnreg`` from its ``maxnreg`` option), and ptxas allocates registers by those directives (ptxas
    12.8, sm_90a: ``--maxrregcount=32`` leaves a 166-register kernel at 166; with
    ``--override-directive-values`` ptxas applies the cap), so the flag alone would do nothing without
    a word. Said when the Pipeline is made, not in the compile: a cache hit compiles nothing. Each
    Pipeline is judged alone: an ``--override-directive-values`` in another layer of the blocks in
    effect (an outer ``options()``, ``TRITONPATCH_PTXAS_OPTIONS``) does not silence it."""
    if any(token.split("=", 1)[0] in _OVERRIDE_DIRECTIVES_FLAGS for token in tokens):
        return
    for token in tokens:
        name, _, value = token.partition("=")
        if name in _REGISTER_CAP_FLAGS and value.isdigit():
            _warn_once(token, f"tritonpatch: ptxas does not cap registers with {token} on Triton's kernels: "
                              "their PTX declares launch bounds (.reqntid, and .maxnreg under Triton's maxnreg "
                              "option), which ptxas follows instead; to cap registers use Triton's maxnreg "
                              "launch option (kernel[grid](..., maxnreg=N) or triton.Config(..., maxnreg=N)), or "
                              "add --override-directive-values to the ptxas flags")


def _warn_once(token: str, message: str) -> None:
    """Warn about ``token`` unless this process has already been told (a warning turned into an
    error, or caught, counts only once it was given)."""
    if token not in _warned:
        user_warnings.warn(message)
        _warned.add(token)
