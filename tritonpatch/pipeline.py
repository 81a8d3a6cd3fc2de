"""The Pipeline: what a compile should change (LLVM options, IR passes, ptxas options), as a
frozen, hashable value with a canonical form, a fingerprint and a cache tag; its text form
(:meth:`Pipeline.parse`, what the command line takes); and the Pipeline the ``TRITONPATCH_*``
variables of an environment ask for, read with the same grammar.

Which Pipeline is in effect for a compile is :mod:`._current`'s concern; the blocks that change
it (``options()``, ``use_pipeline()``) are :mod:`.scope`'s.
"""
from __future__ import annotations

import difflib
import functools
import hashlib
import inspect
import json
import os
from typing import Any, Iterable, Mapping

from . import __version__, env
from . import _ptxas as ptxas_flags
from . import passes as ir_passes
from .passes import registry as pass_registry
from ._llvm_registry import get_option, normalize_value, option_name
from .errors import NativeUnavailableError, OptionTypeError, PipelineError, TritonpatchError, UnknownOptionError

__all__ = ["Pipeline", "pipeline_from_environ", "KEYWORDS", "check_keywords", "as_pipeline"]

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
    normalized = {}
    for name, value in settings.items():
        canonical = option_name(name)
        normalized[canonical] = normalize_value(canonical, value)
    return tuple(sorted(normalized.items()))


_VALUE_PLACEHOLDERS = {"float": "X", "double": "X", "string": "TEXT", "enum": "CHOICE"}


def _needs_a_value(name: str) -> None:
    """An :class:`OptionTypeError` when the LLVM option ``name``, written alone in the text form or a
    ``TRITONPATCH_*`` variable (which reads as ``True``), is settable but no bool: it needs ``name=VALUE``."""
    option = get_option(name)
    if option.settable and option.type not in ("bool", "boolOrDefault"):
        placeholder = _VALUE_PLACEHOLDERS.get(option.type, "N")
        choices = f" ({', '.join(option.choices)})" if option.type == "enum" else ""
        raise OptionTypeError(f"LLVM option {name!r} ({option.type}) needs a value: write "
                              f"{name}={placeholder}{choices}; a name alone sets a bool option to true")


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
    specs = []
    for item in passes:
        if isinstance(item, str):
            spec = ir_passes.parse_pass_spec(item)
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            opts = item[1]
            spec = ir_passes.validate_pass_spec(item[0], dict(opts.items() if isinstance(opts, Mapping) else opts))
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
        tokens.extend(env.parse_ptxas_options(flag, variable="ptxas"))
    ptxas_flags.check_flags(tokens)
    return tuple(tokens)


def check_keywords(given: Iterable, where: str) -> None:
    """A TypeError when any of ``given`` is no Pipeline keyword (:data:`KEYWORDS`; ``where`` names what
    took them: ``Pipeline``, ``tritonpatch.options``): it lists the keywords and names the one each
    unknown keyword is a misspelling of, if any."""
    unknown = sorted(str(name) for name in given if name not in KEYWORDS)
    if not unknown:
        return
    close = {name: difflib.get_close_matches(name, KEYWORDS, n=1, cutoff=0.6) for name in unknown}
    hints = [f"{match[0]} (for {name})" for name, match in close.items() if match]
    hint = f"; did you mean {', '.join(hints)}?" if hints else ""
    raise TypeError(f"{where} got unknown keyword(s) {unknown}; the keywords are {', '.join(KEYWORDS)} (an LLVM "
                    f"option goes in llvm= by its name, e.g. llvm={{'disable-lsr': True}}){hint}")


def as_pipeline(value: Any, where: str) -> "Pipeline":
    """``value`` as a Pipeline: a Pipeline itself, or a dict of the Pipeline keywords; anything else, and a
    dict that does not make a Pipeline, is an error whose message starts with ``where`` (what took it)."""
    if isinstance(value, Pipeline):
        return value
    if isinstance(value, Mapping):
        try:
            check_keywords(value, "a Pipeline dict")
            return Pipeline(**value)
        except TritonpatchError as exc:   # a value Pipeline refuses: the same error, saying where it came from
            raise type(exc)(f"{where}: {exc}") from exc
        except TypeError as exc:   # an unknown keyword
            raise PipelineError(f"{where}: {exc}") from exc
    keywords = ", ".join(f"{name}=" for name in KEYWORDS)
    raise PipelineError(f"{where} takes a tritonpatch.Pipeline or a dict of its keywords ({keywords}), got "
                        f"{value!r}" + (f"; for the text form use tritonpatch.Pipeline.parse({value!r})"
                                        if isinstance(value, str) else ""))


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
    ``-flag`` or ``-flag=value`` token, checked here against the options of the ptxas Triton runs
    (its ``--help``, read once; where no ptxas can be run, the form only, and ptxas reports the rest
    at compile time). Refused: flags for what Triton sets itself (target, input, output), flags that
    make ptxas compile nothing or only a named entry (``--help``, ``--version``, ``--list-version``,
    ``--entry``), flags read from files, and a value missing from its flag's token. A flag the help
    does not list warns, naming the close ones, and is passed on (ptxas takes switches its help does
    not show); so does ``--maxrregcount`` without ``--override-directive-values`` (ptxas follows the
    launch bounds of Triton's PTX instead), each once per process. The canonical form
    sorts LLVM options by name and keeps pass and ptxas order (order can matter there).
    ``Pipeline()`` changes nothing; an unknown keyword is a TypeError naming the close one.
    """

    __slots__ = ("llvm", "passes", "ptxas", "_fingerprint", "_hash", "_tag", "_pass_tag")

    def __init__(self, *, disable_lsr: bool | None = None, llvm: Mapping[str, Any] | None = None,
                 passes: Iterable[Any] | Mapping[str, Any] = (), ptxas: Iterable[str] = (), **unknown: Any):
        check_keywords(unknown, "Pipeline")
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
    def parse(cls, text: str, where: str = "Pipeline.parse") -> "Pipeline":
        """The Pipeline of its text form: items joined with ``;`` (blank items are skipped)::

            default, none            nothing: plain Triton
            disable-lsr              the LLVM option disable-lsr=true
            llvm:NAME[=VALUE],...    LLVM options, as TRITONPATCH_LLVM_OPTIONS takes them
            passes:SPEC,...          IR passes, as TRITONPATCH_PASSES takes them
            ptxas:FLAGS              ptxas flags, as TRITONPATCH_PTXAS_OPTIONS takes them

        e.g. ``"disable-lsr;passes:hoist-masks;ptxas:--def-load-cache=cg"``. Later items override
        earlier ones key by key. Each section is read by the parser of its ``TRITONPATCH_*``
        variable and validated as the variables are (:func:`pipeline_from_environ`), so the text
        form and the environment accept the same values. A mistake raises :class:`PipelineError`
        that starts with ``where`` (the command line passes its flag, ``--a``) and the text."""
        if not isinstance(text, str):
            raise PipelineError(f"{where} takes the text form of a Pipeline, got {text!r}")
        settings = _text_settings(text, where)
        return _from_settings(settings, lambda section, token, exc: f"{where} {env.quote(text)}: {exc}")

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
            tag += f"-{ir_passes.source_digest()[:16]}"
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
        memo = self._pass_tag
        generation, strict = pass_registry.generation, _strict_setting()
        if memo[0] == generation and memo[1] == strict:
            return memo[2]
        tag = f"{self._tag}{ir_passes.implementation_tag(self.passes)}{'-strict' if env.strict() else ''}"
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


# The keywords Pipeline(...) takes (tritonpatch.options(...) and the dicts jit/autotune take too).
KEYWORDS = tuple(name for name, parameter in inspect.signature(Pipeline.__init__).parameters.items()
                 if parameter.kind is inspect.Parameter.KEYWORD_ONLY)
EMPTY = Pipeline._from_canonical((), (), ())


# --- the text form, and the environment's Pipeline ---------------------------------------------
#
# One grammar: the sections llvm / passes / ptxas are read by the parsers of the TRITONPATCH_*
# variables (env.parse_llvm_options, split_pass_list, parse_ptxas_options), and both the text form
# and the variables give settings that _from_settings validates token by token. The variables are
# not joined into one text: a ';' may occur inside a value (a ptxas flag, an LLVM string value).

_ITEMS = "disable-lsr, llvm:NAME[=VALUE],..., passes:NAME,... or ptxas:FLAGS, joined with ';'"
_SECTIONS = {"llvm": env.parse_llvm_options, "passes": env.split_pass_list, "ptxas": env.parse_ptxas_options}


def _text_settings(text: str, where: str) -> dict[str, Any]:
    """The settings of the text form (``Pipeline`` keywords, values still text, as
    :func:`env.pipeline_settings` gives them); a malformed item or section raises."""
    if not text.strip():
        raise PipelineError(f"{where} {env.quote(text)}: empty; give default (plain Triton), {_ITEMS}")
    settings: dict[str, Any] = {"llvm": {}, "passes": [], "ptxas": []}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        section, colon, value = item.partition(":")
        if item in ("default", "none"):
            continue
        if item == "disable-lsr":
            settings["llvm"]["disable-lsr"] = True
        elif colon and section in _SECTIONS:
            parsed = _SECTIONS[section](value, variable=f"{where} {section}")
            if section == "llvm":
                settings["llvm"].update(parsed)
            else:
                settings[section].extend(parsed)
        else:
            raise PipelineError(f"{where} {env.quote(text)}: bad item {env.quote(item)}; expected default, {_ITEMS}")
    return settings


def _from_settings(settings: Mapping[str, Any], message) -> Pipeline:
    """The Pipeline of text settings (from the text form or the environment), validated token by
    token: LLVM options against Triton's LLVM, passes against the pass registry.
    ``message(section, token, exc)`` is the text of the :class:`PipelineError` a bad token raises."""
    llvm = {}
    for name, value in settings.get("llvm", {}).items():
        token = name if value is True else f"{name}={value}"
        try:
            if value is True:  # the name alone
                _needs_a_value(name)
            llvm.update(_normalize_llvm({name: value}))
        except (UnknownOptionError, OptionTypeError, NativeUnavailableError) as exc:
            raise PipelineError(message("llvm", token, exc)) from exc
    passes = []
    for text in settings.get("passes", ()):
        try:
            passes.extend(_normalize_passes([text]))
        except PipelineError as exc:
            raise PipelineError(message("passes", text, exc)) from exc
    ptxas = tuple(settings.get("ptxas", ()))
    for token in ptxas:
        try:
            ptxas_flags.check_flag(token)
        except PipelineError as exc:
            raise PipelineError(message("ptxas", token, exc)) from exc
    ptxas_flags.warn_on_ignored_register_cap(ptxas)
    return Pipeline._from_canonical(tuple(sorted(llvm.items())), _merge_by_key(passes, key=lambda spec: spec[0]),
                                    ptxas)


def pipeline_from_environ(environ: Mapping[str, str]) -> Pipeline:
    """The Pipeline the ``TRITONPATCH_*`` variables in ``environ`` ask for: each variable is one
    section of the text form (``TRITONPATCH_DISABLE_LSR`` the item ``disable-lsr``). A bad value
    raises :class:`PipelineError` naming the variable and the token."""
    def message(section: str, token: str, exc: Exception) -> str:
        if section == "passes":
            variable = env.PASSES
        elif section == "ptxas":
            variable = env.PTXAS_OPTIONS
        elif token.partition("=")[0] == "disable-lsr":
            variable = env.DISABLE_LSR if env.DISABLE_LSR in environ else env.LLVM_OPTIONS
        else:
            variable = env.LLVM_OPTIONS
        if isinstance(exc, NativeUnavailableError):
            return f"{variable} is set but LLVM options are unavailable: {exc}"
        return f"{variable}={env.quote(environ.get(variable))}: bad token {env.quote(token)}: {exc}"

    return _from_settings(env.pipeline_settings(environ), message)
