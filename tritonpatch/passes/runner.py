"""Running the passes of one stage on Triton's module, with the fallback that keeps them safe.

:func:`apply_stage_passes` runs the passes of one stage in order on the module's text; each text a
pass changed is parsed with Triton and verified once (so a failure names the pass that caused it),
and the last module parsed is the stage's result (once the loops versioned on their carried offsets
have them back: :func:`.versioning.restore_carried_offsets`). If any pass raises or its output does not
verify, the stage keeps the unpatched module and emits one warning (or raises
:class:`~tritonpatch.errors.PassError` in strict mode), so a pass can never miscompile quietly.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Sequence

from .. import _user_warnings as user_warnings
from ..errors import PassError
from .registry import PassSpec, pass_info, pass_stage
from .report import PassReport, collecting_notes, publish
from .specs import resolved_options
from .versioning import restore_carried_offsets


def _kernel_name(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("tt.func"):
            return stripped.split("@", 1)[1].split("(", 1)[0] if "@" in stripped else "?"
    return "?"


def parse_module(text: str, context):
    """Parse IR text with Triton in ``context`` and verify it; returns the new ``ir.module``."""
    from .._triton_compat import parse_mlir_file  # imports Triton: only once a module is parsed

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
    text, reports, result = original, [], module
    try:
        for spec in selected:
            info = pass_info(spec[0])
            try:
                with collecting_notes() as notes:
                    new_text, counts = info.run(text, resolved_options(spec))
            except Exception as exc:  # noqa: BLE001 - any failure of a pass means: fall back
                raise PassError(f"pass {info.name!r} failed on kernel {kernel!r}: {type(exc).__name__}: {exc}") from exc
            reports.append(PassReport(info.name, stage, kernel, dict(counts), notes=tuple(notes)))
            if new_text != text:
                try:
                    result = parse_module(new_text, module.context)
                except Exception as exc:  # noqa: BLE001
                    raise PassError(f"pass {info.name!r} produced IR that Triton rejects on kernel {kernel!r}: "
                                    f"{type(exc).__name__}: {exc}") from exc
                text = new_text
        try:
            restored, _ = restore_carried_offsets(text)
            if restored != text:
                result = parse_module(restored, module.context)
        except Exception as exc:  # noqa: BLE001 - as for a pass: fall back
            raise PassError(f"restoring the carried offsets of versioned loops failed on kernel {kernel!r}: "
                            f"{type(exc).__name__}: {exc}") from exc
    except PassError as exc:
        for report in reports:
            report.kept = False
        publish(reports)
        if strict:
            raise
        message = f"tritonpatch: {exc}; using the unpatched {stage} IR"
        user_warnings.warn(message)
        return StageOutcome(module, reports, message)
    publish(reports)
    return StageOutcome(result, reports)


def run_stage_passes(stage: str, module, specs: Sequence[PassSpec], *, strict: bool):
    """:func:`apply_stage_passes`, returning only the module to hand on."""
    return apply_stage_passes(stage, module, specs, strict=strict).module
