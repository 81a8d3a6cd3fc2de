"""IR passes that run after Triton's own ``ttir`` / ``ttgir`` stages.

A pass is a named rewrite of the module's textual IR, registered with the stage it follows and the
options it accepts (:mod:`.registry`). :func:`run_stage_passes` runs the passes of one stage in
order, re-parses the result with Triton and verifies it; if any pass raises or its output does not
verify, the stage keeps the unpatched module and emits one warning (or raises
:class:`~tritonpatch.errors.PassError` in strict mode), so a pass can never miscompile quietly
(:mod:`.runner`). What each pass did, and why it left a loop as it is, goes to its
:class:`PassReport` (:mod:`.report`).

A pass spec is ``(name, ((key, value), ...))`` with option pairs sorted by key: hashable, so a
Pipeline can hold it and fingerprint it. Text form: ``"name"`` or ``"name(key=value,key=value)"``
(:mod:`.specs`).

Each registration carries a digest of its implementation (:func:`implementation_digest`), which
joins the cache key of every Pipeline naming the pass: a pass re-registered with other code under
the same name never gets the artifact the old one built (:mod:`.digests`).

The framework modules above know nothing of the built-in passes; those are the analyses
(:mod:`.ir`, :mod:`.masks`, :mod:`.iterations`) and the rewrites (:mod:`.skip`, :mod:`.elide`,
:mod:`.hoist`), registered by :mod:`.builtin` when this package is imported.
"""
from __future__ import annotations

from .builtin import register_builtin_passes
from .digests import implementation_digest, source_digest
from .registry import (STAGES, PassInfo, PassOption, PassSpec, available_passes, implementation_tag, pass_info,
                       pass_stage, register_pass, unregister_pass)
from .report import PassReport, collect_reports, note
from .runner import StageOutcome, apply_stage_passes, parse_module, run_stage_passes
from .specs import parse_pass_spec, resolved_options, validate_pass_spec

register_builtin_passes()


__all__ = ["PassSpec", "PassOption", "PassInfo", "PassReport", "STAGES", "register_pass", "unregister_pass",
           "note", "available_passes", "pass_info", "pass_stage", "parse_pass_spec", "validate_pass_spec",
           "resolved_options", "collect_reports", "StageOutcome", "apply_stage_passes", "run_stage_passes",
           "parse_module", "source_digest", "implementation_digest", "implementation_tag"]
