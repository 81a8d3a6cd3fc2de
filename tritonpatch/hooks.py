"""Installing tritonpatch into Triton: the stages hook, the LLVM option scope, the cache keys.

For every compile the hook resolves the effective :class:`~tritonpatch.Pipeline` once and wraps
the NVIDIA stages (``ttir, ttgir, llir, ptx, cubin``):

- IR passes run right after ``ttir`` and ``ttgir`` (Triton-language kernels only);
- the Pipeline's LLVM options are set just around ``llir`` (``-O3`` IR options) and ``ptx`` (code
  generation, where LSR runs) and restored right after, exceptions included. The same scope
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
import os
import sys
import threading
import warnings
from typing import Callable

from . import env
from .errors import PipelineError
from .pipeline import Pipeline, current_cache_tag, current_pipeline, environment_pipeline

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
            tag = current_cache_tag() if self.active else ""
            return (key + tag, f"{digest}{tag}") if tag else (key, digest)
        backend, stages, options, language, capability = args
        stock_cubin = stages.get("cubin")
        if self.previous is not None:
            self.previous(backend, stages, options, language, capability)
        if self.active:
            _wrap_stages(backend, stages, options, language, current_pipeline(), stock_cubin)


# --- the LLVM option scope ----------------------------------------------------------------------

class _LLVMOptionScope:
    """At most one set of LLVM options is applied at a time, process-wide.

    ``enter((settings, triton_names))`` / ``exit()`` around a stage: the first holder of a set
    snapshots the options named by ``DISABLE_LLVM_OPT`` (``triton_names``) and applies
    ``settings``; the last holder restores everything exactly.
    Holders asking for the same set share it; a different set waits, and while it waits newcomers
    for the active set wait too, so no set starves.
    """

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._active = None
        self._holders = 0
        self._saved: list = []
        self._waiting = 0

    def _can_join(self, key, waiting_self: int) -> bool:
        return self._holders == 0 or (self._active == key and self._waiting == waiting_self)

    def enter(self, key) -> None:
        settings, triton_names = key
        with self._cond:
            if not self._can_join(key, 0):
                self._waiting += 1
                try:
                    while not self._can_join(key, 1):
                        self._cond.wait()
                finally:
                    self._waiting -= 1
            if self._holders == 0:
                try:
                    self._saved = _snapshot(triton_names) + _apply(settings)
                except BaseException:
                    self._cond.notify_all()
                    raise
                self._active = key
            self._holders += 1

    def exit(self) -> None:
        with self._cond:
            if self._holders == 0:  # the scope was reset by a fork while this thread held it
                return
            self._holders -= 1
            if self._holders == 0:
                saved, self._saved, self._active = self._saved, [], None
                try:
                    if saved:
                        from . import llvm

                        llvm.restore_options(saved)
                finally:
                    self._cond.notify_all()


    def reset_after_fork(self) -> None:
        """In a forked child only the forking thread lives on: holders in other threads never
        exit there, so put back what they applied and start from an empty scope."""
        saved = self._saved
        self.__init__()
        if saved:
            try:
                from . import llvm

                llvm.restore_options(saved)
            except Exception as exc:  # noqa: BLE001 - a child must not die for this; say what is left
                warnings.warn(f"tritonpatch: LLVM options applied in the parent at fork time stay set in "
                              f"this child process: {exc}", RuntimeWarning, stacklevel=1)


_scope = _LLVMOptionScope()
os.register_at_fork(after_in_child=_scope.reset_after_fork)
_warned_unrestorable = False


def _apply(settings: tuple) -> list:
    if not settings:
        return []
    from . import llvm

    return llvm.apply_options(dict(settings))


def _snapshot(names: tuple[str, ...]) -> list:
    """Exact states of the options ``DISABLE_LLVM_OPT`` names (unknown names are skipped, as
    Triton skips them)."""
    global _warned_unrestorable
    if not names:
        return []
    from . import llvm
    from .errors import NativeUnavailableError

    try:
        registry = llvm._registry()
    except NativeUnavailableError as exc:
        if not _warned_unrestorable:
            _warned_unrestorable = True
            warnings.warn(f"DISABLE_LLVM_OPT={','.join(names)} will leak into later compiles (Triton never "
                          f"resets it) because tritonpatch cannot restore LLVM options here: {exc}",
                          RuntimeWarning, stacklevel=2)
        return []
    return [registry.snapshot(name) for name in names if registry.option(name) is not None]


def _with_llvm_options(stage: Callable, key, after: Callable | None = None) -> Callable:
    def run_with_llvm_options(src, metadata):
        _scope.enter(key)
        try:
            result = stage(src, metadata)
        finally:
            _scope.exit()
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
    malformed value raises here. ``options()`` and ``use_pipeline()`` call this for you."""
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
        compat.patch_cache_keys(current_cache_tag)
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
