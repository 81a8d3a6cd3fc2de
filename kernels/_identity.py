"""Identities of the modifiers' runtime arguments in cache keys (block masks, launch replay, resolved calls).

A cache keyed by a tensor must not be fooled by a reused address: :class:`TensorIdentity` matches only
the same live tensor object, unchanged since the key was made."""
from __future__ import annotations

import weakref

import torch


def launch_key(modifier) -> tuple | None:
    """What the kernels receive from a MaskMod/ScoreMod (None for none): its device function (kept
    alive by the key, so its id cannot be reused) and its runtime arguments' identities."""
    if modifier is None:
        return None
    return (modifier.device_fn, tuple(argument_key(a) for a in modifier.args))


def argument_key(arg):
    """Hashable identity of a runtime argument for cache keys: a tensor by :class:`TensorIdentity`,
    a float by its exact value and sign (``repr``), anything else by type and value (``1``, ``1.0``
    and ``True`` specialize kernels differently)."""
    if isinstance(arg, torch.Tensor):
        return TensorIdentity(arg)
    return ("scalar", type(arg), repr(arg) if isinstance(arg, float) else arg)


def arguments_changed(before: tuple, args: tuple) -> bool:
    """Whether a modifier's runtime ``args`` differ from the argument keys (:func:`argument_key`) taken
    ``before``: a scalar of another value, or a tensor recorded ``before`` that is still alive and was written
    since (its version, address or layout changed), whichever tensor object ``args`` holds in its place: a
    compiled graph may hand the kernels a functionalized copy of a tensor it wrote, and a mask over a copy of
    the old values cannot be told from one over new values. A tensor recorded ``before`` that died and an
    inference tensor (no version) cannot be told changed, so they count as unchanged."""
    for old, arg in zip(before, args):
        if isinstance(old, TensorIdentity):
            if old.written_since():
                return True
        elif isinstance(arg, torch.Tensor) or old != argument_key(arg):
            return True
    return False


class TensorIdentity:
    """A tensor in a cache key: equal only to the key of the *same live tensor object*, unchanged.

    An address is not an identity: a tensor freed after its key was made leaves its address to the
    next allocation of that size (a packed-sequence loop makes a new ``doc_ids`` of one shape every
    step), and live tensors share addresses too (views, ``torch.from_numpy`` of one buffer). So the
    key holds a weak reference and compares objects with ``is`` (a key whose tensor died equals
    nothing: its entry only misses until the LRU drops it), plus the tensor's version counter,
    which torch bumps on every in-place write (``add_``, ``copy_``, index assignment), and its
    address, shape, strides, dtype and device (in-place ``set_``/``resize_``/``as_strided_``).
    Writes that bypass the version counter (through ``.data``, ``.numpy()``, DLPack, or another kernel's
    raw pointer) are not seen: make a new modifier after such a write. The key keeps nothing alive.
    O(1) host work, no device synchronization.

    An inference tensor (made under ``torch.inference_mode()``) has no version counter, and inside
    inference mode it can still be written in place, so no key can tell its contents unchanged: its
    key takes a fresh object for the version and equals no other key (every call with it is a cache
    miss: the block mask is rebuilt and the launch is not replayed)."""

    __slots__ = ("_ref", "_state", "_hash")

    def __init__(self, tensor: torch.Tensor):
        self._ref = weakref.ref(tensor)
        version = object() if tensor.is_inference() else tensor._version
        self._state = (version, tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor.device)
        self._hash = hash((id(tensor), self._state[0], self._state[1]))   # the rest is compared on lookup

    def written_since(self) -> bool:
        """Whether the tensor the key was taken of is alive and was written in place (or given new storage or
        layout) since: False for a dead tensor and for an inference tensor, which no key can tell."""
        tensor = self._ref()
        if tensor is None or self.of_inference_tensor:
            return False
        return self._state != (tensor._version, tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype,
                               tensor.device)

    @property
    def of_inference_tensor(self) -> bool:
        """Whether the key is of an inference tensor: no version counter, so it equals no other key."""
        return not isinstance(self._state[0], int)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if not isinstance(other, TensorIdentity):
            return NotImplemented
        tensor = self._ref()
        return tensor is not None and tensor is other._ref() and self._state == other._state

    def __repr__(self) -> str:
        tensor = self._ref()
        state = ("dead" if tensor is None else f"version {self._state[0]}" if isinstance(self._state[0], int)
                 else "inference tensor, never equal")
        return f"TensorIdentity({tuple(self._state[2])}, {self._state[4]}, {self._state[5]}, {state})"
