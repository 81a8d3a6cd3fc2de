"""TMA (Hopper's tensor memory accelerator) on the host side: whether tensors allow it, and the
descriptor the kernels load ``[1, 1, rows, D]`` tiles through."""
from __future__ import annotations

import torch


def tma_compatible(*tensors: torch.Tensor) -> bool:
    """TMA needs unit stride in D, 16-byte aligned other strides and base addresses."""
    return all(t.stride(-1) == 1 and t.data_ptr() % 16 == 0
               and all((s * t.element_size()) % 16 == 0 for s in t.stride()[:-1]) for t in tensors)


def tile_descriptor(t: torch.Tensor, block_rows: int):
    """A host-side TMA descriptor over all of ``t`` ``[B, H, S, D]`` moving ``[1, 1, block_rows, D]`` tiles."""
    from triton.tools.tensor_descriptor import TensorDescriptor   # Triton >= 3.4; the kernels need 3.6

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, block_rows, t.shape[-1]])
