"""Where our Triton kernels can run: CUDA devices, or CPU tensors under ``TRITON_INTERPRET=1``.

``triton.jit`` decides at decoration time (from ``TRITON_INTERPRET``) whether functions are compiled
or interpreted, the Triton standard library included, so the interpreter is a per-process choice.

Under the interpreter, :func:`.triton_compat.fix_interpreter_index` is applied at import (Triton
3.6's interpreter and numpy >= 2.4). Every use of Triton's private runtime lives in
:mod:`.triton_compat`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
from collections import OrderedDict

import torch
import triton

from .compile_workers import DeferredCompiles
from .triton_compat import async_compile_active, async_compile_mode, fix_interpreter_index, slp_vectorizer_packs_masks


def interpreting() -> bool:
    """True when this process runs Triton kernels in the interpreter (``TRITON_INTERPRET=1``)."""
    return bool(triton.knobs.runtime.interpret)


def check_device(tensor: torch.Tensor, what: str) -> None:
    """Raise a clear error when ``tensor`` lives where our kernels cannot run."""
    if tensor.device.type == "cuda":
        return
    if tensor.device.type == "cpu" and interpreting():
        return
    raise ValueError(f"{what}: the Triton kernel needs CUDA tensors (got {tensor.device}); for CPU tensors "
                     "set TRITON_INTERPRET=1 before importing triton, or use tritonpatch.kernels.reference")


def launch(kernel, grid, args: tuple, kwargs: dict, warmup: bool = False):
    """``kernel[grid](*args, **kwargs)``, or with ``warmup`` compile it without launching (inside
    :func:`parallel_compiles`: when the block ends, in worker processes)."""
    if warmup:
        return kernel.warmup(*args, grid=grid, **kwargs)
    return kernel[grid](*args, **kwargs)


def replay_key(tensors: tuple, *parts):
    """A :class:`LaunchPlans` key: ``parts`` plus each tensor's shape, strides, dtype, device and
    16-byte alignment (None stays None), which of ``tensors`` are the same object (:func:`alias_pattern`),
    the current CUDA device and the Pipeline a compile would use now. None (nothing is replayed) for
    CPU tensors, under the interpreter or with ``TRITONPATCH_FAST_LAUNCH=0``."""
    from tritonpatch._current import current_cache_tag

    if not _replays_launches(tensors[0]):
        return None
    return (tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)
                  for t in tensors),
            alias_pattern(tensors), parts, _current_device(), current_cache_tag())


def alias_pattern(tensors: tuple) -> tuple:
    """For each of ``tensors``, the index of the first one that is the same object (None for None).

    A :class:`_Plan` finds each call tensor's kernel slots by object identity, so a launch recorded
    with ``attention(x, x, x)`` sends its first tensor to the Q, K and V slots: it may replay only
    for calls whose tensors alias the same way. Distinct objects over the same memory (views) are
    placed by identity too, so they need no entry of their own."""
    return tuple(None if t is None else next(i for i, other in enumerate(tensors) if other is t)
                 for t in tensors)


def _replays_launches(tensor: torch.Tensor) -> bool:
    from tritonpatch import env

    return tensor.is_cuda and not interpreting() and env.fast_launch()


def _current_device() -> int:
    return triton.runtime.driver.active.get_current_device()


class LRUCache:
    """At most ``capacity`` entries; the least recently used goes first. For the block-mask caches
    and the replay state, whose keys need not repeat (document ids of every batch make new ones)."""

    def __init__(self, capacity: int):
        self._items: OrderedDict = OrderedDict()
        self._capacity = capacity

    def get(self, key):
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key, value) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()


class LaunchPlans:
    """Kernel launches recorded per key and replayed with a later call's tensors (an LRU of plans).

    ``kernel[grid](...)`` binds and specializes each of our kernels' ~50 arguments and looks the
    compiled kernel up on every call (25-40 µs on the H200's host), after our launchers built those
    arguments (~50 µs more): small attention problems were host-bound
    (docs/benchmarks/launch_overhead.md). :meth:`launch` launches and records, under ``key``, the
    compiled kernel, the grid and the argument values, with the positions of the call's own tensors
    (``tensors``: passed directly or as the base of a TMA descriptor); :meth:`replay` launches that
    compiled kernel again with the next call's tensors in those positions.

    The key must fix everything else that reaches the kernel: shapes, strides, dtypes, devices, the
    16-byte alignment of each of ``tensors`` (Triton specializes pointers on it; TMA needs it), which
    of ``tensors`` are the same object (a plan records positions by identity), the identity of every
    other tensor argument (block masks, modifier arguments), the config and the
    Pipeline (see :func:`replay_key`). Plans keep no reference to the recorded call's own tensors."""

    def __init__(self, capacity: int = 256):
        self._plans = LRUCache(capacity)

    def replay(self, key, tensors: tuple) -> bool:
        """Launch the plan recorded under ``key`` with ``tensors``; False when there is none."""
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            return False
        plan.launch(tensors)
        return True

    def launch(self, key, kernel, grid, args: tuple, kwargs: dict, tensors: tuple, warmup: bool = False):
        """:func:`launch`, recording the launch under ``key`` (unless None, or with ``warmup``)."""
        compiled = launch(kernel, grid, args, kwargs, warmup)
        if key is not None and not warmup:
            self._plans.put(key, _Plan(compiled, kernel, grid, args, kwargs, tensors))
        return compiled

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        self._plans.clear()


class _Plan:
    """One recorded launch: the compiled kernel's launcher for the grid, the argument values in
    parameter order with the call's own tensors taken out, and where they go back in."""

    def __init__(self, compiled, kernel, grid, args: tuple, kwargs: dict, tensors: tuple):
        from .tma import descriptor_types

        tma_types = descriptor_types()
        bound = kernel.signature.bind(*args, **{name: value for name, value in kwargs.items()
                                                 if name in kernel.arg_names})
        bound.apply_defaults()
        values = [bound.arguments[name] for name in kernel.arg_names]
        self.slots = []   # (value index, tensor index, descriptor template or None)
        for i, value in enumerate(values):
            for j, tensor in enumerate(tensors):
                if tensor is None:
                    continue
                if value is tensor:
                    self.slots.append((i, j, None))
                elif isinstance(value, tma_types) and value.base is tensor:
                    self.slots.append((i, j, _with_base(value, None)))
                else:
                    continue
                values[i] = None
                break
        self.values = tuple(values)
        self.runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]

    def values_for(self, tensors: tuple) -> list:
        """The argument values (parameter order) of a launch with ``tensors``."""
        values = list(self.values)
        for i, j, template in self.slots:
            values[i] = tensors[j] if template is None else _with_base(template, tensors[j])
        return values

    def launch(self, tensors: tuple) -> None:
        self.runner(*self.values_for(tensors))


def _with_base(descriptor, base):
    """A shallow copy of a TMA descriptor over ``base`` (``copy.copy`` takes several µs; the
    dataclass constructor re-validates every field)."""
    copied = object.__new__(type(descriptor))
    copied.__dict__.update(descriptor.__dict__, base=base)
    return copied


@contextlib.contextmanager
def parallel_compiles():
    """Kernels warmed up inside compile when the block ends, on ``TRITONPATCH_COMPILE_THREADS`` forked
    worker processes and then as many threads here, which load what the workers stored in Triton's disk
    cache (:mod:`.compile_workers`; Triton's AsyncCompileMode, tritonpatch carrying each caller's Pipeline
    into its compile); the block waits for all of them, also when it is left by an exception. A compile
    that fails is left to fail again, with its error, when it launches. Sequential under the interpreter,
    with one thread, or inside a caller's own AsyncCompileMode."""
    from tritonpatch import env

    threads = env.compile_threads()
    if interpreting() or threads == 1 or async_compile_active():
        yield
        return
    # Hooked in before the first submit: a candidate compiling outside tritonpatch's hook does not take
    # its LLVM-option scope, so it could run while another candidate's Pipeline (disable-lsr) has
    # options applied process-wide, and be built and cached with them (seen on Triton 3.9).
    import tritonpatch

    tritonpatch.install()
    executor = DeferredCompiles(threads)
    with async_compile_mode(executor):
        try:
            yield
        finally:
            executor.run()   # also when the block fails: Triton keeps every submitted compile's future


# The tuners time every candidate this many times, the candidates in turn each round, and keep each one's
# median: a drift of the GPU's clocks while they tune falls on all candidates alike instead of on whichever
# was timed during it (on an H100 the three rounds of one kernel spread by up to 18%:
# docs/design/gluon_backward_no_slp_h100.json).
TUNING_ROUNDS = 3
TUNING_WARMUP_MS, TUNING_REP_MS = 2, 7   # do_bench's warm-up and repetitions per round


def fastest(candidates: list, launch_config, what: str):
    """The candidate whose ``launch_config(candidate)`` has the lowest median over TUNING_ROUNDS rounds of
    ``do_bench`` medians, the candidates timed in turn each round; ones that do not fit the GPU (shared
    memory, registers) are skipped, and none fitting is an error."""
    if len(candidates) == 1 or interpreting():   # the interpreter times nothing
        return candidates[0]
    rounds = {config: [] for config in candidates}
    for _ in range(TUNING_ROUNDS):
        for config in list(rounds):
            try:
                rounds[config].append(triton.testing.do_bench(lambda: launch_config(config), warmup=TUNING_WARMUP_MS,
                                                              rep=TUNING_REP_MS, return_mode="median"))
            except triton.runtime.errors.OutOfResources:
                del rounds[config]
    if not rounds:
        raise RuntimeError(f"{what}: no kernel configuration fits this GPU (shared memory/registers)")
    return min(rounds, key=lambda config: statistics.median(rounds[config]))


def _native_pipeline(**settings):
    """``Pipeline(**settings)``, or None when the native LLVM-option module is unavailable."""
    from tritonpatch import Pipeline, TritonpatchError

    try:
        return Pipeline(**settings)
    except TritonpatchError:
        return None


def with_pipeline(config, pipeline, label: str):
    """``config`` (a dataclass with ``pipeline`` and ``pipeline_label`` fields) also compiled through
    ``pipeline``: merged over the config's own Pipeline, the label appended to its own."""
    merged = pipeline if config.pipeline is None else config.pipeline.merge(pipeline)
    return dataclasses.replace(config, pipeline=merged,
                               pipeline_label="+".join(filter(None, (config.pipeline_label, label))))


def without_mask_bit_packing(configs: list, kernel: str) -> list:
    """``configs`` of ``kernel`` ("forward" or "backward") compiled with LLVM's SLP vectorizer off
    (``vectorize-slp=false``, label ``no-slp``) where it packs the masks of partial tiles into bit vectors
    (:func:`.triton_compat.slp_vectorizer_packs_masks`); unchanged elsewhere and without the native
    LLVM-option module. The arithmetic is the same, bit for bit; the partial tiles' loops are shorter
    (docs/design/gluon_forward.md)."""
    if not slp_vectorizer_packs_masks(kernel) or (pipeline := _native_pipeline(llvm={"vectorize-slp": False})) is None:
        return list(configs)
    return [with_pipeline(c, pipeline, "no-slp") for c in configs]


def pipeline_variants(configs: list) -> list:
    """The tritonpatch Pipeline tuning axis (disable-lsr, added to each config's own Pipeline) for the given
    kernel configs (dataclasses with ``pipeline`` and ``pipeline_label`` fields); none when the native
    LLVM-option module is unavailable."""
    pipeline = _native_pipeline(disable_lsr=True)
    if pipeline is None:
        return []
    return [with_pipeline(c, pipeline, "disable-lsr") for c in configs]


def pipeline_scope(pipeline):
    """The compiles inside run through ``pipeline`` (a tritonpatch.Pipeline; None: Triton's defaults)."""
    if pipeline is None:
        return contextlib.nullcontext()
    import tritonpatch

    return tritonpatch.use_pipeline(pipeline)


if interpreting():
    fix_interpreter_index()
