"""Launching a fuzzer kernel on the GPU and comparing its outputs with the reference's.

Every buffer starts from deterministic contents (seeded by the kernel's seed); the outputs compare
bit for bit, except where ``finite_only`` (under ``skip-masked-blocks``): there the outputs must be
exactly equal wherever the unpatched output is finite. Side-effect outputs (counters, logs,
bitsets, trip counts) always compare bit for bit.
"""
from __future__ import annotations

from .kernel import Kernel

_TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "i32": "int32", "i8": "int8"}
SENTINEL = 1234.5


def initial_tensors(kernel: Kernel):
    """Deterministic initial contents of every buffer (CPU tensors, seeded by the kernel seed)."""
    import torch

    generator = torch.Generator().manual_seed(kernel.seed)
    tensors = {}
    for buffer in kernel.buffers:
        dtype = getattr(torch, _TORCH_DTYPES[buffer.dtype])
        if buffer.fill == "randn":
            value = torch.randn(buffer.shape, generator=generator) * 0.5
        elif buffer.fill == "uniform":
            value = torch.rand(buffer.shape, generator=generator) * 4.0
        elif buffer.fill == "table":
            value = torch.tensor(kernel.table)
        elif buffer.fill == "jumps":       # block jumps: back, none, forward by a few tiles
            value = torch.randint(-3, 6, buffer.shape, generator=generator) * kernel.tile[1]
        elif buffer.fill == "sentinel":
            value = torch.full(buffer.shape, SENTINEL if dtype.is_floating_point else -1)
        else:
            value = torch.zeros(buffer.shape)
        tensors[buffer.name] = value.to(dtype)
    return tensors


def launch(kernel: Kernel, compiled, initial: dict) -> dict:
    """Run ``compiled`` once on fresh copies of the buffers; the output and effect buffers (CPU)."""
    import torch

    buffers = {name: tensor.cuda() for name, tensor in initial.items()}
    unused = torch.zeros(16, device="cuda")                 # for the pointer parameters this kernel ignores
    args = [buffers.get(name, unused) if kind.startswith("*") else kernel.constexprs[name] if kind == "constexpr"
            else kernel.scalars[name] for name, kind in kernel.params]
    compiled[kernel.grid + (1,)](*args)
    torch.cuda.synchronize()
    return {b.name: buffers[b.name].cpu() for b in kernel.buffers if b.role != "input"}


_BIT_VIEWS = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}     # element size -> same-width integer dtype


def compare(kernel: Kernel, reference: dict, patched: dict, finite_only: bool) -> str | None:
    """None when ``patched`` matches ``reference``; else where it differs first."""
    import torch

    bit_views = {size: getattr(torch, name) for size, name in _BIT_VIEWS.items()}
    for buffer in kernel.buffers:
        if buffer.role == "input":
            continue
        ref, out = reference[buffer.name], patched[buffer.name]
        if buffer.role == "output" and finite_only:
            where = torch.isfinite(ref)
            differ = where & (out != ref)             # exact equality, -0.0 == +0.0
        else:
            bits = bit_views[ref.element_size()]
            differ = ref.view(bits) != out.view(bits)
        count = int(differ.sum())
        if count:
            index = tuple(int(i) for i in differ.nonzero()[0])
            return (f"{buffer.name}: {count} of {ref.numel()} elements differ"
                    f"{' where the unpatched output is finite' if buffer.role == 'output' and finite_only else ''};"
                    f" first at {list(index)}: unpatched {ref[index].item()!r}, patched {out[index].item()!r}")
    return None
