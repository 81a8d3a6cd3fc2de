"""Where our Triton kernels can run: CUDA devices, or CPU tensors under ``TRITON_INTERPRET=1``.

``triton.jit`` decides at decoration time (from ``TRITON_INTERPRET``) whether functions are compiled
or interpreted, the Triton standard library included, so the interpreter is a per-process choice.

Triton 3.6's interpreter converts scalars to loop bounds with ``int(array_of_shape_1)``, which
numpy >= 2.4 rejects ("only 0-dimensional arrays can be converted to Python scalars"); Triton 3.9
fixed it. :func:`_fix_interpreter_index` applies the same fix when the installed Triton still has
the old code and the interpreter is on.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect

import torch
import triton


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


@contextlib.contextmanager
def device_allocator(needed: bool):
    """Scratch memory for kernels that build TMA descriptors on the device, scoped to the launch:
    the caller's own ``triton.set_allocator`` choice is used when there is one, and Triton's
    allocator (a context variable) is left as it was."""
    from triton.runtime import _allocation

    if not needed or not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        yield
        return
    token = _allocation._allocator.set(
        lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    try:
        yield
    finally:
        _allocation._allocator.reset(token)


def launch(kernel, grid, args: tuple, kwargs: dict, warmup: bool = False):
    """``kernel[grid](*args, **kwargs)``, or with ``warmup`` compile it without launching (inside
    :func:`parallel_compiles`: on a worker thread)."""
    if warmup:
        return kernel.warmup(*args, grid=grid, **kwargs)
    return kernel[grid](*args, **kwargs)


@contextlib.contextmanager
def parallel_compiles():
    """Kernels warmed up inside compile on ``TRITONPATCH_COMPILE_THREADS`` threads (Triton's
    AsyncCompileMode; tritonpatch carries each caller's Pipeline into its compile); the block waits
    for all of them. A compile that fails is left to fail again, with its error, when it launches.
    Sequential under the interpreter, with one thread, or inside a caller's own AsyncCompileMode."""
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime import _async_compile

    from tritonpatch import env

    threads = env.compile_threads()
    if interpreting() or threads == 1 or _async_compile.active_mode.get() is not None:
        yield
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="tritonpatch-compile") as executor, \
            _async_compile.AsyncCompileMode(executor, ignore_errors=True):
        yield


def fastest(candidates: list, launch_config, what: str):
    """The candidate whose ``launch_config(candidate)`` has the lowest ``do_bench`` median; ones that
    do not fit the GPU (shared memory, registers) are skipped, and none fitting is an error."""
    if len(candidates) == 1 or interpreting():   # the interpreter times nothing
        return candidates[0]
    timings = {}
    for config in candidates:
        try:
            timings[config] = triton.testing.do_bench(lambda: launch_config(config), warmup=5, rep=20,
                                                      return_mode="median")
        except triton.runtime.errors.OutOfResources:
            continue
    if not timings:
        raise RuntimeError(f"{what}: no kernel configuration fits this GPU (shared memory/registers)")
    return min(timings, key=timings.get)


def pipeline_variants(configs: list) -> list:
    """The tritonpatch Pipeline tuning axis (disable-lsr) for the given kernel configs (dataclasses
    with ``pipeline`` and ``pipeline_label`` fields); none when the native LLVM-option module is
    unavailable."""
    from tritonpatch import Pipeline, TritonpatchError

    try:
        pipeline = Pipeline(disable_lsr=True)
    except TritonpatchError:
        return []
    return [dataclasses.replace(c, pipeline=pipeline, pipeline_label="disable-lsr") for c in configs]


def pipeline_scope(pipeline):
    """The compiles inside run through ``pipeline`` (a tritonpatch.Pipeline; None: Triton's defaults)."""
    if pipeline is None:
        return contextlib.nullcontext()
    import tritonpatch

    return tritonpatch.use_pipeline(pipeline)


def _fix_interpreter_index() -> None:
    """Make ``tensor.__index__`` accept the interpreter's shape-[1] scalars (Triton < 3.9 + numpy >= 2.4)."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_tritonpatch_index_fix", False) or "squeeze" in inspect.getsource(original):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor._tritonpatch_index_fix = True
    interpreter._patch_lang_tensor = patch_lang_tensor


if interpreting():
    _fix_interpreter_index()
