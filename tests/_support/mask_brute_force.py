"""The brute-force oracle of the mask verdicts: a mask evaluated on every element of its tile.

The property tests (tests/cpu/test_passes_intervals.py) check the passes' interval formulas
(:mod:`tritonpatch.passes.masks`, :mod:`tritonpatch.passes.iterations`) against it."""
from __future__ import annotations

from tritonpatch.passes.masks import Mask, PyOps


def brute_force(mask: Mask, env: dict[str, int | bool]) -> tuple[bool, bool]:
    """(all_true, all_false) of ``mask`` by evaluating every element of the tile."""
    shape = _mask_shape(mask)
    values = []
    for position in _positions(shape):
        values.append(_evaluate(mask, env, position))
    return all(values), not any(values)


def _mask_shape(mask: Mask):
    if mask.kind == "atom":
        return mask.diff.shape
    for child in mask.children:
        shape = _mask_shape(child)
        if shape:
            return shape
    return ()


def _positions(shape):
    if not shape:
        yield ()
        return
    for head in range(shape[0]):
        for rest in _positions(shape[1:]):
            yield (head,) + rest


def _evaluate(mask: Mask, env, position) -> bool:
    if mask.kind == "atom":
        d = mask.diff.const + sum(c * env[n] for n, c in mask.diff.scalars)
        d += sum(c * i for c, i in zip(mask.diff.axes, position))
        return PyOps(env).cmp(mask.pred, d, 0)
    if mask.kind == "const":
        return bool(mask.value)
    if mask.kind == "scalar":
        return bool(env[mask.value])
    values = [_evaluate(child, env, position) for child in mask.children]
    if mask.kind == "not":
        return not values[0]
    if mask.kind == "and":
        return values[0] and values[1]
    if mask.kind == "or":
        return values[0] or values[1]
    return values[0] != values[1]
