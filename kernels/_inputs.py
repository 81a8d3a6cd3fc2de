"""The checks and descriptions of attention inputs that forward and backward share: supported
shapes and dtypes, block-mask fit, and the Triton type of a kernel argument (compile-only
signatures)."""
from __future__ import annotations

import torch

from ._identity import arguments_changed
from ._modifiers import TENSOR_ARGUMENT_TYPES
from .block_mask import BlockMask
from .masks import ALLOW_ALL_STRUCTURE, structure_name

LOG2E = 1.4426950408889634
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
# tensor dtype -> Triton's name, for q, k, v and the outputs
ELEMENT = {dtype: name for dtype, name in TENSOR_ARGUMENT_TYPES.items() if dtype.is_floating_point}


def validate_inputs(q, k, v, enable_gqa: bool) -> None:
    """Raise a clear error for shapes and dtypes the kernels do not support (devices: ``check_device``)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention: {name} must be [B, H, S, D], got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    # CPU tensors run in Triton's interpreter, whose bfloat16 dot is wrong (numpy has no bfloat16)
    allowed = (torch.float16, torch.float32) if q.device.type == "cpu" else (torch.float16, torch.bfloat16)
    if q.dtype not in allowed:
        raise TypeError(f"attention: dtype {q.dtype} is not supported on {q.device.type}; use float16 or "
                        "bfloat16 on the GPU, float16 or float32 in the interpreter (CPU), or "
                        "tritonpatch.kernels.reference")
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    batch, heads, _, head_dim = q.shape
    if batch == 0 or heads == 0:
        raise ValueError(f"attention: q has shape {tuple(q.shape)}; B and H must be positive")
    if k.shape != v.shape:
        raise ValueError(f"attention: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"attention: k/v shape {tuple(k.shape)} does not match q {tuple(q.shape)} in B or D")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"attention: head dim {head_dim} is not supported; use one of {SUPPORTED_HEAD_DIMS}")
    kv_heads = k.shape[1]
    if kv_heads != heads and not (enable_gqa and heads % kv_heads == 0):
        hint = "pass enable_gqa=True" if heads % kv_heads == 0 else "H must be a multiple of Hkv"
        raise ValueError(f"attention: q has {heads} head(s), k/v {kv_heads}: {hint}")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError("attention: sequence lengths must be positive")


def check_block_mask_source(block_mask: "BlockMask | None", mask_mod, what: str) -> None:
    """A ValueError when ``block_mask`` was built by :func:`.block_mask.build_block_mask` from a mask of
    another structure than ``mask_mod`` (``causal()`` for a ``sliding_window(4)`` call), from one of its
    structure with other scalar arguments, or from a tensor written since: its tile classes would then not be
    ``mask_mod``'s (full tiles run without the mask, empty ones are skipped). ``allow_all()`` takes any block
    mask (its partial tiles then run unmasked, as documented). The forward runs it on every call, replayed
    ones included (a few comparisons), so that the verdict never depends on earlier calls. The backward does
    not: it differentiates the forward that ran, and autograd refuses a write to the tensors that forward read
    (they are saved for it)."""
    built_from = None if block_mask is None else block_mask.built_from
    if built_from is None or mask_mod is None:
        return
    structure, args = built_from
    if structure != mask_mod.structure and mask_mod.structure != ALLOW_ALL_STRUCTURE:
        built, called = structure_name(structure), structure_name(mask_mod.structure)
        same_name = (" (another @triton.jit function of the same name: custom_mask tells device functions apart "
                     "by identity, so a factory that defines one per call makes a new mask each time; define "
                     "the device function once)") if built == called else ""
        raise ValueError(f"{what}: block_mask was built from {built}, the call's mask_mod is {called}{same_name}; "
                         "its tile classes do not describe this mask. Build it from the mask you call with "
                         "(build_block_mask(mask_mod, ...)), or leave block_mask out: the attention builds and "
                         "caches it")
    if structure == mask_mod.structure and arguments_changed(args, mask_mod.args):
        raise ValueError(f"{what}: block_mask was built from {mask_mod.name} with other arguments, or before one of "
                         "its tensors was written in place (doc_ids.copy_(...)); its tile classes do not describe "
                         "this mask. Build it again after changing the mask (build_block_mask), or leave "
                         "block_mask out: the attention builds and caches it")


def check_block_mask(block_mask: BlockMask, batch: int, heads: int, q_len: int, kv_len: int, what: str) -> None:
    """A ValueError when ``block_mask`` was built for another problem than ``[batch, heads, q_len, kv_len]``."""
    bm, hm = block_mask.kv_indices.shape[:2]
    if (block_mask.q_len, block_mask.kv_len) != (q_len, kv_len):
        raise ValueError(f"{what}: block_mask was built for (Sq, Skv) = ({block_mask.q_len}, {block_mask.kv_len}), "
                         f"inputs have ({q_len}, {kv_len})")
    if bm not in (1, batch) or hm not in (1, heads):
        raise ValueError(f"{what}: block_mask has batch/head dims ({bm}, {hm}); expected 1 or ({batch}, {heads})")


def contiguous_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its last dim is contiguous (all the kernels need), else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def arg_type(arg) -> str:
    """Triton's signature type of a modifier's runtime argument, as a launch would specialize it."""
    if isinstance(arg, torch.Tensor):
        return "*" + TENSOR_ARGUMENT_TYPES[arg.dtype]
    if isinstance(arg, bool):
        return "i1"
    return "i32" if isinstance(arg, int) else "fp32"


def arg_types(args: tuple) -> tuple:
    """:func:`arg_type` of each of a modifier's ``args``."""
    return tuple(arg_type(a) for a in args)
