"""Pipelines: what a compile should change (LLVM options, IR passes, ptxas options), and which
Pipeline is in effect for the compile happening now.

Precedence, most specific first: a per-kernel Pipeline (:func:`use_pipeline`, used by
``tritonpatch.jit``) replaces everything; otherwise the innermost :func:`options` block, merged key
by key over the enclosing blocks, over the process-wide layer of ``tritonpatch.llvm.set_option``
and over the ``TRITONPATCH_*`` environment variables; otherwise Triton's defaults (the empty
Pipeline, which changes nothing).

The blocks live in :mod:`contextvars`, so threads and asyncio tasks do not see each other's
settings, and resolving the effective Pipeline is O(1) (Triton 3.7+ asks for it on every kernel
launch).
"""
from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import json
import os
import threading
from typing import Any, Iterable, Mapping

from . import __version__, env
from .errors import NativeUnavailableError, OptionTypeError, PipelineError, UnknownOptionError

__all__ = ["Pipeline", "options", "use_pipeline", "current_pipeline", "environment_pipeline"]

_FINGERPRINT_VERSION = "tritonpatch-pipeline-1"
# _strict_setting() is the raw TRITONPATCH_STRICT value (or None), which a memoized cache tag of a
# Pipeline with passes is checked against on every launch of such a kernel: through os.environ's own
# dict (POSIX: bytes keys) that costs ~40 ns, where os.environ.get of an unset variable costs ~1 us
# (it raises and catches KeyError).
if hasattr(os.environ, "_data"):
    _strict_setting = functools.partial(os.environ._data.get, os.environ.encodekey(env.STRICT))
else:  # pragma: no cover - not CPython on POSIX
    _strict_setting = functools.partial(os.environ.get, env.STRICT)
_JSON_SCALARS = (bool, int, float, str, type(None))


def _canonical_value(value: Any, where: str) -> Any:
    """A JSON-representable copy of a pass-option value, so the fingerprint is stable."""
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, (tuple, list)):
        return [_canonical_value(v, where) for v in value]
    raise PipelineError(f"{where}: value {value!r} of type {type(value).__name__} cannot be fingerprinted; "
                        "use bool, int, float, str, None or a tuple of those")


def _normalize_llvm(settings: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    from . import llvm

    normalized = {}
    for name, value in settings.items():
        if not isinstance(name, str) or not name.lstrip("-"):
            raise PipelineError(f"LLVM option names are non-empty strings, got {name!r}")
        canonical = name.lstrip("-")
        normalized[canonical] = llvm.normalize_value(canonical, value)
    return tuple(sorted(normalized.items()))


def _normalize_passes(passes: Iterable[Any] | Mapping[str, Any]) -> tuple:
    if isinstance(passes, Mapping):
        items = []
        for name, opts in passes.items():
            if opts is not None and not isinstance(opts, Mapping):
                raise PipelineError(f"passes={{{name!r}: {opts!r}}}: the options of a pass are a mapping of "
                                    "option name to value (or None for the defaults)")
            items.append((name, opts or {}))
        passes = items
    elif isinstance(passes, (str, bytes)) or not isinstance(passes, Iterable):
        raise PipelineError(f"passes= takes a list of pass specs or a mapping of pass name to options, got {passes!r}")
    try:
        from .passes import parse_pass_spec, validate_pass_spec
    except ImportError as exc:
        raise PipelineError(f"IR passes are unavailable in this installation ({exc})") from exc
    specs = []
    for item in passes:
        if isinstance(item, str):
            spec = parse_pass_spec(item)
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            opts = item[1]
            spec = validate_pass_spec(item[0], dict(opts.items() if isinstance(opts, Mapping) else opts))
        else:
            raise PipelineError(f"a pass spec is 'name', 'name(key=value,...)' or (name, {{options}}), got {item!r}")
        for key, value in spec[1]:
            _canonical_value(value, f"pass {spec[0]!r} option {key!r}")
        specs.append(spec)
    return _merge_by_key(specs, key=lambda spec: spec[0])


def _ptxas_key(token: str) -> str:
    return token.split("=", 1)[0]


def _normalize_ptxas(flags: Iterable[str]) -> tuple[str, ...]:
    if isinstance(flags, str) or not isinstance(flags, Iterable):
        raise PipelineError(f"ptxas= takes a list of flags such as ['--def-load-cache=cg'], got {flags!r}")
    tokens = []
    for flag in flags:
        if not isinstance(flag, str):
            raise PipelineError(f"ptxas flags are strings, got {flag!r}")
        tokens.extend(env.parse_ptxas_options(flag, variable="ptxas="))
    return tuple(tokens)


def _merge_by_key(items: Iterable, key) -> tuple:
    """Later items replace earlier ones with the same key, keeping the first one's position."""
    merged: dict = {}
    for item in items:
        merged[key(item)] = item
    return tuple(merged.values())


class Pipeline:
    """A frozen, hashable compile configuration.

    ``Pipeline(disable_lsr=True, llvm={"unroll-threshold": 50}, passes=["hoist-masks"],
    ptxas=["--def-load-cache=cg"])``. LLVM option names and values are validated against the LLVM
    inside Triton (``tritonpatch.llvm``); pass specs against the pass registry (``passes=`` is a
    list of specs, or a mapping of pass name to its options); ptxas flags must each be one
    ``-flag`` or ``-flag=value`` token. The canonical form sorts LLVM options by name
    and keeps pass and ptxas order (order can matter there). ``Pipeline()`` changes nothing.
    """

    __slots__ = ("llvm", "passes", "ptxas", "_fingerprint", "_hash", "_tag", "_pass_tag")

    def __init__(self, *, disable_lsr: bool | None = None, llvm: Mapping[str, Any] | None = None,
                 passes: Iterable[Any] | Mapping[str, Any] = (), ptxas: Iterable[str] = ()):
        if llvm is not None and not isinstance(llvm, Mapping):
            raise PipelineError(f"llvm= takes a mapping of option name to value, got {llvm!r}")
        settings = dict(llvm or {})
        if disable_lsr is not None:
            if not isinstance(disable_lsr, bool):
                raise PipelineError(f"disable_lsr= takes True or False, got {disable_lsr!r}")
            clash = [k for k in settings if k.lstrip("-") == "disable-lsr"]
            if clash:
                raise PipelineError("disable-lsr given twice (disable_lsr= and llvm=); use one of them")
            settings["disable-lsr"] = disable_lsr
        self._init(_normalize_llvm(settings) if settings else (), _normalize_passes(passes),
                   _normalize_ptxas(ptxas))

    @classmethod
    def _from_canonical(cls, llvm: tuple, passes: tuple, ptxas: tuple) -> "Pipeline":
        pipeline = cls.__new__(cls)
        pipeline._init(llvm, passes, ptxas)
        return pipeline

    def _init(self, llvm: tuple, passes: tuple, ptxas: tuple) -> None:
        set_ = object.__setattr__
        set_(self, "llvm", llvm)
        set_(self, "passes", passes)
        set_(self, "ptxas", ptxas)
        payload = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        set_(self, "_fingerprint", hashlib.sha256(f"{_FINGERPRINT_VERSION}:{payload}".encode()).hexdigest()[:32])
        set_(self, "_hash", hash((llvm, passes, ptxas)))
        tag = f"-tritonpatch-{__version__}-{self._fingerprint}" if (llvm or passes or ptxas) else ""
        if passes:
            from .passes import source_digest

            tag += f"-{source_digest()[:16]}"
        set_(self, "_tag", tag)
        set_(self, "_pass_tag", (None, None, tag))  # (pass registry generation, TRITONPATCH_STRICT, cache tag)

    def __setattr__(self, name, value):
        raise AttributeError("Pipeline is frozen; use merge() to derive a new one")

    __delattr__ = __setattr__

    def __reduce__(self):  # pickles through the canonical form (no re-validation needed)
        return (Pipeline._from_canonical, (self.llvm, self.passes, self.ptxas))

    @property
    def cache_tag(self) -> str:
        """What joins Triton's disk and in-memory cache keys for a compile with this Pipeline.

        Nothing for an empty Pipeline (keys stay plain Triton's); otherwise the tritonpatch version
        and the fingerprint. With passes also: a digest of the built-in passes' source, a digest of
        the implementation registered now under each of the Pipeline's pass names (so a changed
        or re-registered pass recompiles), and ``-strict`` under ``TRITONPATCH_STRICT=1`` (a strict
        compile never loads an artifact a non-strict one built after its passes fell back)."""
        if not self.passes:
            return self._tag
        memo, registry = self._pass_tag, _pass_registry()
        generation, strict = registry.generation, _strict_setting()
        if memo[0] == generation and memo[1] == strict:
            return memo[2]
        tag = f"{self._tag}{registry.implementation_tag(self.passes)}{'-strict' if env.strict() else ''}"
        object.__setattr__(self, "_pass_tag", (generation, strict, tag))
        return tag

    @property
    def is_empty(self) -> bool:
        """True when the Pipeline changes nothing (Triton's behaviour and cache keys stay as they are)."""
        return not (self.llvm or self.passes or self.ptxas)

    def __bool__(self) -> bool:
        return not self.is_empty

    def merge(self, other: "Pipeline") -> "Pipeline":
        """``other`` over ``self``, key by key: LLVM options by name, passes by pass name, ptxas
        flags by the text before ``=``; an overridden pass or flag keeps its first position."""
        if not isinstance(other, Pipeline):
            raise PipelineError(f"merge() takes a Pipeline, got {other!r}")
        if other.is_empty:
            return self
        if self.is_empty:
            return other
        llvm = tuple(sorted({**dict(self.llvm), **dict(other.llvm)}.items()))
        passes = _merge_by_key(self.passes + other.passes, key=lambda spec: spec[0])
        ptxas = _merge_by_key(self.ptxas + other.ptxas, key=_ptxas_key)
        return Pipeline._from_canonical(llvm, passes, ptxas)

    def to_dict(self) -> dict:
        """The canonical form as plain JSON data."""
        return {
            "llvm": [[name, value] for name, value in self.llvm],
            "passes": [[name, [[k, _canonical_value(v, name)] for k, v in opts]] for name, opts in self.passes],
            "ptxas": list(self.ptxas),
        }

    def fingerprint(self) -> str:
        """32 hex digits identifying the canonical form; the same in every process and Python version."""
        return self._fingerprint

    def __eq__(self, other):
        if not isinstance(other, Pipeline):
            return NotImplemented
        return (self.llvm, self.passes, self.ptxas) == (other.llvm, other.passes, other.ptxas)

    def __hash__(self):
        return self._hash

    def __repr__(self):
        parts = []
        if self.llvm:
            parts.append("llvm={" + ", ".join(f"{n!r}: {v!r}" for n, v in self.llvm) + "}")
        if self.passes:
            parts.append("passes=[" + ", ".join(_pass_text(spec) for spec in self.passes) + "]")
        if self.ptxas:
            parts.append(f"ptxas={list(self.ptxas)!r}")
        return f"Pipeline({', '.join(parts)})"


def _pass_text(spec) -> str:
    name, opts = spec
    return repr(f"{name}({','.join(f'{k}={v}' for k, v in opts)})" if opts else name)


EMPTY = Pipeline._from_canonical((), (), ())


# --- the environment's Pipeline -----------------------------------------------------------------

def pipeline_from_environ(environ: Mapping[str, str]) -> Pipeline:
    """The Pipeline the ``TRITONPATCH_*`` variables in ``environ`` ask for. A bad value raises
    :class:`PipelineError` naming the variable and the token."""
    settings = env.pipeline_settings(environ)
    llvm = {}
    for name, value in settings.get("llvm", {}).items():
        variable = env.DISABLE_LSR if name == "disable-lsr" and env.DISABLE_LSR in environ else env.LLVM_OPTIONS
        token = name if value is True else f"{name}={value}"
        try:
            llvm.update(_normalize_llvm({name: value}))
        except (UnknownOptionError, OptionTypeError) as exc:
            raise PipelineError(f"{variable}={env.quote(environ.get(variable))}: bad token {env.quote(token)}: {exc}") from exc
        except NativeUnavailableError as exc:
            raise PipelineError(f"{variable} is set but LLVM options are unavailable: {exc}") from exc
    passes = []
    for text in settings.get("passes", ()):
        try:
            passes.extend(_normalize_passes([text]))
        except PipelineError as exc:
            raise PipelineError(f"{env.PASSES}={env.quote(environ.get(env.PASSES))}: bad token {env.quote(text)}: {exc}") from exc
    return Pipeline._from_canonical(tuple(sorted(llvm.items())), _merge_by_key(passes, key=lambda s: s[0]),
                                    tuple(settings.get("ptxas", ())))


_environment_lock = threading.Lock()
_environment: Pipeline | None = None


def environment_pipeline() -> Pipeline:
    """The Pipeline of this process's ``TRITONPATCH_*`` variables, read once."""
    global _environment
    if _environment is None:
        with _environment_lock:
            if _environment is None:
                _environment = pipeline_from_environ(os.environ)
    return _environment


# --- the process-wide layer (tritonpatch.llvm.set_option) ---------------------------------------

_process_lock = threading.Lock()
_process_layer: Pipeline = EMPTY
_base_memo: tuple = (object(), None, EMPTY)  # (environment, process layer, their merge); stale at first


def base_pipeline() -> Pipeline:
    """The environment's Pipeline with the process-wide layer of ``set_option`` over it: what a
    compile outside every ``options()`` block uses (O(1) until either changes)."""
    global _base_memo
    memo = _base_memo
    if memo[0] is _environment and memo[1] is _process_layer:
        return memo[2]
    environment, layer = environment_pipeline(), _process_layer
    merged = environment.merge(layer)
    _base_memo = (environment, layer, merged)
    return merged


def set_process_llvm_option(name: str, value: Any) -> Any:
    """``tritonpatch.llvm.set_option``: put ``name=value`` into the process-wide layer, or take
    ``name`` out of it for ``None``; return the layer's previous value (``None``: it had none)."""
    global _process_layer
    from . import llvm

    if not isinstance(name, str) or not name.lstrip("-"):
        raise PipelineError(f"LLVM option names are non-empty strings, got {name!r}")
    canonical = name.lstrip("-")
    normalized = None if value is None else llvm.normalize_value(canonical, value)
    if value is None:
        llvm.get_option(canonical)  # an unknown name is an error here too (naming the close matches)
    with _process_lock:
        layer = dict(_process_layer.llvm)
        previous = layer.pop(canonical, None)
        if normalized is not None:
            layer[canonical] = normalized
        _process_layer = Pipeline._from_canonical(tuple(sorted(layer.items())), (), ())
    _install()
    return previous


# --- the effective Pipeline ---------------------------------------------------------------------

_MERGE_MEMO_SIZE = 64


class _Frame:
    """One entry into an ``options()`` layer: the layer over the enclosing frame (or over
    :func:`base_pipeline`). The merge is resolved lazily and kept until what it was merged over
    changes (a ``set_option`` call), so a launch resolves it in O(1)."""

    __slots__ = ("parent", "layer", "merged", "_resolved")

    def __init__(self, parent: "_Frame | None", layer: Pipeline, merged: dict):
        self.parent = parent
        self.layer = layer
        self.merged = merged  # base -> base.merge(layer), shared by the entries of one options()
        self._resolved = (None, EMPTY)

    def resolve(self) -> Pipeline:
        parent = self.parent
        base = base_pipeline() if parent is None else parent.resolve()
        resolved = self._resolved
        if resolved[0] is base:
            return resolved[1]
        scoped = self.merged.get(base)
        if scoped is None:
            if len(self.merged) >= _MERGE_MEMO_SIZE:
                self.merged.clear()
            scoped = self.merged[base] = base.merge(self.layer)
        self._resolved = (base, scoped)
        return scoped


class _Fixed:
    """A per-kernel Pipeline (``use_pipeline``): exactly this one, whatever encloses it."""

    __slots__ = ("pipeline",)

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline

    def resolve(self) -> Pipeline:
        return self.pipeline


# The innermost options() frame; the per-kernel Pipeline; and the one of the two in effect (what
# current_pipeline() resolves: Triton 3.7+ asks for it on every launch).
_scoped: contextvars.ContextVar[_Frame | None] = contextvars.ContextVar("tritonpatch_options", default=None)
_forced: contextvars.ContextVar[_Fixed | None] = contextvars.ContextVar("tritonpatch_kernel", default=None)
_effective: contextvars.ContextVar["_Frame | _Fixed | None"] = contextvars.ContextVar("tritonpatch_effective",
                                                                                      default=None)


def current_pipeline() -> Pipeline:
    """The Pipeline a compile started here and now would use."""
    state = _effective.get()
    return base_pipeline() if state is None else state.resolve()


def current_cache_tag() -> str:
    """``current_pipeline().cache_tag``, on the per-launch path."""
    state = _effective.get()
    pipeline = base_pipeline() if state is None else state.resolve()
    return pipeline.cache_tag if pipeline.passes else pipeline._tag


class _KeyedCompile(threading.local):
    """What the last cache-key computation in this thread resolved: ``(state, pipeline)``."""
    record: tuple | None = None


_keyed = _KeyedCompile()


def keyed_cache_tag() -> str:
    """:func:`current_cache_tag` for the cache key of a compile about to run in this thread: the
    Pipeline is remembered so that the compile's stages use the very Pipeline its key names, even
    if ``set_option`` changes the process-wide layer in between. (Triton 3.7+ calls this on every
    launch: the base case is inlined.)"""
    state = _effective.get()
    if state is None:
        memo = _base_memo
        pipeline = memo[2] if memo[0] is _environment and memo[1] is _process_layer else base_pipeline()
    else:
        pipeline = state.resolve()
    _keyed.record = (state, pipeline)
    return pipeline.cache_tag if pipeline.passes else pipeline._tag


def compile_pipeline() -> Pipeline:
    """The Pipeline for the stages of the compile starting now in this thread: the one its cache
    key was computed with (:func:`keyed_cache_tag`) if that happened in the same ``options()`` /
    ``use_pipeline()`` context, else :func:`current_pipeline`."""
    record, _keyed.record = _keyed.record, None
    if record is not None and record[0] is _effective.get():
        return record[1]
    return current_pipeline()


_hooks = None


def _install() -> None:
    """Install tritonpatch into Triton unless done (runs on every block entry: keep it cheap)."""
    global _hooks
    if _hooks is None:
        from . import hooks

        _hooks = hooks
    if not _hooks.installed():
        _hooks.install()


_passes_module = None


def _pass_registry():
    """``tritonpatch.passes``, imported once (the cache tag of a Pipeline with passes needs it on
    every launch)."""
    global _passes_module
    module = _passes_module
    if module is None:
        from . import passes as module

        _passes_module = module
    return module


class use_pipeline:
    """``with use_pipeline(p):`` compiles with exactly ``p``, ignoring ``options()``, ``set_option``
    and the environment (per-kernel pipelines: ``tritonpatch.jit`` enters one around each launch,
    so it is kept light). One object per ``with``."""

    __slots__ = ("pipeline", "fixed", "tokens")

    def __init__(self, pipeline: Pipeline):
        if not isinstance(pipeline, Pipeline):
            raise PipelineError(f"use_pipeline() takes a Pipeline, got {pipeline!r}")
        self.pipeline = pipeline
        self.fixed = _Fixed(pipeline)

    def __enter__(self) -> Pipeline:
        _install()
        self.tokens = (_forced.set(self.fixed), _effective.set(self.fixed))
        return self.pipeline

    def __exit__(self, *exc_info) -> None:
        forced, effective = self.tokens
        _effective.reset(effective)
        _forced.reset(forced)


class _Block:
    """One entry into an options() layer: sets its frame, restores the previous one."""

    __slots__ = ("layer", "merged", "tokens")

    def __init__(self, layer: Pipeline, merged: dict):
        self.layer = layer
        self.merged = merged

    def __enter__(self) -> Pipeline:
        _install()
        frame = _Frame(_scoped.get(), self.layer, self.merged)
        forced = _forced.get()
        self.tokens = (_scoped.set(frame), _effective.set(frame if forced is None else forced))
        return frame.resolve()

    def __exit__(self, *exc_info) -> None:
        scoped, effective = self.tokens
        _effective.reset(effective)
        _scoped.reset(scoped)


# The options() blocks entered by `with` in this context, innermost last: one object may be entered
# by several threads or asyncio tasks at once, and each exits its own entry.
_open_blocks: contextvars.ContextVar[tuple] = contextvars.ContextVar("tritonpatch_open_blocks", default=())


class options:
    """Compile the kernels of a block (or of every call of a decorated function) with these settings.

    ``with tritonpatch.options(disable_lsr=True, llvm={...}, passes=[...], ptxas=[...]):``. The
    keywords are those of :class:`Pipeline` and are validated immediately. Blocks nest by merging
    key by key over the enclosing block (and over ``set_option``'s layer and the ``TRITONPATCH_*``
    variables); the settings
    are held in a context variable, so other threads and asyncio tasks are unaffected. Entering a
    block installs tritonpatch into Triton if that has not happened yet. As a decorator (sync or
    async functions) each call enters the block afresh.
    """

    def __init__(self, **settings: Any):
        self.layer = Pipeline(**settings)
        self._merged: dict = {}

    def __enter__(self) -> Pipeline:
        block = _Block(self.layer, self._merged)
        effective = block.__enter__()
        _open_blocks.set(_open_blocks.get() + ((self, block),))
        return effective

    def __exit__(self, *exc_info) -> None:
        stack = _open_blocks.get()
        owner, block = stack[-1]
        if owner is not self:
            raise RuntimeError("tritonpatch.options blocks must be exited in the reverse order of entry")
        _open_blocks.set(stack[:-1])
        block.__exit__(*exc_info)

    def __call__(self, func):
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args, **kwargs):
                with _Block(self.layer, self._merged):
                    return await func(*args, **kwargs)
            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with _Block(self.layer, self._merged):
                return func(*args, **kwargs)
        return wrapper

    def __repr__(self):
        return f"tritonpatch.options({self.layer!r})"
