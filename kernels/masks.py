"""Mask modifiers for :func:`tritonpatch.kernels.attention`, in the attention-gym style: one small
documented factory per mask (score modifiers: :mod:`.scores`).

A mask is a small frozen object holding three views of the same rule:

* ``device_fn``: a ``@triton.jit`` function the attention kernel calls on a tile,
  ``(b, h, q_idx, kv_idx, args)``; ``args`` is the flat tuple of runtime arguments, so changing a
  window size or a prefix length does not recompile the kernel.
* ``torch_fn``: the same rule on broadcastable torch tensors, ``torch_fn(b, h, q_idx, kv_idx, *args)``;
  the reference implementation and the brute-force tests evaluate it.
* ``tile_rule`` (optional): for tiles ``q in [q_lo, q_hi]``, ``kv in [kv_lo, kv_hi]`` returns
  ``(all_true, any_true)`` without looking at single pairs. ``all_true`` must imply that every pair
  is allowed and ``not any_true`` that none is; the block-mask builder uses it instead of evaluating
  the mask. Masks without a rule are evaluated tile by tile by a Triton kernel.

Composition (:func:`and_masks`, :func:`or_masks`) generates the device function's source once per
structure (:func:`._modifiers.generate`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import triton
import triton.language as tl

from ._identity import argument_key
from ._modifiers import (argument_check, call_expr, check_signature, checked_arguments, described, generate,
                         has_custom_leaf, register, table_batch_stride)
from ._modifiers import check_problem as modifier_check_problem


TileRule = Callable[..., tuple]


@dataclass(frozen=True, eq=False)
class MaskMod:
    """A boolean attention mask: True keeps the (q_idx, kv_idx) pair."""

    name: str
    device_fn: Any
    torch_fn: Callable
    args: tuple = ()
    tile_rule: Optional[TileRule] = None
    batch_dependent: bool = False
    head_dependent: bool = False
    structure: tuple = field(default=(), repr=False)
    shift_invariant: bool = False   # depends on q_idx - kv_idx only (and b, h): the device function may be
    #                                 called with both indices shifted by the same amount
    check: Optional[Callable] = field(default=None, repr=False)   # see check_problem
    # the user's functions in the mask (custom leaves' torch_fn and tile_rule): they count in its op key
    user_functions: tuple = field(default=(), repr=False)
    # (position of a batch-stride scalar in args, position of the [B, S] or [S] tensor it steps through): the
    # stride follows from that tensor's shape, so it is left out of the op key (_modifiers.register)
    batch_strides: tuple = field(default=(), repr=False)
    op_key: str = field(default="", init=False, repr=False)
    op_tensors: tuple = field(default=(), init=False, repr=False)   # see _modifiers.register

    def __post_init__(self):
        register(self)

    def __call__(self, b, h, q_idx, kv_idx):
        """Evaluate on torch tensors (broadcasting), like a FlexAttention ``mask_mod``."""
        return self.torch_fn(b, h, q_idx, kv_idx, *self.args)

    def cache_key(self) -> tuple:
        """Hashable identity of the mask: its structure and its runtime arguments (:func:`argument_key`)."""
        return (self.structure, tuple(argument_key(a) for a in self.args))

    check_problem = modifier_check_problem

    def portable_key(self) -> str | None:
        """The mask's code by factory names, the same in every process (for tuning decisions kept on
        disk); None when it contains a ``custom_mask``, whose code has no stable name."""
        return None if has_custom_leaf(self.structure) else repr(self.structure)


# ---------------------------------------------------------------------------------------------
# Device functions of the leaves (the kernel calls them through generated wrappers).
# ---------------------------------------------------------------------------------------------


@triton.jit
def _causal_dev(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@triton.jit
def _prefix_lm_dev(b, h, q_idx, kv_idx, prefix_len):
    return (kv_idx < prefix_len) | (q_idx >= kv_idx)


@triton.jit
def _sliding_window_dev(b, h, q_idx, kv_idx, window):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)


@triton.jit
def _document_dev(b, h, q_idx, kv_idx, doc_ids, batch_stride):
    base = doc_ids + b * batch_stride
    return tl.load(base + q_idx) == tl.load(base + kv_idx)


@triton.jit
def _key_padding_dev(b, h, q_idx, kv_idx, valid, batch_stride):
    return tl.load(valid + b * batch_stride + kv_idx) != 0


def structure_name(structure: tuple) -> str:
    """A mask structure as its factories spell it (``and_masks(causal, document)``;
    ``custom_mask(my_mask)`` for a custom_mask leaf of the device function ``my_mask``), for error
    messages."""
    if structure[:2] == ("mask-leaf", "custom"):
        return f"custom_mask({structure[4]})"
    if structure[0] == "mask-leaf":
        return structure[1]
    return f"{structure[0]}_masks({', '.join(structure_name(part) for part in structure[1])})"


def _leaf_mask(name, leaf_fn, torch_fn, args=(), tile_rule=None, batch_dependent=False, shift_invariant=False,
               check=None, batch_strides=()):
    structure = ("mask-leaf", name, len(args))
    device_fn = generate(structure, [leaf_fn], call_expr(0, "b, h, q_idx, kv_idx", 0, len(args)),
                         "b, h, q_idx, kv_idx, args")
    return MaskMod(name, device_fn, torch_fn, tuple(args), tile_rule, batch_dependent, False, structure,
                   shift_invariant, check, batch_strides=batch_strides)


def custom_mask(device_fn, torch_fn: Callable, args: tuple = (), *, name: str | None = None,
                tile_rule: Optional[TileRule] = None, batch_dependent: bool = False,
                head_dependent: bool = False, shift_invariant: bool = False) -> MaskMod:
    """A mask from your own functions.

    ``device_fn`` is a ``@triton.jit`` function ``(b, h, q_idx, kv_idx, *args) -> bool tile`` and
    ``torch_fn(b, h, q_idx, kv_idx, *args)`` the same rule on torch tensors; ``args`` are runtime
    ints/floats/tensors. Without ``tile_rule`` the block mask is found by evaluating ``device_fn``
    on every tile. Set ``batch_dependent``/``head_dependent`` when the mask differs across them, and
    ``shift_invariant`` when it depends on ``q_idx - kv_idx`` only (it lets D=128 attention run on
    the warp-specialized Hopper kernel)."""
    function_name = getattr(getattr(device_fn, "fn", device_fn), "__name__", "custom")
    name = name or function_name
    args = checked_arguments(f"custom_mask {name!r}", args)
    check_signature(f"custom_mask {name!r}", device_fn, torch_fn, ("b", "h", "q_idx", "kv_idx"), args)
    # the device function by identity (kept alive by the generated wrapper's cache, so its id is never
    # reused), its name for messages
    structure = ("mask-leaf", "custom", id(device_fn), len(args), function_name)
    wrapper = generate(structure, [device_fn], call_expr(0, "b, h, q_idx, kv_idx", 0, len(args)),
                       "b, h, q_idx, kv_idx, args")
    return MaskMod(name, wrapper, torch_fn, args, tile_rule, batch_dependent, head_dependent, structure,
                   shift_invariant, argument_check(f"custom_mask {name!r}"), (torch_fn, tile_rule))


def _combine(kind: str, masks: tuple) -> MaskMod:
    if not masks:
        raise ValueError(f"{kind}_masks() needs at least one mask")
    for m in masks:
        if not isinstance(m, MaskMod):
            raise TypeError(f"{kind}_masks() takes MaskMod objects (from causal(), prefix_lm(), ...); "
                            f"got {type(m).__name__}")
    op = " & " if kind == "and" else " | "
    # each child receives its own tuple: _leafI(b, h, q_idx, kv_idx, (args[k], ...,))
    calls = [_child_call(i, start, len(m.args)) for i, (m, start) in enumerate(zip(masks, _offsets(masks)))]
    structure = (kind, tuple(m.structure for m in masks))
    device_fn = generate(structure, [m.device_fn for m in masks], op.join(f"({c})" for c in calls),
                         "b, h, q_idx, kv_idx, args")
    args = tuple(a for m in masks for a in m.args)
    reduce = torch.logical_and if kind == "and" else torch.logical_or
    # the parts' functions and argument spans, not the parts: a combination holds no tensor of theirs beyond
    # its args (the custom ops' template of its key then keeps none alive, _modifiers._template)
    spans = [(start, len(m.args)) for m, start in zip(masks, _offsets(masks))]
    torch_fns = [m.torch_fn for m in masks]
    checks = [(m.check, span) for m, span in zip(masks, spans) if m.check is not None]

    def torch_fn(b, h, q_idx, kv_idx, *flat):
        result = None
        for part, (start, n) in zip(torch_fns, spans):
            value = part(b, h, q_idx, kv_idx, *flat[start:start + n])
            result = value if result is None else reduce(result, value)
        return result

    rule = None
    if all(m.tile_rule is not None for m in masks):
        rule = _combined_rule(kind, [m.tile_rule for m in masks], spans)
    name = f"{kind}_masks(" + ", ".join(m.name for m in masks) + ")"

    def check(flat, *problem):
        for part, (start, n) in checks:
            part(flat[start:start + n], *problem)

    return MaskMod(name, device_fn, torch_fn, args, rule,
                   any(m.batch_dependent for m in masks), any(m.head_dependent for m in masks), structure,
                   all(m.shift_invariant for m in masks), check, tuple(f for m in masks for f in m.user_functions),
                   tuple((start + stride, start + table) for m, (start, _) in zip(masks, spans)
                         for stride, table in m.batch_strides))


def _offsets(masks):
    out, offset = [], 0
    for m in masks:
        out.append(offset)
        offset += len(m.args)
    return out


def _child_call(index: int, start: int, nargs: int) -> str:
    if nargs == 0:
        return f"_leaf{index}(b, h, q_idx, kv_idx, ())"
    items = "".join(f"args[{start + i}], " for i in range(nargs))
    return f"_leaf{index}(b, h, q_idx, kv_idx, ({items}))"


def _combined_rule(kind: str, rules: list, spans: list):
    """The tile rule of an and/or of masks with these rules, sound where theirs are: an and's ``any_true`` is an
    over-approximation and an or's ``all_true`` an under-approximation (the parts may differ pair by pair)."""
    def rule(q_lo, q_hi, kv_lo, kv_hi, *flat):
        all_true, any_true = kind == "and", kind == "and"
        for part, (start, n) in zip(rules, spans):
            a, b = part(q_lo, q_hi, kv_lo, kv_hi, *flat[start:start + n])
            if kind == "and":
                all_true, any_true = all_true & a, any_true & b
            else:
                all_true, any_true = all_true | a, any_true | b
        return all_true, any_true
    return rule


# ---------------------------------------------------------------------------------------------
# Public factories.
# ---------------------------------------------------------------------------------------------


@triton.jit
def _allow_all_dev(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx) * 0 == 0     # all true, written shift-invariantly (folds to a constant)


ALLOW_ALL_STRUCTURE = ("mask-leaf", "allow_all", 0)   # allow_all()'s: it takes any block mask


def allow_all() -> MaskMod:
    """Every pair is allowed (what ``mask_mod=None`` means); the kernel then only checks sequence ends."""
    return _leaf_mask("allow_all", _allow_all_dev, lambda b, h, q, kv: torch.ones_like(q >= kv),
                      tile_rule=lambda q_lo, q_hi, kv_lo, kv_hi: (torch.ones_like(q_lo >= kv_lo),
                                                                  torch.ones_like(q_lo >= kv_lo)),
                      shift_invariant=True)


def causal() -> MaskMod:
    """Each query sees itself and earlier keys: ``q_idx >= kv_idx`` (top-left aligned when Sq != Skv)."""
    return _leaf_mask("causal", _causal_dev, lambda b, h, q, kv: q >= kv,
                      tile_rule=lambda q_lo, q_hi, kv_lo, kv_hi: (q_lo >= kv_hi, q_hi >= kv_lo), shift_invariant=True)


def prefix_lm(prefix_len: int) -> MaskMod:
    """Prefix-LM: the first ``prefix_len`` keys are visible to every query, the rest causally:
    ``kv_idx < prefix_len | q_idx >= kv_idx``."""
    prefix_len = _nonnegative_int("prefix_lm", "prefix_len", prefix_len)

    def rule(q_lo, q_hi, kv_lo, kv_hi, p):
        return (kv_hi < p) | (q_lo >= kv_hi), (kv_lo < p) | (q_hi >= kv_lo)

    return _leaf_mask("prefix_lm", _prefix_lm_dev, lambda b, h, q, kv, p: (kv < p) | (q >= kv),
                      (prefix_len,), rule)


def sliding_window(window: int) -> MaskMod:
    """Causal sliding window: ``0 <= q_idx - kv_idx <= window`` (``window + 1`` keys per query)."""
    window = _nonnegative_int("sliding_window", "window", window)

    def rule(q_lo, q_hi, kv_lo, kv_hi, w):
        # d = q - kv takes every integer in [q_lo - kv_hi, q_hi - kv_lo] on the tile
        d_lo, d_hi = q_lo - kv_hi, q_hi - kv_lo
        return (d_lo >= 0) & (d_hi <= w), (d_hi >= 0) & (d_lo <= w)

    return _leaf_mask("sliding_window", _sliding_window_dev,
                      lambda b, h, q, kv, w: (q >= kv) & (q - kv <= w), (window,), rule, shift_invariant=True)


def document(doc_ids: torch.Tensor) -> MaskMod:
    """Document (packed sequences) mask: a query sees keys of its own document.

    ``doc_ids`` is an integer tensor of shape ``[S]`` (same packing for every batch) or ``[B, S]``,
    on the attention's device, with one id per position: queries and keys share the packing, so
    Sq must equal Skv (the attention checks both, and the batch dim). Combine with :func:`causal`
    through :func:`and_masks` for causal packed sequences. int32 and int64 ids are used as they are
    (no narrowing); a non-contiguous tensor is copied (later writes to it do not reach the copy)."""
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.dtype not in (torch.int32, torch.int64) \
            or doc_ids.dim() not in (1, 2):
        raise TypeError(f"document(doc_ids) needs an int32/int64 tensor of shape [S] or [B, S], got "
                        f"{described(doc_ids)}")
    ids = doc_ids.contiguous()
    batched = ids.dim() == 2

    def torch_fn(b, h, q, kv, ids_arg, stride):
        table = ids_arg.long() if ids_arg.dim() == 2 else ids_arg.long()[None]
        bb = b if ids_arg.dim() == 2 else torch.zeros_like(b)
        return table[bb, q] == table[bb, kv]

    return _leaf_mask("document", _document_dev, torch_fn, (ids, table_batch_stride(ids)), _document_rule,
                      batch_dependent=batched, check=argument_check("document(doc_ids)", _document_fits),
                      batch_strides=((1, 0),))


def _document_fits(args, batch, heads, q_len, kv_len):
    ids = args[0]
    if q_len != kv_len:
        raise ValueError(f"document(doc_ids) needs Sq == Skv (queries and keys share one packing); the "
                         f"attention has Sq = {q_len}, Skv = {kv_len}")
    if ids.shape[-1] != q_len or (ids.dim() == 2 and ids.shape[0] != batch):
        raise ValueError(f"document(doc_ids): doc_ids has shape {tuple(ids.shape)}, the attention of B = {batch}, "
                         f"Sq = Skv = {q_len} needs one id per position: shape [{q_len}] or [{batch}, {q_len}]")


def _tile_min_max(table: torch.Tensor, lo: torch.Tensor):
    """Per batch row of ``table [Bm, S]``, the min and max over the positions of each tile, the
    tiles given by their first positions ``lo`` (sorted, the first one 0): two ``[Bm, tiles]``."""
    n = table.shape[-1]
    pos = torch.arange(n, device=table.device)
    tile_of = torch.searchsorted(lo.flatten().contiguous(), pos, right=True) - 1
    count = lo.numel()
    limits = torch.iinfo(table.dtype)
    mins = torch.full((table.shape[0], count), limits.max, dtype=table.dtype, device=table.device)
    maxs = torch.full((table.shape[0], count), limits.min, dtype=table.dtype, device=table.device)
    idx = tile_of.expand(table.shape[0], n)
    mins.scatter_reduce_(1, idx, table, "amin")
    maxs.scatter_reduce_(1, idx, table, "amax")
    return mins, maxs


def _document_rule(q_lo, q_hi, kv_lo, kv_hi, ids_arg, stride):
    """Tile rule from per-position document ids: all-true iff both ranges lie in one document;
    any-true unless the ranges of ids do not overlap (exact for sorted ids, sound for any). Reads the
    ids the kernel reads (``ids_arg``, the mask's argument now), never a view taken earlier: after
    ``ids.set_(...)`` such a view would still show the old ids.
    q_lo/q_hi: [NQ, 1]; kv_lo/kv_hi: [1, NKV]  -> results [Bm, NQ, NKV]"""
    table = ids_arg if ids_arg.dim() == 2 else ids_arg[None]
    qmin, qmax = _tile_min_max(table, q_lo[:, 0])
    kmin, kmax = _tile_min_max(table, kv_lo[0])
    qmin, qmax = qmin[:, :, None], qmax[:, :, None]
    kmin, kmax = kmin[:, None, :], kmax[:, None, :]
    all_true = (qmin == qmax) & (kmin == kmax) & (qmin == kmin)
    any_true = (qmin <= kmax) & (kmin <= qmax)
    return all_true, any_true


def key_padding(valid: torch.Tensor) -> MaskMod:
    """Key padding: a query sees only the keys ``valid`` marks as tokens (nonzero / True), not the
    padding (zero / False), as a 2D attention mask does in Hugging Face models.

    ``valid`` is a bool or integer tensor of shape ``[Skv]`` (the same for every batch) or
    ``[B, Skv]``, on the attention's device. It is copied as int32 (later writes to it do not reach
    the copy). Combine with :func:`causal` and the others through :func:`and_masks`. A query whose
    keys are all padding attends to nothing: its output row is zero and its lse ``-inf``."""
    if not isinstance(valid, torch.Tensor) or valid.dim() not in (1, 2) or \
            (valid.dtype != torch.bool and (valid.is_floating_point() or valid.is_complex())):
        raise TypeError(f"key_padding(valid) needs a bool or integer tensor of shape [Skv] or [B, Skv], got "
                        f"{described(valid)}")
    table = (valid != 0).to(torch.int32).contiguous()
    batched = table.dim() == 2

    def torch_fn(b, h, q, kv, valid_arg, stride):
        keep = valid_arg.bool() if valid_arg.dim() == 2 else valid_arg.bool()[None]
        return keep[b if valid_arg.dim() == 2 else torch.zeros_like(b), kv] & (q >= 0)

    def rule(q_lo, q_hi, kv_lo, kv_hi, valid_arg, stride):
        # every key of a tile a token: all-true; any key a token: any-true (for every query tile); reads the
        # table the kernel reads (the mask's argument), like _document_rule
        kmin, kmax = _tile_min_max(valid_arg if valid_arg.dim() == 2 else valid_arg[None], kv_lo[0])
        all_true, any_true = kmin[:, None, :] == 1, kmax[:, None, :] == 1
        return all_true.expand(-1, q_lo.shape[0], -1), any_true.expand(-1, q_lo.shape[0], -1)

    return _leaf_mask("key_padding", _key_padding_dev, torch_fn, (table, table_batch_stride(table)), rule,
                      batch_dependent=batched, check=argument_check("key_padding(valid)", _key_padding_fits),
                      batch_strides=((1, 0),))


def _key_padding_fits(args, batch, heads, q_len, kv_len):
    table = args[0]   # valid as int32, of valid's shape
    if table.shape[-1] != kv_len or (table.dim() == 2 and table.shape[0] != batch):
        raise ValueError(f"key_padding(valid): valid has shape {tuple(table.shape)}, the attention of B = "
                         f"{batch}, Skv = {kv_len} needs one entry per key: shape [{kv_len}] or [{batch}, {kv_len}]")


def and_masks(*masks: MaskMod) -> MaskMod:
    """Keep a pair only where every mask keeps it."""
    return _combine("and", masks)


def or_masks(*masks: MaskMod) -> MaskMod:
    """Keep a pair where any mask keeps it."""
    return _combine("or", masks)


def _nonnegative_int(factory: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{factory}({name}) needs a non-negative int, got {value!r}")
    return value
