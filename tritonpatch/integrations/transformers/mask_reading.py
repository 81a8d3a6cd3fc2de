"""Read a Hugging Face ``transformers`` mask function as a tritonpatch mask, exactly or not at all.

transformers describes a model's attention mask as a Python function ``(batch_idx, head_idx, q_idx,
kv_idx) -> bool`` composed by its own factories (``masking_utils``): ``causal_mask_function``,
``sliding_window_overlay(w)``, ``packed_sequence_mask_function(ids)``, ``and_masks``, ``or_masks``,
``remap_positions_for_packed_sequence``. The kernels need one of their own masks instead
(:mod:`tritonpatch.kernels.masks`). This module reads the composition: a part is recognised by its
code object, compared with the code the installed transformers' factory produces (not by its name),
and its parameters are read from the closure. Anything else (a user's ``or_mask_function``, chunked
or blockwise masks, an unknown version's rewritten factory) raises :class:`Unreadable` naming it, and
the caller runs SDPA instead.

Before a reading is trusted, :func:`semantics_problem` evaluates the installed factories on small
index grids and compares them with the tritonpatch masks they are read as, so a transformers release
that changes a factory's meaning (an off-by-one in the window, say) is caught, not followed.
"""
from __future__ import annotations

import functools

import torch
from transformers import masking_utils as mu

import tritonpatch.kernels as K

ALL = None   # the reading of a mask that keeps every pair (the kernels' mask_mod=None)


class Unreadable(Exception):
    """The mask function has a part tritonpatch cannot express exactly; the message names it."""


def _code(fn):
    return getattr(fn, "__code__", None)


def _closure(fn) -> dict:
    """The free variables of a closure by name."""
    return dict(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__ or ())))


@functools.cache
def _factory_codes() -> dict:
    """The code object of each closure the installed transformers' factories return (a factory this
    transformers lacks is left out: ``remap_positions_for_packed_sequence`` is newer than 5.17)."""
    ids = torch.zeros(1, 1, dtype=torch.long)
    factories = {
        "and": ("and_masks", (mu.causal_mask_function,)),
        "or": ("or_masks", (mu.causal_mask_function,)),
        "sliding_window_overlay": ("sliding_window_overlay", (1,)),
        "packed_sequence": ("packed_sequence_mask_function", (ids,)),
        "remap_positions": ("remap_positions_for_packed_sequence", (mu.causal_mask_function, ids)),
    }
    return {kind: _code(getattr(mu, name)(*args)) for kind, (name, args) in factories.items() if hasattr(mu, name)}


def _kind(fn) -> str:
    """Which transformers factory made ``fn`` ("" when none did)."""
    code = _code(fn)
    if code is None:
        return ""
    if code is _code(mu.causal_mask_function):
        return "causal"
    if code is _code(mu.bidirectional_mask_function):
        return "bidirectional"
    return next((kind for kind, known in _factory_codes().items() if code is known), "")


def index_grid(batch: int, q_idx: torch.Tensor, kv_len: int, device=None) -> tuple:
    """``(b, h, q, kv)`` broadcastable as ``[batch, 1, len(q_idx), kv_len]``, the form transformers
    evaluates mask functions on (one head: the masks read here do not depend on it)."""
    return (torch.arange(batch, device=device)[:, None, None, None],
            torch.zeros(1, dtype=torch.long, device=device)[None, :, None, None],
            q_idx[None, None, :, None], torch.arange(kv_len, device=device)[None, None, None, :])


def _describe(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


_interned: dict = {}   # MaskMod.cache_key() -> the first reading with that key, for masks without tensors


def read_mask(mask_function) -> K.MaskMod | None:
    """The tritonpatch mask equal to ``mask_function`` on every (batch, head, q_idx, kv_idx) with
    q_idx, kv_idx < the sequence length (:data:`ALL` when it keeps every pair). Raises
    :class:`Unreadable` when a part cannot be expressed exactly.

    A mask without tensor arguments (causal, a sliding window, their unions and intersections) is
    the same object on every call with the same parameters: a compiled model's graph names the mask
    object it was traced with, so a new one per forward would recompile it every step."""
    reading = _read(mask_function)
    if reading is ALL or any(isinstance(arg, torch.Tensor) for arg in reading.args):
        return reading
    return _interned.setdefault(reading.cache_key(), reading)


def _read(mask_function) -> K.MaskMod | None:
    kind = _kind(mask_function)
    if kind == "causal":
        return K.causal()
    if kind == "bidirectional":
        return ALL
    if kind == "and":
        return _read_and([mask_function])
    if kind == "or":
        parts = [read_mask(part) for part in _closure(mask_function)["mask_functions"]]
        if not parts:
            raise Unreadable("a union of no masks")
        return ALL if any(part is ALL for part in parts) else (parts[0] if len(parts) == 1 else K.or_masks(*parts))
    if kind == "sliding_window_overlay":
        raise Unreadable("a sliding-window overlay without the causal mask it bounds")
    if kind == "remap_positions":
        raise Unreadable("packed-sequence positions outside an and with the packed-sequence mask")
    if kind == "packed_sequence":
        ids = _closure(mask_function)["packed_sequence_mask"]
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64):
            raise Unreadable("packed-sequence ids that are not an integer [B, S] tensor")
        # one sequence per row keeps every pair; under torch.compile transformers adds this mask always
        return ALL if bool((ids == ids[:, :1]).all()) else K.document(ids)
    raise Unreadable(f"the mask function {_describe(mask_function)}")


def _read_and(parts: list) -> K.MaskMod | None:
    """An intersection: nested intersections are flattened, a sliding-window overlay joins the
    causal mask it bounds, and packed-sequence position remapping is undone where it is exact."""
    flat = [leaf for part in parts for leaf in _flatten(part)]
    packed = [part for part in flat if _kind(part) == "packed_sequence"]
    remapped = [part for part in flat if _kind(part) == "remap_positions"]
    readings = []
    if remapped:
        if len(packed) != 1:
            raise Unreadable("packed-sequence positions without exactly one packed-sequence mask beside them")
        ids = _closure(packed[0])["packed_sequence_mask"]
        readings = [_unmapped(part, ids) for part in remapped]
    return _intersection([part for part in flat if _kind(part) != "remap_positions"], readings)


def _flatten(fn) -> list:
    """The leaves of nested intersections."""
    if _kind(fn) != "and":
        return [fn]
    return [leaf for part in _closure(fn)["mask_functions"] for leaf in _flatten(part)]


def _unmapped(remapped, ids: torch.Tensor) -> K.MaskMod | None:
    """``remap_positions_for_packed_sequence(f, position_ids)`` evaluates ``f`` on each token's
    position in its own sequence. Beside the packed-sequence mask (pairs of one sequence only) that
    equals ``f`` on the raw indices when ``f`` depends on ``q_idx - kv_idx`` only and positions step
    by exactly one inside every sequence: then ``pos[q] - pos[kv] == q - kv`` for every pair kept.
    Returns the reading of ``f``."""
    variables = _closure(remapped)
    reading = _read_and([variables["mask_function"]])
    if reading is not ALL and not reading.shift_invariant:
        raise Unreadable(f"the packed sequences' mask {reading.name} depends on more than q_idx - kv_idx")
    positions = variables["position_ids"]
    if positions.dim() != 2 or positions.shape[-1] != ids.shape[-1] or positions.shape[0] not in (1, ids.shape[0]):
        raise Unreadable(f"position_ids of shape {tuple(positions.shape)} beside packed-sequence ids of shape "
                         f"{tuple(ids.shape)}")
    if bool((positions < 0).any()):   # masks read on indices >= 0 (bidirectional: q_idx >= 0) would differ
        raise Unreadable("negative position_ids beside a packed-sequence mask")
    positions = positions.expand(ids.shape[0], -1)
    same_sequence = ids[:, 1:] == ids[:, :-1]
    if not bool(((positions[:, 1:] - positions[:, :-1] == 1) | ~same_sequence).all()):
        raise Unreadable("position_ids that do not step by one inside a packed sequence")
    return reading


def _intersection(parts: list, readings: list) -> K.MaskMod | None:
    """The intersection of ``parts`` (leaf mask functions) and of masks already read."""
    overlays = [part for part in parts if _kind(part) == "sliding_window_overlay"]
    others = [part for part in parts if _kind(part) != "sliding_window_overlay"]
    readings = list(readings)
    if overlays:
        causal = next((part for part in others if _kind(part) == "causal"), None)
        if causal is None or len(overlays) != 1:
            raise Unreadable("a sliding-window overlay without exactly one causal mask beside it")
        others.remove(causal)
        window = _closure(overlays[0])["sliding_window"]
        if isinstance(window, float) and window.is_integer():
            window = int(window)
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise Unreadable(f"a sliding window of {window!r} tokens (the kernels take a positive whole number)")
        # kv_idx > q_idx - window and kv_idx <= q_idx: 0 <= q_idx - kv_idx <= window - 1
        readings.append(K.sliding_window(window - 1))
    readings += [read_mask(part) for part in others]
    readings = [reading for reading in readings if reading is not ALL]
    if not readings:
        return ALL
    return readings[0] if len(readings) == 1 else K.and_masks(*readings)


@functools.cache
def semantics_problem() -> str | None:
    """None when the installed transformers' factories mean what :func:`read_mask` reads them as
    (checked by evaluating both on every pair of small grids); else what differs."""
    n = 12
    grid = index_grid(2, torch.arange(n), n)
    ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3], [0, 1, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3]])
    positions = torch.cat([torch.arange(3), torch.arange(2), torch.arange(4), torch.arange(3)])[None]
    samples = [mu.causal_mask_function, mu.bidirectional_mask_function,
               mu.sliding_window_causal_mask_function(1), mu.sliding_window_causal_mask_function(4),
               mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(ids)),
               mu.or_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(ids))]
    if hasattr(mu, "remap_positions_for_packed_sequence"):
        samples.append(mu.and_masks(mu.remap_positions_for_packed_sequence(mu.sliding_window_causal_mask_function(2),
                                                                           positions.expand(2, -1)),
                                    mu.packed_sequence_mask_function(torch.stack([ids[0], ids[0]]))))
    for sample in samples:
        try:
            reading = read_mask(sample)
        except Unreadable as exc:
            return f"transformers {_describe(sample)} is read differently by this version: {exc}"
        expected = sample(*grid).expand(2, 1, n, n)
        got = torch.ones_like(expected) if reading is ALL else reading(*grid).expand(2, 1, n, n)
        if not torch.equal(expected.bool(), got.bool()):
            return (f"transformers {_describe(sample)} does not mean what tritonpatch reads it as "
                    f"({'every pair' if reading is ALL else reading.name})")
    return None
