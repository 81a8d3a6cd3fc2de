"""Every difference between the Gluon APIs of the supported Tritons that the Gluon kernels meet, in
one place (as :mod:`.triton_compat` is for Triton's runtime).

* TMA copies: ``tma.async_copy_global_to_shared`` / ``async_copy_shared_to_global`` (Triton 3.6)
  were renamed ``tma.async_load`` / ``async_store`` (the old names raise from Triton 3.9 on).

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
