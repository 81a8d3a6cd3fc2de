"""IR passes that run after Triton's own ``ttir`` / ``ttgir`` stages.

A pass is a named rewrite of the module's textual IR, registered with the stage it follows and the
options it accepts. :func:`run_stage_passes` runs the passes of one stage in order, re-parses the
result with Triton and verifies it; if any pass raises or its output does not verify, the stage
keeps the unpatched module and emits one warning (or raises :class:`~tritonpatch.errors.PassError`
in strict mode), so a pass can never miscompile quietly.

A pass spec is ``(name, ((key, value), ...))`` with option pairs sorted by key: hashable, so a
Pipeline can hold it and fingerprint it. Text form: ``"name"`` or ``"name(key=value,key=value)"``.

Each registration carries a digest of its implementation (:func:`implementation_digest`), which
joins the cache key of every Pipeline naming the pass: a pass re-registered with other code under
the same name never gets the artifact the old one built.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import logging
import os
import sys
import tempfile
import types
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from ..env import bool_word, quote
from ..errors import PassError, PipelineError

PassSpec = tuple[str, tuple[tuple[str, object], ...]]
STAGES = ("ttir", "ttgir")

logger = logging.getLogger("tritonpatch.passes")


@dataclass(frozen=True)
class PassOption:
    """One option of a pass: its type (bool, int, float or str), default and meaning."""
    type: type
    default: Any
    help: str


@dataclass(frozen=True)
class PassInfo:
    """A registered pass. ``run(text, options) -> (new_text, counts)`` rewrites the module's IR
    text; ``counts`` says what changed (e.g. ``{"loops_split": 1}``), all zero when nothing did."""
    name: str
    stage: str
    description: str
    options: Mapping[str, PassOption]
    run: Callable[[str, Mapping[str, Any]], tuple[str, dict[str, int]]]
    order: int = 0
    digest: str = ""  # identifies the implementation and its registration (stage, order, option defaults)


@dataclass
class PassReport:
    """What one pass did to one module: the stage, the kernel, the counts, the pass's notes (why it
    left a loop or a select as it is, see :func:`note`), and whether the stage's result was kept
    (False when the stage fell back to the unpatched IR)."""
    name: str
    stage: str
    kernel: str
    counts: dict[str, int] = field(default_factory=dict)
    kept: bool = True
    notes: tuple[str, ...] = ()


_REGISTRY: dict[str, PassInfo] = {}
_IMPLEMENTATION_TAGS: dict[tuple, str] = {}  # pass specs -> implementation_tag(specs); cleared on (un)registering
generation = 0  # counts registrations and removals: cached cache tags are stale once it moves
_COLLECTORS: contextvars.ContextVar[tuple[list, ...]] = contextvars.ContextVar("tritonpatch_pass_reports", default=())
_NOTES: contextvars.ContextVar[list | None] = contextvars.ContextVar("tritonpatch_pass_notes", default=None)


def note(message: str) -> None:
    """Called by a running pass: say why it left a loop or a select as it is (or what limited it).
    The message joins that pass's :class:`PassReport` ``notes`` and is logged with the kernel's name
    (logger ``tritonpatch.passes``, INFO: ``TRITONPATCH_LOG=info``). Outside a pass run it is only
    logged."""
    notes = _NOTES.get()
    if notes is None:
        logger.info("%s", message)
    else:
        notes.append(message)


def register_pass(name: str, stage: str, description: str, options: Mapping[str, PassOption] | None = None,
                  order: int = 0, version: str | None = None):
    """Decorator registering ``run(text, options) -> (text, counts)`` as pass ``name``. Within a
    stage, passes run in ascending ``order`` and, for equal order, in the order they were given
    (``skip-masked-blocks`` must see the loop before ``elide-uniform-masks`` restructures it).

    The cache keys of compiles with the pass follow :func:`implementation_digest` of ``run``
    (its code, defaults and closure, and the source file of its module) and the registration's
    stage, order and option defaults. Code it calls in *other*
    modules is not covered: give such a pass a ``version`` string and change it whenever that code
    changes (``version`` is required when ``run`` is not a plain function)."""
    if stage not in STAGES:
        raise ValueError(f"pass {name!r}: stage must be one of {STAGES}, got {stage!r}")
    if version is not None and not isinstance(version, str):
        raise ValueError(f"pass {name!r}: version= takes a string, got {version!r}")

    def decorate(run):
        if name in _REGISTRY:
            raise ValueError(f"a pass named {name!r} is already registered")
        if not isinstance(run, types.FunctionType) and version is None:
            raise ValueError(f"pass {name!r}: {run!r} is not a plain function, so its code cannot join the cache "
                             "keys; register it with version='...' and change the version whenever the pass changes")
        info = PassInfo(name, stage, description, dict(options or {}), run, order,
                        _registration_digest(run, version, stage, order, options or {}))
        _REGISTRY[name] = info
        _registry_changed()
        return run
    return decorate


def unregister_pass(name: str) -> None:
    """Remove a pass registered with :func:`register_pass` (tests and experiments)."""
    _REGISTRY.pop(name, None)
    _registry_changed()


def _registry_changed() -> None:
    global generation
    _IMPLEMENTATION_TAGS.clear()
    generation += 1


def implementation_digest(run: Callable, version: str | None = None) -> str:
    """sha256 identifying a pass implementation: ``version``, and for a plain function its module
    and name, its code objects (bytecode, names, constants, nested functions), its defaults, its
    closure's values, and the bytes of its module's source file. Stable across processes for the
    same code and Python version. Values it cannot read into (instances of other classes) count by
    their type only."""
    digest = hashlib.sha256(f"version={version!r}\0".encode())
    if isinstance(run, types.FunctionType):
        _digest_function(digest, run, set())
    else:
        digest.update(f"{type(run).__module__}.{type(run).__qualname__}".encode())
    return digest.hexdigest()


def _registration_digest(run: Callable, version: str | None, stage: str, order: int,
                         options: Mapping[str, PassOption]) -> str:
    """:func:`implementation_digest` plus the rest of a registration that decides what a compile
    gets: the stage and order the pass runs at, and its options' types and defaults (a Pipeline
    names only the options it sets; the others take the registered defaults when the pass runs)."""
    defaults = {key: [option.type.__name__, repr(option.default)] for key, option in sorted(options.items())}
    settings = {"stage": stage, "order": order, "options": defaults}
    payload = json.dumps(settings, sort_keys=True)
    return hashlib.sha256(f"{implementation_digest(run, version)}\0{payload}".encode()).hexdigest()


def _digest_function(digest, function: types.FunctionType, seen: set) -> None:
    if id(function) in seen:  # recursion through a closure or a default
        digest.update(b"<seen>")
        return
    seen.add(id(function))
    digest.update(f"function {function.__module__}.{function.__qualname__}\0".encode())
    _digest_code(digest, function.__code__, seen)
    _digest_value(digest, function.__defaults__, seen)
    _digest_value(digest, function.__kwdefaults__, seen)
    for cell in function.__closure__ or ():
        try:
            _digest_value(digest, cell.cell_contents, seen)
        except ValueError:  # an empty cell
            digest.update(b"<empty cell>")
    path = getattr(sys.modules.get(function.__module__), "__file__", None)
    if path:
        try:
            with open(path, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
        except OSError:
            digest.update(b"<unreadable module source>")


def _digest_code(digest, code: types.CodeType, seen: set) -> None:
    digest.update(b"code\0" + code.co_code)
    for names in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        digest.update(("\0".join(names) + "\1").encode())
    for constant in code.co_consts:
        _digest_value(digest, constant, seen)


def _digest_value(digest, value: Any, seen: set) -> None:
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        digest.update(f"{type(value).__name__}:{value!r}\0".encode())
    elif isinstance(value, (tuple, list)):
        digest.update(f"{type(value).__name__}[".encode())
        for item in value:
            _digest_value(digest, item, seen)
        digest.update(b"]")
    elif isinstance(value, (frozenset, set, dict)):  # iteration order may follow the hash seed: sort
        items = value.items() if isinstance(value, dict) else ((item,) for item in value)
        parts = []
        for item in items:
            part = hashlib.sha256()
            _digest_value(part, tuple(item), seen)
            parts.append(part.hexdigest())
        digest.update(f"{type(value).__name__}{{{','.join(sorted(parts))}}}".encode())
    elif isinstance(value, types.CodeType):
        _digest_code(digest, value, seen)
    elif isinstance(value, types.FunctionType):
        _digest_function(digest, value, seen)
    else:
        digest.update(f"<{type(value).__module__}.{type(value).__qualname__}>".encode())


def implementation_tag(specs: Sequence[PassSpec]) -> str:
    """``-`` and 16 hex digits over the implementations registered now under the passes of
    ``specs`` (part of a Pipeline's cache tag; memoized until a pass is registered or removed)."""
    tag = _IMPLEMENTATION_TAGS.get(specs)
    if tag is None:
        digest = hashlib.sha256()
        for name in sorted({spec[0] for spec in specs}):
            digest.update(f"{name}\0{pass_info(name).digest}\0".encode())
        tag = _IMPLEMENTATION_TAGS[specs] = f"-{digest.hexdigest()[:16]}"
    return tag


def available_passes() -> dict[str, str]:
    """Name -> one-line description of every registered pass."""
    _load_builtin_passes()
    return {name: info.description for name, info in sorted(_REGISTRY.items())}


def pass_info(name: str) -> PassInfo:
    """The registration of pass ``name``; PipelineError naming the known passes if there is none."""
    _load_builtin_passes()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PipelineError(f"unknown pass {quote(name)}; known passes: {', '.join(sorted(_REGISTRY)) or '(none)'}") from None


def pass_stage(name: str) -> str:
    """``"ttir"`` or ``"ttgir"``: the Triton stage after which pass ``name`` runs."""
    return pass_info(name).stage


def _coerce(pass_name: str, key: str, option: PassOption, value: Any) -> Any:
    """``value`` converted to the option's type (strings from the text form are parsed)."""
    if option.type is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and bool_word(value) is not None:
            return bool_word(value)
    elif option.type in (int, float):
        if isinstance(value, option.type) and not isinstance(value, bool):
            return value
        if option.type is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return option.type(value.strip())
            except ValueError:
                pass
    elif option.type is str and isinstance(value, str):
        return value
    raise PipelineError(f"pass {pass_name!r}: option {key}={quote(value)} is not a valid {option.type.__name__} "
                        f"({option.help})")


def validate_pass_spec(name: str, options: Mapping[str, Any] | None = None) -> PassSpec:
    """Check pass ``name`` and its ``options`` (keys may use ``-`` or ``_``); return the spec with
    every option present only when given, values converted, pairs sorted by key."""
    info = pass_info(name)
    pairs = {}
    for raw_key, value in (options or {}).items():
        key = str(raw_key).strip().replace("-", "_")
        if key not in info.options:
            known = ", ".join(sorted(info.options)) or "(none)"
            raise PipelineError(f"pass {name!r} has no option {quote(raw_key)}; its options: {known}")
        pairs[key] = _coerce(name, key, info.options[key], value)
    return name, tuple(sorted(pairs.items()))


def parse_pass_spec(text: str) -> PassSpec:
    """Parse ``"name"`` or ``"name(key=value,key=value)"`` into a validated PassSpec."""
    if not isinstance(text, str) or not text.strip():
        raise PipelineError(f"empty pass spec {quote(text)}; known passes: {', '.join(available_passes())}")
    text = text.strip()
    name, options = text, {}
    if "(" in text:
        if not text.endswith(")"):
            raise PipelineError(f"malformed pass spec {quote(text)}: expected 'name(key=value,...)'")
        name, body = text[:-1].split("(", 1)
        name = name.strip()
        for token in filter(None, (t.strip() for t in body.split(","))):
            key, sep, value = token.partition("=")
            if not sep or not key.strip():
                raise PipelineError(f"malformed option {quote(token)} in pass spec {quote(text)}: expected key=value")
            options[key.strip()] = value.strip()
    return validate_pass_spec(name, options)


def resolved_options(spec: PassSpec) -> dict[str, Any]:
    """Every option of the spec's pass: defaults overridden by the spec's pairs."""
    info = pass_info(spec[0])
    values = {key: opt.default for key, opt in info.options.items()}
    values.update(dict(spec[1]))
    return values


@contextlib.contextmanager
def collect_reports() -> Iterator[list[PassReport]]:
    """Collect a :class:`PassReport` for every pass run in this context (thread / task local)."""
    reports: list[PassReport] = []
    token = _COLLECTORS.set(_COLLECTORS.get() + (reports,))
    try:
        yield reports
    finally:
        _COLLECTORS.reset(token)


def _kernel_name(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("tt.func"):
            return stripped.split("@", 1)[1].split("(", 1)[0] if "@" in stripped else "?"
    return "?"


def parse_module(text: str, context):
    """Parse IR text with Triton in ``context`` and verify it; returns the new ``ir.module``."""
    from .._triton_compat import parse_mlir_file

    fd, path = tempfile.mkstemp(suffix=".mlir", prefix="tritonpatch_")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        module = parse_mlir_file(path, context)
    finally:
        os.unlink(path)
    module.context = context
    if not module.verify():
        raise PassError("the rewritten module does not verify")
    return module


@dataclass
class StageOutcome:
    """What :func:`apply_stage_passes` did to one stage's module: the module to hand on (the
    rewritten one, or the input itself when nothing changed or the stage fell back), the reports,
    and the warning given when the stage fell back to its unpatched IR."""
    module: Any
    reports: list[PassReport]
    fallback: str | None = None


def apply_stage_passes(stage: str, module, specs: Sequence[PassSpec], *, strict: bool) -> StageOutcome:
    """Run the passes of ``specs`` that follow ``stage`` (in the given order, stably sorted by each
    pass's ``order``) on ``module`` (the output of Triton's ``make_<stage>``). The outcome's module
    is the re-parsed, verified result, or ``module`` itself when no pass changed anything. On
    failure: one warning and ``module`` unchanged, or :class:`PassError` when ``strict``."""
    selected = sorted((spec for spec in specs if pass_stage(spec[0]) == stage), key=lambda s: pass_info(s[0]).order)
    if not selected:
        return StageOutcome(module, [])
    original = module.str()
    kernel = _kernel_name(original)
    text, reports, changed = original, [], False
    try:
        for spec in selected:
            info = pass_info(spec[0])
            try:
                notes: list[str] = []
                token = _NOTES.set(notes)
                try:
                    new_text, counts = info.run(text, resolved_options(spec))
                finally:
                    _NOTES.reset(token)
            except Exception as exc:  # noqa: BLE001 - any failure of a pass means: fall back
                raise PassError(f"pass {info.name!r} failed on kernel {kernel!r}: {type(exc).__name__}: {exc}") from exc
            reports.append(PassReport(info.name, stage, kernel, dict(counts), notes=tuple(notes)))
            if new_text != text:
                try:
                    parse_module(new_text, module.context)
                except Exception as exc:  # noqa: BLE001
                    raise PassError(f"pass {info.name!r} produced IR that Triton rejects on kernel {kernel!r}: "
                                    f"{type(exc).__name__}: {exc}") from exc
                text, changed = new_text, True
        result = parse_module(text, module.context) if changed else module
    except PassError as exc:
        for report in reports:
            report.kept = False
        _publish(reports)
        if strict:
            raise
        message = f"tritonpatch: {exc}; using the unpatched {stage} IR"
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return StageOutcome(module, reports, message)
    _publish(reports)
    return StageOutcome(result, reports)


def run_stage_passes(stage: str, module, specs: Sequence[PassSpec], *, strict: bool):
    """:func:`apply_stage_passes`, returning only the module to hand on."""
    return apply_stage_passes(stage, module, specs, strict=strict).module


def _publish(reports: list[PassReport]) -> None:
    for report in reports:
        logger.info("pass %s (%s) on %s: %s%s", report.name, report.stage, report.kernel,
                    ", ".join(f"{k}={v}" for k, v in sorted(report.counts.items())) or "no change",
                    "" if report.kept else " (discarded: stage fell back)")
        for message in report.notes:
            logger.info("%s: %s (kernel %s)", report.name, message, report.kernel)
        for collector in _COLLECTORS.get():
            collector.append(report)


_BUILTINS_LOADED = False


def _load_builtin_passes() -> None:
    """Import the modules that register the built-in passes (once, lazily: no cycle at import)."""
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        from . import builtin  # noqa: F401


@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    """sha256 of the built-in passes' source files: it joins the cache key of every Pipeline with
    passes, so an edited pass recompiles even where the package version stays the same."""
    digest = hashlib.sha256()
    folder = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".py")):
        with open(os.path.join(folder, name), "rb") as handle:
            digest.update(name.encode() + b"\0" + handle.read())
    return digest.hexdigest()


__all__ = ["PassSpec", "PassOption", "PassInfo", "PassReport", "STAGES", "register_pass", "unregister_pass",
           "note", "available_passes", "pass_info", "pass_stage", "parse_pass_spec", "validate_pass_spec",
           "resolved_options", "collect_reports", "StageOutcome", "apply_stage_passes", "run_stage_passes",
           "parse_module", "source_digest", "implementation_digest", "implementation_tag"]
