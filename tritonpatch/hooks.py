"""Installing tritonpatch into Triton: the stages hook, the cache keys, and the fallback of a
patched compile.

For every compile the hook takes the :class:`~tritonpatch.Pipeline` its cache key was computed
with and wraps the NVIDIA stages (``ttir, ttgir, llir, ptx, cubin``):

- the Pipeline's LLVM options are set just around ``llir`` (``-O3`` IR options) and ``ptx`` (code
  generation, where LSR runs) through the one LLVM option scope (``tritonpatch._llvm_scope``) and
  restored right after, exceptions included. The scope also snapshots what Triton's own
  ``DISABLE_LLVM_OPT=a,b`` is about to set and restores it, so that stops leaking into later
  compiles. One set is active at a time: a compile in another thread never observes foreign options;
- ptxas flags reach ``cubin`` through the options' ``ptx_options`` (the Pipeline checked them, and
  warned of a register cap that Triton's launch bounds make ptxas ignore, when it was made);
- IR passes run right after ``ttir`` and ``ttgir`` (Triton-language kernels only). When a stage's
  passes change its module, the later stages are compiled right away from the patched module, so
  that a failure in any of them (a later stage rejecting the pass output, LLVM, ptxas, a loop whose
  multiply-adds the backend fused differently from the unpatched kernel's) still gives
  the unpatched kernel: one warning naming the passes and the failure, the rest of the compile
  without passes, and every stage output Triton stores unpatched (``PassError`` under
  ``TRITONPATCH_STRICT=1``). The fallback is recorded in the kernel's metadata
  (``tritonpatch_fallback``).

Cache keys: a non-empty Pipeline adds its cache tag to the disk key and to the in-memory JIT key
(3.7+: through the hook's ``(key, hash)``; 3.6: by rebinding ``get_cache_key`` and
``compute_cache_key``). An empty Pipeline leaves every disk key as plain Triton computes it. Installing
also lets Triton's ``RedisRemoteCacheBackend`` read its knobs (``_triton_compat.link_redis_knobs``),
so compiled kernels can be shared through Triton's remote cache (docs/caches.md).
"""
from __future__ import annotations

import functools
import logging
import sys
import threading
from typing import Callable

from . import _interrupts as interrupts
from . import _user_warnings as user_warnings
from . import env
from ._llvm_scope import scope
from ._current import compile_pipeline, current_cache_tag, environment_pipeline, keyed_cache_tag
from .errors import PassError, PipelineError
from .passes import apply_stage_passes, parse_module
from .passes.float_contraction import contraction_changes
from .passes.reduction_layouts import reduction_layout_changes
from .pipeline import Pipeline
from .targets import shared_memory_per_block

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
            _wrap_stages(backend, stages, options, language, compile_pipeline(), stock_cubin, capability)


def _with_llvm_options(stage: Callable, settings: tuple, triton_names: tuple,
                       after: Callable | None = None) -> Callable:
    def run_with_llvm_options(src, metadata):
        # Ctrl-C is held back while the options change hands (a KeyboardInterrupt there left them set, or
        # the gate taken, for every later compile) and let through while the stage runs (and while waiting
        # for the gate: _llvm_gate)
        with interrupts.held() as guard:
            scope.enter(settings, triton_names)
            try:
                with interrupts.delivered():
                    result = stage(src, metadata)
            finally:
                guard.immediate = False   # first, and a plain store: no interrupt reaches the restore
                scope.exit()
        if after is not None:
            after(metadata)
        return result

    return run_with_llvm_options


def _wrap_stages(backend, stages: dict, options, language, pipeline: Pipeline, stock_cubin, capability) -> None:
    from . import _triton_compat as compat

    if "llir" not in stages or "ptx" not in stages:
        if pipeline.is_empty:
            return
        raise PipelineError(f"tritonpatch pipelines support the NVIDIA backend only; this compile has the "
                            f"stages {list(stages)} and the Pipeline {pipeline!r}")
    triton_names = compat.disable_llvm_opt_names()
    _warn_if_triton_overrides(pipeline, triton_names, compat.forced_llvm_flags())
    log = _log_compile(pipeline) if logger.isEnabledFor(logging.INFO) else None
    stages["llir"] = _with_llvm_options(stages["llir"], pipeline.llvm, triton_names)
    stages["ptx"] = _with_llvm_options(stages["ptx"], pipeline.llvm, triton_names, after=log)
    if pipeline.ptxas:
        if stages.get("cubin") is not stock_cubin:
            raise PipelineError("another stages hook replaced Triton's cubin stage, so tritonpatch cannot pass "
                                f"the ptxas flags {list(pipeline.ptxas)}; drop ptxas= or that hook")
        stages["cubin"] = compat.cubin_stage_with_ptxas_options(backend, options, pipeline.ptxas)
    if not pipeline.is_empty:
        first = next(iter(stages))
        stages[first] = _recording_pipeline(stages[first], pipeline)
    if pipeline.passes:
        if compat.is_triton_language(language) and compat.ir_locations_from_stored_files():
            _skip_passes_under_ir_locations(pipeline)
        elif compat.is_triton_language(language):
            _PatchedCompile(stages, pipeline.passes, env.strict(),
                            shared_memory_limit=shared_memory_per_block(capability))
        else:
            logger.debug("IR passes skipped for a %s kernel (hand-written TTGIR)", language)


_warned_overrides: set = set()


def _warn_if_triton_overrides(pipeline: Pipeline, triton_names: tuple[str, ...], forced: tuple[str, ...]) -> None:
    """Triton sets some LLVM options to true inside its llir/ptx stages, after the scope applied the
    Pipeline's: those ``DISABLE_LLVM_OPT=a,b`` names, and the flags its ptx stage always passes (``forced``,
    e.g. ``nvptx-mad-wide-opt``). Say so (once per set of options) when the Pipeline asks for another value
    of one of them: that value has no effect."""
    overridden = tuple((name, value) for name, value in pipeline.llvm
                       if name in triton_names + forced and value is not True)
    if not overridden or (overridden, triton_names) in _warned_overrides:
        return
    _warned_overrides.add((overridden, triton_names))
    asked = ", ".join(f"{name}={value!r}" for name, value in overridden)
    by_variable = [name for name, _ in overridden if name in triton_names]
    fix = (f"unset DISABLE_LLVM_OPT (or leave {', '.join(by_variable)} out of it)" if by_variable else
           "leave these options out of the Pipeline")
    user_warnings.warn(f"tritonpatch: Triton overrides {asked} of the Pipeline: it sets "
                       f"{', '.join(name for name, _ in overridden)} to true inside its llir/ptx stages (the flags "
                       f"of its ptx stage{', DISABLE_LLVM_OPT=' + ','.join(triton_names) if triton_names else ''}), "
                       f"after tritonpatch applied the Pipeline's, so these kernels compile with "
                       f"{', '.join(f'{n}=True' for n, _ in overridden)}; {fix}")


_warned_ir_locations = False


def _skip_passes_under_ir_locations(pipeline: Pipeline) -> None:
    """With ``TRITON_USE_IR_LOC`` Triton rewrites a stored stage output's locations before the next
    stage, so the later stages cannot be compiled ahead from the patched module, and without that
    neither a backend failure nor a changed contraction (the exactness check) could be caught: the
    passes do not run (PassError under strict; otherwise one warning per process)."""
    global _warned_ir_locations
    what = (f"tritonpatch: the IR passes {[name for name, _ in pipeline.passes]} do not run while TRITON_USE_IR_LOC is set: "
            f"Triton then rewrites each stage's output before the next, so the patched kernel cannot be checked "
            f"against the unpatched one")
    if env.strict():
        raise PassError(f"{what}; unset TRITON_USE_IR_LOC to run them")
    if not _warned_ir_locations:
        _warned_ir_locations = True
        user_warnings.warn(f"{what}; kernels compile without them (unset TRITON_USE_IR_LOC to run them)")


_PASS_STAGES = ("ttir", "ttgir")
_ELIDE = "elide-uniform-masks"          # the pass whose copies drop selects: the one retried without
_CHECK_COMPILE = "tritonpatch_check_compile"   # in the throwaway metadata of the exactness check's compile
_MESSAGE_LIMIT = 600


class _PatchedCompile:
    """The stages of one compile whose Pipeline has IR passes; installs itself into ``stages``.

    When a stage's passes change its module, the stages after it run at once on the patched
    module (LLVM options, ptxas flags and later passes included), and Triton's own calls of those
    stages get what was computed ahead: copies of the MLIR modules as they were before the next
    stage rewrote them in place, and the LLVM IR, PTX and cubin as they are. A later call gets a
    real run instead whenever Triton hands it anything but the output computed ahead (an override
    file replaced it). If a stage ahead fails, the stage that ran the passes hands on its unpatched
    output, the rest of the compile runs without passes, and nothing computed ahead is used.
    A patched kernel that needs more shared memory per block than ``shared_memory_limit`` (the
    GPU's; loop copies are software-pipelined each with buffers of their own, which Triton's
    allocator overlaps only where their lifetimes are disjoint) counts as such a failure: it could
    never launch, and so does one whose loops fuse multiply-adds differently from the unpatched
    kernel's (:mod:`.passes.float_contraction`; the unpatched module is compiled to PTX too, to
    compare): it would not compute the unpatched results bit for bit. When the Pipeline has other
    passes besides elide-uniform-masks, such a kernel is first compiled again without that pass.
    """

    def __init__(self, stages: dict, specs: tuple, strict: bool, shared_memory_limit: int | None = None):
        self.order = list(stages)
        self.inner = dict(stages)
        self.specs = specs
        self.strict = strict
        self.ahead: dict = {}  # stage -> (what Triton will hand it, what it returns)
        self.shared_memory_limit = shared_memory_limit
        self.patching = True
        for name in self.order:
            stages[name] = functools.partial(self.run, name)

    def run(self, name: str, src, metadata: dict):
        planned = self.ahead.pop(name, None)
        if planned is not None and planned[0] is src:
            return planned[1]
        self.ahead.clear()
        output = self.inner[name](src, metadata)
        if not self.patching or name not in _PASS_STAGES:
            return output
        outcome = self._passes(name, output, metadata)
        if outcome.module is output:
            return outcome.module
        return self._run_ahead(name, output, outcome, metadata)

    def _passes(self, name: str, module, metadata: dict):
        outcome = apply_stage_passes(name, module, self.specs, strict=self.strict)
        if outcome.fallback is not None:
            _record_fallback(metadata, outcome.fallback)
        return outcome

    def _run_ahead(self, name: str, unpatched, outcome, metadata: dict):
        """Compile the stages after ``name`` from ``outcome.module`` now (on a copy of the metadata);
        return what stage ``name`` hands on: the patched module, or ``unpatched`` after a failure."""
        trial = dict(metadata)
        reports = list(outcome.reports)
        module, shown = outcome.module, _stored_copy(outcome.module)
        first_shown, ahead, stage = shown, {}, name
        try:
            for stage in self.order[self.order.index(name) + 1:]:
                output = self.inner[stage](module, trial)
                self._check_resources(trial)
                if stage in _PASS_STAGES:
                    later = self._passes(stage, output, trial)
                    reports += later.reports
                    output = later.module
                output_shown = _stored_copy(output)
                ahead[stage] = (shown, output_shown)
                module, shown = output, output_shown
            if "ptx" in ahead:
                stage = "ptx"
                patched_ttgir = first_shown if name == "ttgir" else ahead["ttgir"][1]
                self._check_contraction(name, unpatched, str(patched_ttgir), ahead["ptx"][1], metadata)
        except PassError:
            raise  # a pass failed under strict: apply_stage_passes said why
        except Exception as exc:  # noqa: BLE001 - any later failure of a patched compile: fall back
            names = {spec[0] for spec in self.specs}
            if isinstance(exc, ContractionChanged) and not self.strict and _ELIDE in names and len(names) > 1:
                return self._without_elide(name, unpatched, exc, reports, metadata)
            return self._fall_back(stage, exc, unpatched, reports, metadata)
        metadata.update(trial)
        self.ahead = ahead
        return first_shown

    def _without_elide(self, name: str, unpatched, exc: Exception, reports: list, metadata: dict):
        """The exactness check refused a compile with elide-uniform-masks (whose rewritten loops drop the
        select): compile ``unpatched`` again with the other passes, which keep every loop body as it
        is; the check runs again on the result."""
        for report in reports:
            report.kept = False
        kernel = reports[0].kernel if reports else "?"
        message = (f"tritonpatch: kernel {kernel!r}: elide-uniform-masks dropped, its rewritten loops are not exact "
                   f"({exc}); compiled with the other passes")
        user_warnings.warn(message)
        _record_fallback(metadata, message)
        self.specs = tuple(spec for spec in self.specs if spec[0] != _ELIDE)
        outcome = self._passes(name, unpatched, metadata)
        if outcome.module is unpatched:
            return unpatched
        return self._run_ahead(name, unpatched, outcome, metadata)

    def _check_contraction(self, name: str, unpatched, patched_ttgir: str, patched_ptx: str, metadata: dict) -> None:
        """Compile a copy of ``unpatched`` (the output of stage ``name``) to PTX without passes and
        raise :class:`ContractionChanged` where a patched reduction runs on another layout
        (:mod:`.passes.reduction_layouts`) or a patched loop fuses multiply-adds differently
        (:mod:`.passes.float_contraction`): either way its results would differ in the low bits."""
        module, trial = _stored_copy(unpatched), {**metadata, _CHECK_COMPILE: True}
        unpatched_ttgir = str(unpatched) if name == "ttgir" else None
        try:
            for stage in self.order[self.order.index(name) + 1:]:
                module = self.inner[stage](module, trial)
                if stage == "ttgir":
                    unpatched_ttgir = str(module)
                if stage == "ptx":
                    break
        except Exception as exc:  # noqa: BLE001 - without the unpatched PTX nothing can be checked
            raise ContractionChanged(f"the unpatched module, compiled to PTX to check the patched one, failed in the "
                                     f"{stage} stage ({type(exc).__name__}: {exc})") from exc
        layouts = reduction_layout_changes(unpatched_ttgir, patched_ttgir) if unpatched_ttgir else []
        if layouts:
            raise ContractionChanged("the patched kernel reduces in another order than the unpatched one (Triton laid "
                                     "the reduced values out differently), which changes the low bits of the results: "
                                     + _first_three(layouts))
        changes = contraction_changes(module, patched_ptx)
        if changes:
            raise ContractionChanged("the patched loops fuse multiply-adds differently from the unpatched loop, "
                                     "which changes the low bits of the results: " + _first_three(changes))

    def _check_resources(self, metadata: dict) -> None:
        shared = metadata.get("shared")
        if self.shared_memory_limit is not None and isinstance(shared, int) and shared > self.shared_memory_limit:
            raise OutOfSharedMemory(f"the patched kernel needs {shared} bytes of shared memory per block, over the "
                                    f"GPU's {self.shared_memory_limit}")

    def _fall_back(self, stage: str, exc: Exception, unpatched, reports: list, metadata: dict):
        self.patching = False
        applied = list(dict.fromkeys(report.name for report in reports if report.kept))
        for report in reports:
            report.kept = False
        kernel = reports[0].kernel if reports else "?"
        failure = f"{type(exc).__name__}: {exc}"
        if len(failure) > _MESSAGE_LIMIT:
            failure = failure[:_MESSAGE_LIMIT] + f"… ({len(failure)} characters)"
        if isinstance(exc, ContractionChanged):
            what = f"kernel {kernel!r} compiled with the IR passes {applied} is not exact: {exc}"
        else:
            what = f"kernel {kernel!r} failed in the {stage} stage after the IR passes {applied} ({failure})"
        if self.strict:
            raise PassError(f"{what}; without {env.STRICT}=1 tritonpatch compiles it without the passes") from exc
        message = f"tritonpatch: {what}; compiled it without the passes"
        user_warnings.warn(message)
        _record_fallback(metadata, message)
        return unpatched


class OutOfSharedMemory(RuntimeError):
    """A patched kernel would need more shared memory than its GPU has: it could never launch."""


class ContractionChanged(RuntimeError):
    """A patched kernel's loops fuse multiplies and adds into FMAs where the unpatched kernel's do
    not, or the other way round: it would not compute the unpatched kernel's results bit for bit
    (or the unpatched module could not be compiled to check that)."""


def _first_three(changes: list[str]) -> str:
    """The first three of the exactness check's findings, and how many more there are."""
    more = f" (and {len(changes) - 3} more)" if len(changes) > 3 else ""
    return "; ".join(changes[:3]) + more


def _stored_copy(module):
    """What Triton stores and hands to the next stage for a stage output computed ahead: MLIR
    modules are copied (the next stage already rewrote the original in place), text and binaries
    are immutable. The compile itself always runs on the originals, so its LLVM IR, PTX and cubin
    are those of a stage-by-stage compile; a re-parsed copy prints some SSA value names (loop
    arguments) differently, so the stored ``ttgir`` text of a patched compile can differ in names."""
    from . import _triton_compat as compat

    return parse_module(str(module), module.context) if compat.is_mlir_module(module) else module


# What tritonpatch writes into a kernel's metadata (``<kernel>.json`` in Triton's cache, and
# ``kernel.metadata``): the Pipeline's canonical form (``Pipeline.to_dict()``) and fingerprint, and
# a note when its passes fell back to the unpatched IR. A compile with an empty Pipeline writes none.
PIPELINE_KEY = "tritonpatch_pipeline"
FINGERPRINT_KEY = "tritonpatch_fingerprint"
FALLBACK_KEY = "tritonpatch_fallback"


def _recording_pipeline(stage: Callable, pipeline: Pipeline) -> Callable:
    """``stage`` (the compile's first), recording ``pipeline`` in the kernel's metadata first, so
    that a cache entry says what built it (``tritonpatch compare --cache-dir``)."""
    record, fingerprint = pipeline.to_dict(), pipeline.fingerprint()

    def run(src, metadata):
        metadata[PIPELINE_KEY] = record
        metadata[FINGERPRINT_KEY] = fingerprint
        return stage(src, metadata)
    return run


def _record_fallback(metadata: dict, message: str) -> None:
    """Note in the kernel's metadata (stored with the artifact) that passes were dropped."""
    previous = metadata.get(FALLBACK_KEY)
    metadata[FALLBACK_KEY] = f"{previous}; {message}" if previous else message


def _log_compile(pipeline: Pipeline) -> Callable:
    def log(metadata):
        if metadata.get(_CHECK_COMPILE):
            return                     # the unpatched compile of the exactness check is not the kernel's
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
        for line in env.unknown_variables():
            user_warnings.warn(f"tritonpatch: {line}")
        _configure_logging()
        hook = _StagesHook(compat.get_stages_hook())
        compat.set_stages_hook(hook)
        compat.patch_cache_keys(memory_tag=current_cache_tag, disk_tag=_disk_cache_tag)
        compat.link_redis_knobs()
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


def ensure_outermost() -> None:
    """Make tritonpatch's stages hook the one Triton calls again, if the slot was changed since the install:
    ``knobs.runtime.scope()`` puts back what it found on exit (None, or a hook of ours from before), and
    other code may set its own hook or None. A compile would then run without the Pipeline's settings,
    and on 3.6 still be stored under the Pipeline's disk key, where a later hooked process asking for
    those settings would be served it. A foreign hook found in the slot is chained below ours (and the
    hook of ours it may chain to is deactivated, so nothing is applied twice); one of ours is reactivated."""
    global _hook
    from . import _triton_compat as compat

    if _hook is None or compat.get_stages_hook() is _hook:
        return
    with _install_lock:
        current = compat.get_stages_hook()
        if _hook is None or current is _hook:
            return
        _hook.active = False
        if isinstance(current, _StagesHook):
            hook = current
        else:
            hook = _StagesHook(current)
            compat.set_stages_hook(hook)
        hook.active = True
        _hook = hook
        logger.debug("the stages hook was replaced after the install (found %r): tritonpatch's is outermost again",
                     current)


def _disk_cache_tag() -> str:
    """The Pipeline tag of the 3.6 disk key (:func:`_current.keyed_cache_tag`), checking first that the
    compile about to run goes through tritonpatch's stages hook (:func:`ensure_outermost`)."""
    tag = keyed_cache_tag()
    if tag:
        ensure_outermost()
    return tag
