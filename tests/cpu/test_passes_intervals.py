"""Property tests: the per-tile interval verdicts and the loop-narrowing sets agree with brute force.

The formulas under test are the ones the passes emit as IR (written once against an ops interface;
PyOps runs them on Python integers)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mask_brute_force import brute_force
from tritonpatch.passes.masks import Affine, Check, Mask, PyOps, no_wrap, verdict
from tritonpatch.passes.iterations import (Interval, PrefixSuffix, iteration_bound, mask_sets, possible_runs,
                                           segment_counts, uniform_runs_possible)
from tritonpatch.passes.skip import narrowed_bounds

SCALARS = ("iv", "s")
INEQUALITIES = ("slt", "sle", "sgt", "sge")


@st.composite
def affines(draw, shape):
    coeffs = st.integers(-3, 3)
    scalars = tuple((n, c) for n in SCALARS if (c := draw(coeffs)))
    return Affine(draw(st.integers(-20, 20)), scalars, tuple(draw(coeffs) for _ in shape), shape)


@st.composite
def masks(draw, shape, depth=2, preds=("slt", "sle", "sgt", "sge", "eq", "ne")):
    kind = draw(st.sampled_from(["atom"] * 3 + (["and", "or", "xor", "not"] if depth else [])))
    if kind == "atom":
        return Mask("atom", pred=draw(st.sampled_from(preds)), diff=draw(affines(shape)))
    if kind == "not":
        return Mask("not", children=(draw(masks(shape, depth - 1, preds)),))
    return Mask(kind, children=(draw(masks(shape, depth - 1, preds)), draw(masks(shape, depth - 1, preds))))


shapes = st.tuples(st.integers(1, 6), st.integers(1, 6))
envs = st.fixed_dictionaries({name: st.integers(-30, 30) for name in SCALARS})


@settings(max_examples=400, deadline=None)
@given(data=st.data(), shape=shapes, env=envs)
def test_verdicts_are_sound(data, shape, env):
    mask = data.draw(masks(shape))
    all_true, all_false = verdict(PyOps(env), mask)
    brute_true, brute_false = brute_force(mask, env)
    assert not all_true or brute_true
    assert not all_false or brute_false


@settings(max_examples=400, deadline=None)
@given(shape=shapes, env=envs, pred=st.sampled_from(INEQUALITIES), data=st.data())
def test_inequality_verdicts_are_exact(shape, env, pred, data):
    mask = Mask("atom", pred=pred, diff=data.draw(affines(shape)))
    assert verdict(PyOps(env), mask) == brute_force(mask, env)


@settings(max_examples=200, deadline=None)
@given(shape=shapes, env=envs, data=st.data())
def test_wrap_guard_matches_element_range(shape, env, data):
    value = data.draw(affines(shape))
    width = data.draw(st.integers(4, 8))
    start = value.const + sum(c * env[n] for n, c in value.scalars)
    elements = [start + sum(c * i for c, i in zip(value.axes, (a, b))) for a in range(shape[0]) for b in range(shape[1])]
    fits = all(-(1 << (width - 1)) <= e < (1 << (width - 1)) for e in elements)
    assert no_wrap(PyOps(env), [Check(value, width)]) == fits


@st.composite
def loops(draw):
    """(mask, s, lower, upper, step): a random mask over a loop whose upper bound need not be a
    multiple of the step away from the lower one, and may equal or lie below it (an empty or
    reversed range, as a caller-given key range ``range(LO, HI, BN)`` with ``LO >= HI`` is)."""
    mask = draw(masks(draw(shapes)))
    lower, trips, step = draw(st.integers(-20, 20)), draw(st.integers(0, 12)), draw(st.integers(1, 4))
    if draw(st.integers(0, 4)) == 0:
        upper = lower - draw(st.integers(0, 40))
    else:
        upper = lower + draw(st.integers(max(0, trips * step - step + 1), trips * step))
    return mask, draw(st.integers(-30, 30)), lower, upper, step


@settings(max_examples=600, deadline=None)
@given(loop=loops())
def test_narrowed_loop_skips_only_all_false_iterations(loop):
    mask, s, lower, upper, step = loop
    ops = PyOps({"s": s})
    new_lower, new_upper, skipped = narrowed_bounds(ops, lower, upper, step, mask, "iv", [])
    iterations = range(lower, upper, step)
    assert 0 <= skipped <= len(iterations)
    assert new_lower == min(lower + skipped * step, max(lower, upper))
    assert lower <= new_lower <= max(lower, upper) and new_upper <= max(lower, upper)
    kept = set(range(new_lower, new_upper, step))
    assert kept <= set(iterations)
    for iv in set(iterations) - kept:
        assert brute_force(mask, {"iv": iv, "s": s})[1], f"iteration {iv} skipped but not all-false"
    if not iterations:
        assert (new_lower, new_upper, skipped) == (lower, upper, 0), "an empty range keeps its bounds"


@settings(max_examples=200, deadline=None)
@given(loop=loops())
def test_a_false_proof_condition_keeps_every_iteration(loop):
    """Where the condition the all-false proof holds under is false (a runtime scale not above
    zero), the loop keeps its own bounds; where it is true, the bounds are the unconditional ones."""
    mask, s, lower, upper, step = loop
    ops = PyOps({"s": s})
    assert narrowed_bounds(ops, lower, upper, step, mask, "iv", [], proven=False) == (lower, upper, 0)
    assert narrowed_bounds(ops, lower, upper, step, mask, "iv", [], proven=True) == \
        narrowed_bounds(ops, lower, upper, step, mask, "iv", [])


@st.composite
def compare_loops(draw):
    """(mask, s, lower, upper, step) with the mask a single inequality."""
    mask = Mask("atom", pred=draw(st.sampled_from(INEQUALITIES)), diff=draw(affines(draw(shapes))))
    lower, trips, step = draw(st.integers(-20, 20)), draw(st.integers(0, 12)), draw(st.integers(1, 4))
    return mask, draw(st.integers(-30, 30)), lower, lower + trips * step, step


@settings(max_examples=200, deadline=None)
@given(loop=compare_loops())
def test_single_compare_narrowing_is_tight(loop):
    """For one compare the all-false iterations form a prefix or a suffix: all of them are skipped."""
    mask, s, lower, upper, step = loop
    new_lower, new_upper, _ = narrowed_bounds(PyOps({"s": s}), lower, upper, step, mask, "iv", [])
    live = [iv for iv in range(lower, upper, step) if not brute_force(mask, {"iv": iv, "s": s})[1]]
    assert list(range(new_lower, new_upper, step)) == live


def classify(mask, iv, s):
    true, false = brute_force(mask, {"iv": iv, "s": s})
    return "true" if true else "false" if false else "mixed"


@settings(max_examples=600, deadline=None)
@given(loop=loops())
def test_split_loop_runs_hold_only_uniform_iterations(loop):
    """elide-uniform-masks' five runs: all-false / mixed / all-true / mixed / all-false, with
    bounds inside the loop's range that together visit exactly the loop's iterations, in order."""
    mask, s, lower, upper, step = loop
    ops = PyOps({"s": s})
    iterations = list(range(lower, upper, step))
    k1, k2, k3, k4 = segment_counts(ops, lower, upper, step, mask, "iv", [])
    assert 0 <= k1 <= k2 <= k3 <= k4 <= len(iterations)
    assert all(classify(mask, iv, s) == "false" for iv in iterations[:k1] + iterations[k4:])
    assert all(classify(mask, iv, s) == "true" for iv in iterations[k2:k3])
    bounds = [lower] + [iteration_bound(ops, lower, upper, k, step) for k in (k1, k2, k3, k4)] + [upper]
    assert all(lower <= b <= max(lower, upper) for b in bounds[1:-1])
    assert [iv for low, high in zip(bounds, bounds[1:]) for iv in range(low, high, step)] == iterations


@settings(max_examples=400, deadline=None)
@given(loop=loops())
def test_runs_said_impossible_are_always_empty(loop):
    """possible_runs: where it says a mask can never have an all-true (all-false) run, the set
    algebra answers an empty set for every runtime value."""
    mask, s, lower, upper, step = loop
    ops = PyOps({"s": s})
    true_possible, false_possible = possible_runs(mask, "iv")
    true_run = mask_sets(Interval(ops, lower, upper), mask, "iv")[0]
    prefix, suffix = mask_sets(PrefixSuffix(ops, lower, upper), mask, "iv")[1]
    if not true_possible:
        assert true_run[0] >= true_run[1] or lower >= upper
    if not false_possible:
        assert (prefix, suffix) == (lower, upper) or lower >= upper


def test_moving_equality_has_no_uniform_runs_and_xor_has_both():
    """The masks whose rewrite would be an identity: an == of a moving index (never all-true on a
    tile), a != of one (never all-false). An xor of compares is uniform where its sides are."""
    shape = (4, 4)
    rows_ge_cols = Mask("atom", pred="sge", diff=Affine(0, (("iv", -1),), (1, -1), shape))
    cols_lt_p = Mask("atom", pred="slt", diff=Affine(0, (("iv", 1), ("p", -1)), (0, 1), shape))
    diagonal = Mask("atom", pred="eq", diff=Affine(0, (("iv", -1),), (1, -1), shape))
    off_diagonal = Mask("atom", pred="ne", diff=Affine(0, (("iv", -1),), (1, -1), shape))
    assert possible_runs(diagonal, "iv") == (False, True)
    assert possible_runs(off_diagonal, "iv") == (True, False)
    assert possible_runs(rows_ge_cols, "iv") == (True, True)
    assert possible_runs(Mask("xor", children=(rows_ge_cols, cols_lt_p)), "iv") == (True, True)
    assert possible_runs(Mask("xor", children=(diagonal, diagonal)), "iv") == (False, True)


def linear(const: int, s_coeff: int) -> Affine:
    return Affine(const, (("s", s_coeff),) if s_coeff else (), (), ())


@st.composite
def affine_bound_loops(draw):
    """(mask, lower, upper, step) with bounds affine in the mask's runtime scalar ``s``, which
    cancels in the runs' lengths where both share its coefficient (``range(64 * pid, 64 * pid +
    64, 32)`` next to ``rows = 64 * pid + arange``)."""
    mask = draw(masks(draw(shapes)))
    coeff = draw(st.integers(-3, 3))
    lower = linear(draw(st.integers(-20, 20)), coeff)
    upper_coeff = coeff if draw(st.integers(0, 3)) else draw(st.integers(-3, 3))
    upper = linear(lower.const + draw(st.integers(-4, 30)), upper_coeff)
    return mask, lower, upper, draw(st.integers(1, 4))


@settings(max_examples=600, deadline=None)
@given(loop=affine_bound_loops(), s=st.integers(-30, 30), hidden_bounds=st.integers(0, 5))
def test_runs_said_empty_for_affine_bounds_are_empty(loop, s, hidden_bounds):
    """uniform_runs_possible: a run it calls empty for the loop's affine bounds is empty in the
    five-run split (segment_counts on Python integers) for every value of the scalar."""
    mask, lower, upper, step = loop
    hidden = hidden_bounds % 3      # 1: the lower bound is not affine (unknown to the check), 2: the upper one
    leading, all_true, trailing = uniform_runs_possible(mask, "iv", None if hidden == 1 else lower,
                                                        None if hidden == 2 else upper)
    low, high = (bound.const + sum(c * s for _, c in bound.scalars) for bound in (lower, upper))
    k1, k2, k3, k4 = segment_counts(PyOps({"s": s}), low, high, step, mask, "iv", [])
    trips = max(0, -((low - high) // step))
    assert leading or k1 == 0
    assert all_true or k3 == k2
    assert trailing or k4 == trips


def test_tutorial_on_band_loop_has_only_mixed_tiles():
    """The Triton tutorial's on-band loop, ``range(64 * p, 64 * p + 64, 32)`` under ``rows >=
    cols`` on 64 x 32 tiles with ``rows = 64 * p + arange(64)``: both tiles straddle the diagonal
    in every program, so no uniform run is possible. A wider range has them. With a bound that is
    not affine in the scalars, the runs the other bound rules out stay out: an all-false tile
    starts at ``64 * p + 64`` or later, past an end of ``64 * p + 64``, and an all-true one ends by
    ``64 * p``, before a start of ``64 * p``; with neither bound affine every run is possible."""
    causal = Mask("atom", pred="sge", diff=Affine(0, (("iv", -1), ("s", 64)), (1, -1), (64, 32)))
    assert uniform_runs_possible(causal, "iv", linear(0, 64), linear(64, 64)) == (False, False, False)
    assert uniform_runs_possible(causal, "iv", linear(0, 64), linear(128, 64)) == (False, False, True)
    assert uniform_runs_possible(causal, "iv", linear(-64, 64), linear(64, 64)) == (False, True, False)
    assert uniform_runs_possible(causal, "iv", None, linear(64, 64)) == (False, True, False)   # lower not affine
    assert uniform_runs_possible(causal, "iv", linear(0, 64), None) == (False, False, True)   # upper not affine
    assert uniform_runs_possible(causal, "iv", None, None) == (True, True, True)


@settings(max_examples=200, deadline=None)
@given(loop=compare_loops())
def test_single_compare_split_is_tight(loop):
    """For one compare every uniform iteration lands in a uniform run."""
    mask, s, lower, upper, step = loop
    iterations = list(range(lower, upper, step))
    k1, k2, k3, k4 = segment_counts(PyOps({"s": s}), lower, upper, step, mask, "iv", [])
    runs = ["false"] * k1 + ["mixed"] * (k2 - k1) + ["true"] * (k3 - k2) + ["mixed"] * (k4 - k3) + ["false"] * (len(iterations) - k4)
    assert runs == [classify(mask, iv, s) for iv in iterations]
