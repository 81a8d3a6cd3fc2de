"""Kernel authoring with per-kernel pipelines.

- ``@tritonpatch.jit(pipeline=...)``: a ``triton.jit`` whose compiles always use one Pipeline
  (it wins over ``options()`` and the ``TRITONPATCH_*`` variables). Every launch, warmup and
  preload runs inside :func:`~tritonpatch.use_pipeline`, so the hooks fold the Pipeline's
  fingerprint into the disk and in-memory cache keys; the Pipeline also joins the function's
  ``cache_key``, so ``triton.autotune(cache_results=True)`` stacked above keeps one result per
  Pipeline. Called from another kernel it is inlined into the caller and compiled with the
  caller's Pipeline (a Pipeline acts on a whole compile, not on one function inside it).
- ``tritonpatch.autotune(configs, key, pipelines=[...])``: ``triton.autotune`` over the cross
  product of launch configs and Pipelines. Each candidate is a :class:`PipelineConfig` whose
  Pipeline fingerprint rides in its kwargs, so Triton's own hashing, pruning, printing and disk
  cache tell the Pipelines apart; the fingerprint is taken out again right before the kernel runs.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import sys
import time
from typing import Any, Callable, Iterable, Mapping

import triton
from triton import knobs
from triton.runtime.autotuner import Autotuner, Config
from triton.runtime.jit import JITFunction

from .errors import PipelineError
from .pipeline import Pipeline, as_pipeline
from .scope import use_pipeline
from .targets import compile_for_target

__all__ = ["jit", "autotune", "PipelineJITFunction", "PipelineAutotuner", "PipelineConfig", "PIPELINE_KWARG"]

logger = logging.getLogger("tritonpatch")

# The launch keyword that carries a candidate's Pipeline fingerprint inside tritonpatch.autotune.
PIPELINE_KWARG = "tritonpatch_pipeline"

_JIT_KEYWORDS = frozenset(inspect.signature(triton.jit).parameters) - {"fn"}
_AUTOTUNE_KEYWORDS = frozenset(inspect.signature(triton.autotune).parameters) - {"configs", "key"}
# A sweep this long shows progress on an interactive stderr without being asked.
PROGRESS_MIN_CONFIGS = 16


def _check_keywords(given: Mapping, allowed: frozenset, where: str) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise TypeError(f"{where} got unknown keyword(s) {unknown}; it passes these on: {sorted(allowed)}")


# --- @tritonpatch.jit ---------------------------------------------------------------------------

class PipelineJITFunction(JITFunction):
    """A ``triton.JITFunction`` whose compiles use ``pipeline`` (None: whatever is in effect at
    launch, exactly like ``triton.jit``)."""

    def __init__(self, fn, pipeline: Pipeline | None = None, **triton_jit_kwargs):
        super().__init__(fn, **triton_jit_kwargs)
        self.pipeline = pipeline

    def pipeline_scope(self):
        """The block this kernel's compiles run in: ``use_pipeline(pipeline)``, or nothing without one
        (:func:`tritonpatch.targets.compile_for_target` enters it too)."""
        return contextlib.nullcontext() if self.pipeline is None else use_pipeline(self.pipeline)

    def run(self, *args, **kwargs):
        with self.pipeline_scope():
            return super().run(*args, **kwargs)

    def preload(self, specialization_data):
        with self.pipeline_scope():
            return super().preload(specialization_data)

    @property
    def cache_key(self) -> str:
        key = super().cache_key
        return key + self.pipeline.cache_tag if self.pipeline is not None else key

    def compile_for_target(self, signature: Mapping[str, str], constexprs: Mapping[str, Any] | None = None,
                           target: str = "sm_90", **options):
        """:func:`tritonpatch.targets.compile_for_target` of this kernel, which compiles under its Pipeline
        (no GPU needed)."""
        return compile_for_target(self, signature, constexprs, target=target, **options)

    def __repr__(self):
        return f"tritonpatch.jit({self.module}:{self.fn.__qualname__}, pipeline={self.pipeline!r})"


def jit(fn: Callable | None = None, *, pipeline: Pipeline | Mapping | None = None, **triton_jit_kwargs):
    """Drop-in for ``triton.jit`` (same keywords) whose compiles always use ``pipeline``.

    ``@tritonpatch.jit`` alone behaves like ``triton.jit`` (the Pipeline in effect at launch is
    used); ``@tritonpatch.jit(pipeline=Pipeline(...) or {...})`` fixes the Pipeline, ignoring
    ``options()`` and the environment; ``pipeline=Pipeline()`` fixes Triton's defaults. Under
    ``TRITON_INTERPRET=1`` nothing is compiled, so this returns Triton's interpreted function with
    a ``pipeline`` attribute for introspection and a ``compile_for_target`` that raises the
    ValueError :func:`tritonpatch.targets.compile_for_target` gives for it (which says to unset
    TRITON_INTERPRET)."""
    _check_keywords(triton_jit_kwargs, _JIT_KEYWORDS, "tritonpatch.jit")
    resolved = None if pipeline is None else as_pipeline(pipeline, "tritonpatch.jit(pipeline=...)")

    def decorate(fn: Callable):
        if knobs.runtime.interpret:
            interpreted = triton.jit(fn, **triton_jit_kwargs)
            interpreted.pipeline = resolved
            interpreted.compile_for_target = functools.partial(compile_for_target, interpreted)
            return interpreted
        return PipelineJITFunction(fn, pipeline=resolved, **triton_jit_kwargs)

    return decorate if fn is None else decorate(fn)


# --- tritonpatch.autotune -----------------------------------------------------------------------

class PipelineConfig(Config):
    """A ``triton.Config`` plus the Pipeline its compiles use.

    The fingerprint sits in ``kwargs[PIPELINE_KWARG]`` (so Triton hashes, compares, prints and
    caches candidates per Pipeline); ``all_kwargs()`` therefore carries it too, and the
    autotuner removes it before the kernel sees its keywords. ``pipeline`` lives in a slot, out
    of ``__dict__``, which Triton's autotune disk cache serializes to JSON."""

    __slots__ = ("pipeline",)

    def __init__(self, config: Config, pipeline: Pipeline):
        fields = dict(config.__dict__)
        kwargs = dict(fields.pop("kwargs"))
        if PIPELINE_KWARG in kwargs:
            raise PipelineError(f"{PIPELINE_KWARG!r} is reserved by tritonpatch.autotune; rename that meta-parameter")
        kwargs[PIPELINE_KWARG] = pipeline.fingerprint()
        super().__init__(kwargs, **fields)
        self.pipeline = pipeline

    @property
    def launch_config(self) -> Config:
        """The plain ``triton.Config`` (without the Pipeline)."""
        fields = dict(self.__dict__)
        kwargs = {k: v for k, v in fields.pop("kwargs").items() if k != PIPELINE_KWARG}
        return Config(kwargs, **fields)

    def describe(self) -> str:
        return f"{self.launch_config}, pipeline: {self.pipeline!r}"

    def __reduce__(self):
        return (PipelineConfig, (self.launch_config, self.pipeline))


class _RunInPipeline:
    """Stands between the Autotuner and the kernel: takes the Pipeline fingerprint out of the
    launch keywords and runs (or warms up) the kernel inside that Pipeline."""

    def __init__(self, fn, pipelines: Mapping[str, Pipeline]):
        self.fn = fn
        self.arg_names = fn.arg_names
        self.pipelines = pipelines

    def run(self, *args, **kwargs):
        with use_pipeline(self.pipelines[kwargs.pop(PIPELINE_KWARG)]):
            return self.fn.run(*args, **kwargs)

    def warmup(self, *args, **kwargs):
        with use_pipeline(self.pipelines[kwargs.pop(PIPELINE_KWARG)]):
            return self.fn.warmup(*args, **kwargs)


class _SweepProgress:
    """One status line on stderr per benchmarked candidate (rewritten in place on a terminal)."""

    def __init__(self, name: str, total: int, stream):
        self.name, self.total, self.stream = name, total, stream
        self.done, self.best, self.start = 0, None, time.perf_counter()
        self.rewrite = stream.isatty()

    def step(self, config: PipelineConfig, timing: float) -> None:
        self.done += 1
        if self.best is None or timing < self.best[0]:
            self.best = (timing, config)
        line = (f"[tritonpatch.autotune] {self.name}: {self.done}/{self.total} configs, "
                f"{time.perf_counter() - self.start:.1f} s, best {self.best[0]:.4f} ms ({self.best[1].describe()})")
        end = "\n" if not self.rewrite or self.done == self.total else ""
        self.stream.write(("\r\033[K" if self.rewrite else "") + line + end)
        self.stream.flush()


def _median(timing) -> float:
    return float(timing[0] if isinstance(timing, (list, tuple)) else timing)


class PipelineAutotuner(Autotuner):
    """``triton.runtime.autotuner.Autotuner`` over launch configs x Pipelines.

    ``best_config`` is a :class:`PipelineConfig` (``.pipeline``, ``.launch_config``); each sweep
    ends with an INFO line on the ``tritonpatch`` logger naming the winner and its Pipeline."""

    def __init__(self, fn, arg_names, configs, key, pipelines: Iterable, *, progress: bool | None = None,
                 reset_to_zero=None, restore_value=None, prune_configs_by: Mapping | None = None, **autotuner_kwargs):
        resolved = resolve_pipelines(pipelines)
        _check_no_fixed_pipeline(fn)
        self.pipelines = resolved
        launch_configs = list(configs) or [Config({}, num_warps=4, num_stages=3, num_ctas=1)]
        candidates = [PipelineConfig(config, pipeline) for config in launch_configs for pipeline in resolved.values()]
        if prune_configs_by and prune_configs_by.get("perf_model") is not None:
            prune_configs_by = {**prune_configs_by, "perf_model": _without_pipeline_kwarg(prune_configs_by["perf_model"])}
        self.progress = progress
        self._sweep: _SweepProgress | None = None
        super().__init__(_RunInPipeline(fn, resolved), arg_names, candidates, key, reset_to_zero, restore_value,
                         prune_configs_by=prune_configs_by, **autotuner_kwargs)

    def _as_pipeline_config(self, config: Config) -> PipelineConfig:
        """A candidate read back from Triton's disk cache is a plain Config: give it its Pipeline."""
        if isinstance(config, PipelineConfig):
            return config
        fields = dict(config.__dict__)
        kwargs = dict(fields.pop("kwargs"))
        pipeline = self.pipelines[kwargs.pop(PIPELINE_KWARG)]
        return PipelineConfig(Config(kwargs, **fields), pipeline)

    def prune_configs(self, kwargs):
        pruned = super().prune_configs(kwargs)
        if any(PIPELINE_KWARG not in config.kwargs for config in pruned):
            raise PipelineError("early_config_prune returned configs without a Pipeline; return (a subset of) the "
                                "PipelineConfigs it was given (filter on config.pipeline / config.kwargs)")
        show = self.progress if self.progress is not None else (
            len(pruned) >= PROGRESS_MIN_CONFIGS and sys.stderr.isatty())
        self._sweep = _SweepProgress(self.base_fn.__name__, len(pruned), sys.stderr) if show else None
        self._sweep_start, self._sweep_timings = time.perf_counter(), {}
        return pruned

    def _bench(self, *args, config, **meta):
        timing = super()._bench(*args, config=config, **meta)
        self._sweep_timings[config] = _median(timing)
        if self._sweep is not None:
            self._sweep.step(config, _median(timing))
        return timing

    def run(self, *args, **kwargs):
        self._sweep_timings = None
        result = super().run(*args, **kwargs)
        self.best_config = self._as_pipeline_config(self.best_config)
        if self._sweep_timings:  # this call benchmarked: report the winner
            logger.info("autotune %s: best %s: %.4f ms (%d candidates in %.2f s)", self.base_fn.__name__,
                        self.best_config.describe(), self._sweep_timings[self.best_config],
                        len(self._sweep_timings), time.perf_counter() - self._sweep_start)
        self._sweep, self._sweep_timings = None, None
        return result


def resolve_pipelines(pipelines: Iterable) -> dict[str, Pipeline]:
    """``{fingerprint: Pipeline}`` of a non-empty list of Pipelines or dicts, duplicates dropped."""
    if isinstance(pipelines, (Pipeline, Mapping, str)) or not isinstance(pipelines, Iterable):
        raise PipelineError(f"pipelines= takes a list of Pipelines (or dicts), got {pipelines!r}")
    resolved: dict[str, Pipeline] = {}
    for pipeline in pipelines:
        pipeline = as_pipeline(pipeline, "tritonpatch.autotune(pipelines=[...])")
        resolved.setdefault(pipeline.fingerprint(), pipeline)
    if not resolved:
        raise PipelineError("tritonpatch.autotune needs at least one Pipeline; pass pipelines=[tritonpatch.Pipeline()] "
                            "to tune launch configs only")
    return resolved


def _check_no_fixed_pipeline(fn) -> None:
    inner = fn
    while not isinstance(inner, JITFunction) and hasattr(inner, "fn"):
        inner = inner.fn
    if getattr(inner, "pipeline", None) is not None:
        raise PipelineError(f"{inner!r} fixes its own Pipeline, which would override every Pipeline that "
                            "tritonpatch.autotune tries; decorate it with a bare @tritonpatch.jit or @triton.jit")


def _without_pipeline_kwarg(perf_model: Callable) -> Callable:
    def perf_model_without_pipeline(**kwargs):
        kwargs.pop(PIPELINE_KWARG, None)
        return perf_model(**kwargs)
    return perf_model_without_pipeline


def autotune(configs: Iterable[Config], key: Iterable[str], pipelines: Iterable, *, progress: bool | None = None,
             **triton_autotune_kwargs):
    """``triton.autotune`` over ``configs`` x ``pipelines`` (Pipelines or dicts of their keywords).

    The other keywords are ``triton.autotune``'s (``prune_configs_by``, ``reset_to_zero``,
    ``restore_value``, ``pre_hook``, ``post_hook``, ``do_bench``, ``cache_results``, ...) and act
    on the cross product. ``progress``: a status line on stderr per candidate (None: only for
    sweeps of ``PROGRESS_MIN_CONFIGS`` or more candidates on a terminal)."""
    _check_keywords(triton_autotune_kwargs, _AUTOTUNE_KEYWORDS, "tritonpatch.autotune")
    configs, key, pipelines = list(configs), list(key), list(resolve_pipelines(pipelines).values())

    def decorator(fn):
        return PipelineAutotuner(fn, fn.arg_names, configs, key, pipelines, progress=progress,
                                 **triton_autotune_kwargs)

    return decorator
