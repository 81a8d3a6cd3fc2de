"""Every difference between the Gluon APIs of the supported Tritons that the Gluon kernels meet, in
one place (as :mod:`.triton_compat` is for Triton's runtime).

* TMA copies: ``tma.async_copy_global_to_shared`` / ``async_copy_shared_to_global`` (Triton 3.6)
  were renamed ``tma.async_load`` / ``async_store`` (the old names raise from Triton 3.9 on).
* TMA reduce-add (``cp.reduce.async.bulk.tensor``, shared to global): ``tma.async_atomic_add`` from
  Triton 3.8 on; 3.6 binds only the builder's ``create_async_tma_reduce``, wrapped here as a builtin.

The names below are Gluon builtins, so ``@gluon.jit`` code calls them like Triton's own.
"""
from __future__ import annotations

from triton.experimental.gluon.language.nvidia.hopper import tma

if hasattr(tma, "async_load"):
    tma_load = tma.async_load
    tma_store = tma.async_store
else:   # Triton 3.6
    tma_load = tma.async_copy_global_to_shared
    tma_store = tma.async_copy_shared_to_global


if hasattr(tma, "async_atomic_add"):
    tma_reduce_add = tma.async_atomic_add
else:   # Triton 3.6
    from triton._C.libtriton import ir
    from triton.experimental.gluon.language._core import builtin

    @builtin
    def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """Add the shared-memory tile ``src`` into the global tile at ``coord`` of ``tensor_desc``."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                  src.handle)
