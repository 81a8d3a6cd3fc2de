"""Block sparsity for attention: which (q-block, kv-block) tiles are full, partial or empty.

The attention kernel visits *full* tiles without evaluating the mask, *partial* tiles with it, and
never touches *empty* ones. The layout follows FlexAttention's ``BlockMask``: per q-block the number
of partial kv-blocks and their indices (``kv_num_blocks``, ``kv_indices``), and the same for full
ones (``full_kv_num_blocks``, ``full_kv_indices``). Memory is O(number of tiles); no S×S tensor is
ever built. The backward walks the transposed view (per kv-block, its q-blocks: :func:`transpose_block_mask`).

Classification uses the mask's ``tile_rule`` when it has one (closed form, exact for the affine
factories), otherwise a Triton kernel that evaluates the mask on every tile (CUDA, or CPU tensors
under ``TRITON_INTERPRET=1``). Results are cached per (mask structure and runtime arguments, shape,
block sizes, device); tensor arguments count by object and version (``_identity.TensorIdentity``), never
by address, so a new ``doc_ids`` tensor at a freed one's address is classified anew.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace

import torch
import triton
import triton.language as tl

from ._identity import argument_key
from ._modifiers import normalized_device, same_memory
from ._runtime.launch import LRUCache, check_device
from .masks import MaskMod

EMPTY, PARTIAL, FULL = 0, 1, 2
_cache = LRUCache(64)        # (mask structure and argument identities, shape, tiles, device, method) -> BlockMask
_flex_cache = LRUCache(64)   # Flex BlockMask tensors' identities and geometry -> the converted BlockMask
_INDEX_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")   # BlockMask's tensors


@dataclass(frozen=True, eq=False)
class BlockMask:
    """Tile classification of one mask for one shape. Index tensors are int32 with leading dims
    ``[Bm, Hm]`` where ``Bm`` is 1 or B and ``Hm`` 1 or H (1 = the same for every batch/head)."""

    kv_num_blocks: torch.Tensor        # [Bm, Hm, NQ]        partial tiles per q-block
    kv_indices: torch.Tensor           # [Bm, Hm, NQ, NKV]   their kv-block indices, first kv_num_blocks valid
    full_kv_num_blocks: torch.Tensor   # [Bm, Hm, NQ]
    full_kv_indices: torch.Tensor      # [Bm, Hm, NQ, NKV]
    block_m: int
    block_n: int
    q_len: int
    kv_len: int
    # the mask's cache_key() when build_block_mask classified it (None otherwise): lets a call tell a block
    # mask built from this mask's structure with other arguments, or before its tensors were written
    built_from: tuple | None = field(default=None, repr=False)
    # whether the index tensors were made under torch.inference_mode() (autograd cannot save them); read when
    # made, as torch.compile cannot trace is_inference (a block mask made inside a compiled function: False)
    inference: bool = field(default=False, init=False, repr=False)

    def __post_init__(self):
        if not torch.compiler.is_compiling():
            object.__setattr__(self, "inference", self.kv_indices.is_inference())

    @property
    def shape(self) -> tuple:
        return tuple(self.kv_indices.shape)

    def launch_key(self) -> tuple:
        """What the kernels receive from this block mask (for replay keys, kernels/_runtime/launch.py, and the
        transposed-mask cache): its index tensors' identities (``_identity.TensorIdentity``) and its
        geometry, so that two objects over the same tensors (a custom op rebuilds one per call) share
        entries, and tensors written in place or new tensors at old addresses do not."""
        return (tuple(argument_key(t) for t in (self.kv_num_blocks, self.kv_indices, self.full_kv_num_blocks,
                                               self.full_kv_indices)),
                self.block_m, self.block_n, self.q_len, self.kv_len)

    def kernel_arguments(self, batch: int, heads: int) -> tuple:
        """What the forward kernels take from the block mask, in their parameter order: the partial and
        full counts and indices broadcast to ``[batch, heads, ...]``, and the strides of the counts
        (batch, head) and of the indices (batch, head, q-block); full and partial share them."""
        expand = (batch, heads, self.kv_num_blocks.shape[-1])
        partial_num = self.kv_num_blocks.expand(expand)
        full_num = self.full_kv_num_blocks.expand(expand)
        partial_ids = self.kv_indices.expand(expand + (self.kv_indices.shape[-1],))
        full_ids = self.full_kv_indices.expand(expand + (self.full_kv_indices.shape[-1],))
        if full_ids.stride(-1) != 1 or partial_ids.stride(-1) != 1:
            raise ValueError("block_mask index tensors must be contiguous in their last dim")
        return (partial_num, partial_ids, full_num, full_ids, partial_num.stride(0), partial_num.stride(1),
                partial_ids.stride(0), partial_ids.stride(1), partial_ids.stride(2))

    def tile_classes(self) -> torch.Tensor:
        """Dense ``[Bm, Hm, NQ, NKV]`` int8 tensor of EMPTY / PARTIAL / FULL (for tests and tools)."""
        classes = torch.zeros(self.kv_indices.shape, dtype=torch.int8, device=self.kv_indices.device)
        for num, idx, value in ((self.kv_num_blocks, self.kv_indices, PARTIAL),
                                (self.full_kv_num_blocks, self.full_kv_indices, FULL)):
            valid = torch.arange(idx.shape[-1], device=idx.device) < num[..., None].long()
            _scatter_classes(classes, idx, valid, value)
        return classes

    def density(self) -> float:
        """Fraction of tiles that the kernel visits (partial + full)."""
        total = self.kv_indices.numel()
        return float((self.kv_num_blocks.sum() + self.full_kv_num_blocks.sum()).item()) / max(total, 1)


def _scatter_classes(classes, idx, valid, value):
    """classes[..., idx[j]] = value for the valid entries j of each row (in place)."""
    flat = classes.view(-1, classes.shape[-1])
    rows = torch.arange(flat.shape[0], device=classes.device)[:, None].expand(-1, idx.shape[-1])
    selected = valid.reshape(-1, idx.shape[-1])
    flat[rows[selected], idx.reshape(-1, idx.shape[-1]).long()[selected]] = value


def build_block_mask(mask_mod: MaskMod, batch: int, heads: int, q_len: int, kv_len: int, *,
                     block_m: int = 128, block_n: int = 64, device="cuda", method: str = "auto") -> BlockMask:
    """Classify every tile of ``mask_mod`` for a ``[batch, heads, q_len, kv_len]`` attention.

    ``method``: ``"rule"`` (closed-form tile rule, error if the mask has none), ``"kernel"`` (evaluate
    the mask on each tile with a Triton kernel) or ``"auto"`` (rule when available). Cached."""
    if not isinstance(mask_mod, MaskMod):
        raise TypeError("build_block_mask needs a MaskMod (causal(), prefix_lm(P), ..., and_masks(...))")
    if method not in ("auto", "rule", "kernel"):
        raise ValueError(f"method must be 'auto', 'rule' or 'kernel', got {method!r}")
    if method == "rule" and mask_mod.tile_rule is None:
        raise ValueError(f"mask {mask_mod.name} has no tile rule; use method='kernel' or 'auto'")
    for name, value in (("batch", batch), ("heads", heads), ("q_len", q_len), ("kv_len", kv_len),
                        ("block_m", block_m), ("block_n", block_n)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"build_block_mask: {name} must be a positive int, got {value!r}")
    device = normalized_device(device)
    mask_mod.check_problem(batch, heads, q_len, kv_len, device)
    mask_batch = batch if mask_mod.batch_dependent else 1
    mask_heads = heads if mask_mod.head_dependent else 1
    use_rule = mask_mod.tile_rule is not None and method != "kernel"
    key = (mask_mod.cache_key(), mask_batch, mask_heads, q_len, kv_len, block_m, block_n, str(device), use_rule)
    cached = _cache.get(key)
    if cached is not None:
        return cached
    if use_rule:
        classes = _classify_by_rule(mask_mod, mask_batch, mask_heads, q_len, kv_len, block_m, block_n, device)
    else:
        classes = _classify_by_kernel(mask_mod, mask_batch, mask_heads, q_len, kv_len, block_m, block_n, device)
    result = replace(_outside_inference_mode(block_mask_from_classes(classes, block_m, block_n, q_len, kv_len)),
                     built_from=key[0])
    _record_source(result)
    _cache.put(key, result)
    return result


def _outside_inference_mode(block_mask: BlockMask) -> BlockMask:
    """``block_mask`` with ordinary index tensors where it was classified under ``torch.inference_mode()``.
    A built block mask is cached and recorded (``_record_source``) by its index tensors: ordinary ones keep
    their identities (an inference tensor has no version, so every key of one misses) and reach the custom
    ops of a compiled graph as they are, where their build record is found (inference ones are copied in the
    graph, ``block_mask_to_tensors``, and their copies have no record: a stale block mask would run)."""
    if not block_mask.inference:
        return block_mask
    with torch.inference_mode(False):
        return replace(block_mask, **{name: getattr(block_mask, name).clone() for name in _INDEX_FIELDS})


# (device, kv_indices.data_ptr()) -> (weak reference to that kv_indices tensor, the build's ``built_from``): lets
# the custom op, which receives a block mask as its index tensors, find what it was built from
# (block_mask_from_tensors).
# An address names a tensor only while the recorded tensor is alive; the entry goes when that tensor does.
_sources: dict = {}


def _record_source(block_mask: BlockMask) -> None:
    indices = block_mask.kv_indices
    address = (indices.device, indices.data_ptr())

    def forget(ref, address=address):
        if _sources.get(address, (None,))[0] is ref:
            del _sources[address]

    _sources[address] = (weakref.ref(indices, forget), block_mask.built_from)


def _recorded_source(kv_indices: torch.Tensor) -> tuple | None:
    """The ``built_from`` of the block mask whose ``kv_indices`` these are (the same tensor or an alias of
    its memory, as compiled graphs pass them), None when build_block_mask did not make them."""
    entry = _sources.get((kv_indices.device, kv_indices.data_ptr()))
    if entry is None:
        return None
    recorded = entry[0]()
    if recorded is None or not same_memory(kv_indices, recorded):
        return None
    return entry[1]



def _tile_bounds(length: int, block: int, device):
    starts = torch.arange(0, length, block, device=device, dtype=torch.int64)
    return starts, torch.clamp(starts + block, max=length) - 1


def _classify_by_rule(mask_mod, mask_batch, mask_heads, q_len, kv_len, block_m, block_n, device):
    q_lo, q_hi = _tile_bounds(q_len, block_m, device)
    kv_lo, kv_hi = _tile_bounds(kv_len, block_n, device)
    all_true, any_true = mask_mod.tile_rule(q_lo[:, None], q_hi[:, None], kv_lo[None, :], kv_hi[None, :],
                                            *mask_mod.args)
    shape = (mask_batch, mask_heads, q_lo.numel(), kv_lo.numel())
    all_true = torch.as_tensor(all_true, device=device)
    any_true = torch.as_tensor(any_true, device=device)
    all_true, any_true = _to_tile_shape(all_true, shape), _to_tile_shape(any_true, shape)
    return torch.where(all_true, FULL, torch.where(any_true, PARTIAL, EMPTY)).to(torch.int8)


def _to_tile_shape(value: torch.Tensor, shape) -> torch.Tensor:
    """Rules return [NQ, NKV] (or [Bm, NQ, NKV] for batch-dependent data): broadcast to 4-D."""
    if value.dim() == 3:
        value = value[:, None]
    return value.expand(shape)


@triton.jit
def _classify_tiles_kernel(classes, stride_cb, stride_ch, stride_cq, mask_args, q_len, kv_len, num_kv_blocks,
                           num_heads, MASK_FN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    q_block = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_heads
    h = bh % num_heads
    q_idx = q_block * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    q_valid = q_idx < q_len
    q_idx = tl.minimum(q_idx, q_len - 1)
    out = classes + b * stride_cb + h * stride_ch + q_block * stride_cq
    for kv_block in range(0, num_kv_blocks):
        kv_idx = kv_block * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        valid = q_valid & (kv_idx < kv_len)
        keep = MASK_FN(b, h, q_idx, tl.minimum(kv_idx, kv_len - 1), mask_args)
        any_true = tl.max(tl.max((keep & valid).to(tl.int32), 1), 0)
        all_true = tl.min(tl.min((keep | ~valid).to(tl.int32), 1), 0)
        tl.store(out + kv_block, (any_true + all_true).to(tl.int8))


def _classify_by_kernel(mask_mod, mask_batch, mask_heads, q_len, kv_len, block_m, block_n, device):
    num_q, num_kv = triton.cdiv(q_len, block_m), triton.cdiv(kv_len, block_n)
    classes = torch.empty((mask_batch, mask_heads, num_q, num_kv), dtype=torch.int8, device=device)
    check_device(classes, "build_block_mask(method='kernel')")
    _classify_tiles_kernel[(num_q, mask_batch * mask_heads)](
        classes, classes.stride(0), classes.stride(1), classes.stride(2), mask_mod.args, q_len, kv_len, num_kv,
        mask_heads, mask_mod.device_fn, block_m, block_n)
    return classes


def block_mask_from_classes(classes: torch.Tensor, block_m: int, block_n: int, q_len: int, kv_len: int) -> BlockMask:
    """Compact a dense ``[Bm, Hm, NQ, NKV]`` EMPTY/PARTIAL/FULL tensor into index lists.

    A FULL tile that crosses the end of the keys (``kv_len % block_n != 0``) is demoted to PARTIAL:
    the kernel's full-tile loop has no bounds checks."""
    classes = classes.to(torch.int8)
    if kv_len % block_n:
        last = classes[..., -1]
        classes = classes.clone()
        classes[..., -1] = torch.where(last == FULL, PARTIAL, last).to(torch.int8)
    partial_num, partial_idx = _compact(classes == PARTIAL)
    full_num, full_idx = _compact(classes == FULL)
    return BlockMask(partial_num, partial_idx, full_num, full_idx, block_m, block_n, q_len, kv_len)


def _compact(selected: torch.Tensor):
    """Per row, the count of selected tiles and their indices first (ascending), stable."""
    counts = selected.sum(-1, dtype=torch.int32)
    order = torch.sort((~selected).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
    return counts.contiguous(), order.contiguous()


def from_flex_block_mask(flex_mask) -> BlockMask:
    """Convert a ``torch.nn.attention.flex_attention.BlockMask`` (e.g. from ``create_block_mask``).

    Its partial tiles still need a mask on the device: pass one of ours as ``mask_mod`` to
    :func:`tritonpatch.kernels.attention` alongside it. Cached per Flex mask tensors (by object and
    version, ``_identity.TensorIdentity``), so a mask passed on every call is converted once; inside a
    function torch.compile compiles, the conversion is part of the graph (a few small ops per call)."""
    if not all(hasattr(flex_mask, name) for name in ("kv_num_blocks", "kv_indices", "BLOCK_SIZE", "seq_lengths")):
        raise TypeError(f"block_mask must be a tritonpatch.kernels BlockMask (build_block_mask()) or a FlexAttention "
                        f"BlockMask (create_block_mask()), got {type(flex_mask).__name__}")
    if torch.compiler.is_compiling():
        return _convert_flex_block_mask(flex_mask)   # in the graph, on every call: the cache keys cannot be traced
    tensors = (flex_mask.kv_num_blocks, flex_mask.kv_indices, flex_mask.full_kv_num_blocks,
               flex_mask.full_kv_indices)
    key = (tuple(argument_key(t) for t in tensors), tuple(flex_mask.BLOCK_SIZE), tuple(flex_mask.seq_lengths))
    cached = _flex_cache.get(key)
    if cached is None:
        cached = _convert_flex_block_mask(flex_mask)
        _flex_cache.put(key, cached)
    return cached


def _convert_flex_block_mask(flex_mask) -> BlockMask:
    block_m, block_n = flex_mask.BLOCK_SIZE
    q_len, kv_len = flex_mask.seq_lengths
    partial = _classes_from_lists(flex_mask.kv_num_blocks, flex_mask.kv_indices)
    classes = partial * PARTIAL
    if flex_mask.full_kv_num_blocks is not None:
        full = _classes_from_lists(flex_mask.full_kv_num_blocks, flex_mask.full_kv_indices)
        classes = torch.where(full.bool(), FULL, classes)
    num_q, num_kv = triton.cdiv(q_len, block_m), triton.cdiv(kv_len, block_n)
    classes = classes[..., :num_q, :num_kv].to(torch.int8)
    return block_mask_from_classes(classes, block_m, block_n, q_len, kv_len)


def _classes_from_lists(num: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    valid = torch.arange(idx.shape[-1], device=idx.device) < num[..., None]
    dense = torch.zeros(idx.shape, dtype=torch.int8, device=idx.device)
    dense.scatter_add_(-1, idx.long(), valid.to(torch.int8))
    return (dense > 0).to(torch.int8)


@dataclass(frozen=True, eq=False)
class TransposedBlockMask:
    """For every kv block, the partial and full q blocks (index tensors ``[Bm, Hm, NKV, NQ]``)."""

    q_num_blocks: torch.Tensor
    q_indices: torch.Tensor
    full_q_num_blocks: torch.Tensor
    full_q_indices: torch.Tensor
    block_m: int
    block_n: int


_transposed_cache = LRUCache(64)   # BlockMask.launch_key() -> its TransposedBlockMask


def transpose_block_mask(block_mask: BlockMask) -> TransposedBlockMask:
    """Swap the roles of q and kv blocks. Tiles crossing the end of the queries are demoted to
    partial (the dK/dV kernel's full-tile loop has no bounds checks). Cached per index tensors (by
    object and version: a custom op's per-call BlockMask over the same tensors hits, tensors written
    in place miss)."""
    key = block_mask.launch_key()
    cached = _transposed_cache.get(key)
    if cached is None:
        classes = block_mask.tile_classes().transpose(-1, -2)
        swapped = block_mask_from_classes(classes, block_mask.block_n, block_mask.block_m,
                                          block_mask.kv_len, block_mask.q_len)
        cached = TransposedBlockMask(swapped.kv_num_blocks, swapped.kv_indices, swapped.full_kv_num_blocks,
                                     swapped.full_kv_indices, block_mask.block_m, block_mask.block_n)
        _transposed_cache.put(key, cached)
    return cached


def clear_cache() -> None:
    """Forget every cached block mask (built, converted from FlexAttention, and transposed)."""
    _cache.clear()
    _flex_cache.clear()
    _transposed_cache.clear()


def block_mask_to_tensors(block_mask: "BlockMask | None") -> tuple:
    """The block mask as custom-op arguments: four index tensors (or None) and the geometry list. Index
    tensors made under ``torch.inference_mode()`` are copied (in the graph, when traced): the forward op's
    autograd rule saves them for the backward, which autograd refuses for inference tensors."""
    if block_mask is None:
        return None, None, None, None, [0, 0, 0, 0]
    tensors = tuple(getattr(block_mask, name) for name in _INDEX_FIELDS)
    if block_mask.inference:
        tensors = tuple(t.clone() for t in tensors)
    return (*tensors, [block_mask.block_m, block_mask.block_n, block_mask.q_len, block_mask.kv_len])


def block_mask_from_tensors(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
                            block_geometry) -> "BlockMask | None":
    """Inverse of :func:`block_mask_to_tensors`, with the ``built_from`` record of the block mask these
    tensors came from when :func:`build_block_mask` made them, so that the custom ops refuse a block mask
    whose mask changed since (``check_block_mask``) as eager calls do."""
    if kv_num_blocks is None:
        return None
    return BlockMask(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, *block_geometry,
                     built_from=_recorded_source(kv_indices))
