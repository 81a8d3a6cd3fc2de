"""Pass specs: a pass name with the options a Pipeline gives it, checked against the registry.

A pass spec is ``(name, ((key, value), ...))`` with option pairs sorted by key: hashable, so a
Pipeline can hold it and fingerprint it. Text form: ``"name"`` or ``"name(key=value,key=value)"``.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..env import bool_word, quote
from ..errors import PipelineError
from .registry import PassOption, PassSpec, available_passes, pass_info


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
