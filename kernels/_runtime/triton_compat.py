"""Every use of Triton's private runtime by the kernels, in one place (as ``tritonpatch._triton_compat``
is for the compiler hooks): scoped scratch memory for device-built TMA descriptors, Triton's
asynchronous compile mode, Triton's configured cache manager (which the tuning decisions are shared
through), one interpreter fix, and where Triton's LLVM packs masks into bit vectors.

Triton 3.6's interpreter converts scalars to loop bounds with ``int(array_of_shape_1)``, which
numpy >= 2.4 rejects ("only 0-dimensional arrays can be converted to Python scalars"); Triton 3.9
fixed it. :func:`fix_interpreter_index` applies the same fix when the installed Triton still has
the old code.
"""
from __future__ import annotations

import contextlib
import inspect

import torch


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


def async_compile_active() -> bool:
    """Whether the caller already compiles inside Triton's ``AsyncCompileMode``."""
    from triton.runtime import _async_compile

    return _async_compile.active_mode.get() is not None


def async_compile_mode(executor):
    """Triton's ``AsyncCompileMode`` on ``executor``: kernels warmed up inside compile there; a failed
    compile is left to fail again, with its error, at launch."""
    from triton.runtime import _async_compile

    return _async_compile.AsyncCompileMode(executor, ignore_errors=True)


def configured_cache_manager_class():
    """The class ``TRITON_CACHE_MANAGER`` names, or None when it names none or Triton's default
    ``FileCacheManager`` (whose files would only be a second local copy). Raises what Triton raises
    for a class it cannot import."""
    from triton import knobs
    from triton.runtime import cache

    manager_class = knobs.cache.manager_class
    return None if manager_class in (None, cache.FileCacheManager) else manager_class


def cache_manager(digest: str):
    """Triton's configured cache manager for ``digest`` (hex digits), as Triton builds one for a
    kernel; with Triton's Redis backend readable (``tritonpatch._triton_compat.link_redis_knobs``)."""
    from triton.runtime import cache
    from tritonpatch._triton_compat import link_redis_knobs

    link_redis_knobs()
    return cache.get_cache_manager(digest)


def fix_interpreter_index() -> None:
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


def triton_version() -> tuple[int, int]:
    """The installed Triton's (major, minor) version, as tritonpatch's compiler hooks read it."""
    from tritonpatch._triton_compat import TRITON_VERSION

    return TRITON_VERSION


def slp_vectorizer_packs_masks(kernel: str) -> bool:
    """Whether LLVM's SLP vectorizer, as this Triton runs it, turns the masks of ``kernel``'s partial tiles
    ("forward" or "backward": the Gluon forward and dK/dV kernels) into vectors of ``i1``, which the NVPTX
    backend lowers to bit packing (16-bit selects, shifts and ors around every score): the backward on every
    supported Triton (3.6, 3.8, 3.9), the forward on Triton 3.6 only. Measured compiles:
    docs/design/gluon_forward.md and gluon_backward.md; ``tests/cpu/test_kernels_gluon.py`` and ``_bwd.py``
    check both answers on each Triton."""
    if kernel == "backward":
        return True
    if kernel != "forward":
        raise ValueError(f"kernel is 'forward' or 'backward', got {kernel!r}")
    return triton_version() < (3, 7)
