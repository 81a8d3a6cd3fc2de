"""TMA (Hopper's tensor memory accelerator) on the host side: whether tensors allow it, and the
descriptor the kernels load ``[1, 1, rows, D]`` tiles through."""
from __future__ import annotations

import torch


def tma_compatible(*tensors: torch.Tensor) -> bool:
    """TMA needs unit stride in D, 16-byte aligned other strides and base addresses."""
    return all(t.stride(-1) == 1 and t.data_ptr() % 16 == 0
               and all((s * t.element_size()) % 16 == 0 for s in t.stride()[:-1]) for t in tensors)


def tile_descriptor(t: torch.Tensor, block_rows: int, gluon_layout=None):
    """A host-side TMA descriptor over all of ``t`` ``[B, H, S, D]`` moving ``[1, 1, block_rows, D]`` tiles:
    Triton's, or with ``gluon_layout`` (an ``NVMMASharedLayout``) Gluon's, which names the shared-memory
    layout the tiles land in."""
    block = [1, 1, block_rows, t.shape[-1]]
    if gluon_layout is None:
        from triton.tools.tensor_descriptor import TensorDescriptor   # Triton >= 3.4; the kernels need 3.6

        return TensorDescriptor(t, list(t.shape), list(t.stride()), block)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, gluon_layout)


def nvmma_layout(block_shape: list, dtype: torch.dtype):
    """The swizzled shared-memory layout (Gluon's ``NVMMASharedLayout``) a ``block_shape`` tile of ``dtype``
    lands in through TMA, as wgmma reads it."""
    from triton.experimental.gluon import language as gl

    element = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}[dtype]
    return gl.NVMMASharedLayout.get_default_for(block_shape, element)


def gluon_tile_descriptor(t: torch.Tensor, block_rows: int):
    """Gluon's host TMA descriptor over all of ``t`` moving ``[1, 1, block_rows, D]`` tiles into
    :func:`nvmma_layout`."""
    return tile_descriptor(t, block_rows, nvmma_layout([1, 1, block_rows, t.shape[-1]], t.dtype))


def gluon_descriptor_type(dtype: torch.dtype, block_rows: int, head_dim: int) -> str:
    """The compile-only signature type of :func:`gluon_tile_descriptor`'s descriptor."""
    from .._inputs import ELEMENT

    block = [1, 1, block_rows, head_dim]
    element = "fp32" if dtype == torch.float32 else ELEMENT[dtype]
    return f"tensordesc<{element}{block},{nvmma_layout(block, dtype)!r}>"


def descriptor_types() -> tuple:
    """The host TMA descriptor classes a launch may take: Triton's and Gluon's."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
    from triton.tools.tensor_descriptor import TensorDescriptor

    return (TensorDescriptor, GluonTensorDescriptor)
