"""Installing tritonpatch into Triton: the stages hook, the LLVM option scope, the cache keys.

For every compile the hook takes the :class:`~tritonpatch.Pipeline` its cache key was computed
with and wraps the NVIDIA stages (``ttir, ttgir, llir, ptx, cubin``):

- IR passes run right after ``ttir`` and ``ttgir`` (Triton-language kernels only);
- the Pipeline's LLVM options are set just around ``llir`` (``-O3`` IR options) and ``ptx`` (code
  generation, where LSR runs) through the one LLVM option scope (``tritonpatch._llvm_scope``) and
  restored right after, exceptions included. The same scope
  snapshots what Triton's own ``DISABLE_LLVM_OPT=a,b`` is about to set and restores it, so that
  stops leaking into later compiles;
- ptxas flags reach ``cubin`` through the options' ``ptx_options``.

LLVM options are process-wide, so one set is active at a time: compiles that want the same set
(the empty one included) share the scope and run in parallel; a compile wanting another set waits
until they are done. A compile in another thread therefore never observes foreign options.

Cache keys: a non-empty Pipeline adds its fingerprint to the disk key and to the in-memory JIT key
(3.7+: through the hook's ``(key, hash)``; 3.6: by rebinding ``get_cache_key`` and
``compute_cache_key``). An empty Pipeline leaves every disk key as plain Triton computes it.
"""
from __future__ import annotations

import logging
import sys
import threading
from typing import Callable

from . import env
from ._llvm_scope import scope
from .errors import PipelineError
from .pipeline import Pipeline, compile_pipeline, current_cache_tag, environment_pipeline, keyed_cache_tag

__all__ = ["install", "uninstall", "installed"]

logger = logging.getLogger("tritonpatch")

_install_lock = threading.RLock()
_hook: "_StagesHook | None" = None


class _StagesHook:
    """The object set as ``knobs.runtime.add_stages_inspection_hook``; chains to the one it replaced."""

    def __init__(self, previous):
        self.previous = previous
        self.active = True

    def __call__(self, *args):
        if not args:  # Triton 3.7+: (key, hash) for the disk and in-memory caches, on every launch
            key, digest = self.previous() if self.previous is not None else ("", "")
            tag = keyed_cache_tag() if self.active else ""
            return (key + tag, f"{digest}{tag}") if tag else (key, digest)
        backend, stages, options, language, capability = args
        stock_cubin = stages.get("cubin")
        if self.previous is not None:
            self.previous(backend, stages, options, language, capability)
        if self.active:
            _wrap_stages(backend, stages, options, language, compile_pipeline(), stock_cubin)


def _with_llvm_options(stage: Callable, key, after: Callable | None = None) -> Callable:
    def run_with_llvm_options(src, metadata):
        scope.enter(*key)
        try:
            result = stage(src, metadata)
        finally:
            scope.exit()
        if after is not None:
            after(metadata)
        return result

    return run_with_llvm_options


def _with_passes(stage_name: str, stage: Callable, specs: tuple, strict: bool) -> Callable:
    from .passes import run_stage_passes

    def run_then_passes(src, metadata):
        return run_stage_passes(stage_name, stage(src, metadata), specs, strict=strict)

    return run_then_passes


def _wrap_stages(backend, stages: dict, options, language, pipeline: Pipeline, stock_cubin) -> None:
    from . import _triton_compat as compat

    if "llir" not in stages or "ptx" not in stages:
        if pipeline.is_empty:
            return
        raise PipelineError(f"tritonpatch pipelines support the NVIDIA backend only; this compile has the "
                            f"stages {list(stages)} and the Pipeline {pipeline!r}")
    if pipeline.passes:
        if compat.is_triton_language(language):
            strict = env.strict()
            for stage_name in ("ttir", "ttgir"):
                stages[stage_name] = _with_passes(stage_name, stages[stage_name], pipeline.passes, strict)
        else:
            logger.debug("IR passes skipped for a %s kernel (hand-written TTGIR)", language)
    key = (pipeline.llvm, compat.disable_llvm_opt_names())
    log = _log_compile(pipeline) if logger.isEnabledFor(logging.INFO) else None
    stages["llir"] = _with_llvm_options(stages["llir"], key)
    stages["ptx"] = _with_llvm_options(stages["ptx"], key, after=log)
    if pipeline.ptxas:
        if stages.get("cubin") is not stock_cubin:
            raise PipelineError("another stages hook replaced Triton's cubin stage, so tritonpatch cannot pass "
                                f"the ptxas flags {list(pipeline.ptxas)}; drop ptxas= or that hook")
        stages["cubin"] = compat.cubin_stage_with_ptxas_options(backend, options, pipeline.ptxas)


def _log_compile(pipeline: Pipeline) -> Callable:
    def log(metadata):
        logger.info("%s compiled with %r%s", metadata.get("name", "<kernel>"), pipeline,
                    f" [{pipeline.fingerprint()}]" if pipeline else "")
    return log


# --- install / uninstall ------------------------------------------------------------------------

def _configure_logging() -> None:
    level = env.log_level()
    if level is None or any(getattr(h, "_tritonpatch", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[tritonpatch] %(message)s"))
    handler._tritonpatch = True
    logger.addHandler(handler)
    logger.setLevel(level.upper())


def install() -> None:
    """Hook tritonpatch into Triton (idempotent). Reads the ``TRITONPATCH_*`` variables now, so a
    malformed value raises here. ``options()``, ``use_pipeline()``, ``llvm.llvm_options()`` and
    ``llvm.set_option()`` call this for you."""
    global _hook
    if _hook is not None:
        return
    with _install_lock:
        if _hook is not None:
            return
        from . import _triton_compat as compat

        compat.check_supported()
        environment_pipeline()
        env.strict()
        _configure_logging()
        hook = _StagesHook(compat.get_stages_hook())
        compat.set_stages_hook(hook)
        compat.patch_cache_keys(memory_tag=current_cache_tag, disk_tag=keyed_cache_tag)
        _hook = hook
        logger.debug("installed (triton %s.%s, environment %r)", *compat.TRITON_VERSION, environment_pipeline())


def uninstall() -> None:
    """Undo :func:`install`: the hook that was there before is put back (if another hook was
    chained on top of ours meanwhile, ours stays in its chain but does nothing)."""
    global _hook
    with _install_lock:
        if _hook is None:
            return
        from . import _triton_compat as compat

        hook, _hook = _hook, None
        hook.active = False
        if compat.get_stages_hook() is hook:
            compat.set_stages_hook(hook.previous)
        compat.unpatch_cache_keys()


def installed() -> bool:
    return _hook is not None
