"""The tuners' timing (``kernels/_runtime/launch.fastest``): every candidate is timed in TUNING_ROUNDS
rounds, the candidates in turn each round, and the lowest median wins, so that a slow moment of the GPU
while one candidate is timed does not decide the pick."""
from __future__ import annotations

import pytest
import triton

from tritonpatch.kernels._runtime import launch as runtime_launch

TRUE_MS = {"a": 1.00, "b": 1.05}   # "a" is the faster kernel


def time_with_a_slow_moment(monkeypatch, slow_calls: set, fast_calls: frozenset = frozenset()):
    """``fastest`` over TRUE_MS's candidates on a fake GPU that runs 1.3x slower during the do_bench calls
    numbered in ``slow_calls`` (0 first) and 0.9x during those in ``fast_calls``; returns the pick and the
    candidates in the order they were timed."""
    order = []
    launched = []

    def do_bench(fn, **kwargs):
        fn()
        order.append(launched[-1])
        call = len(order) - 1
        return TRUE_MS[launched[-1]] * (1.3 if call in slow_calls else 0.9 if call in fast_calls else 1.0)

    monkeypatch.setattr(runtime_launch, "interpreting", lambda: False)
    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    pick = runtime_launch.fastest(list(TRUE_MS), launched.append, "test")
    return pick, order


def test_a_slow_moment_during_one_timing_does_not_decide_the_pick(monkeypatch):
    pick, order = time_with_a_slow_moment(monkeypatch, slow_calls={0})   # the GPU is slow while "a" is first timed
    assert pick == "a"
    assert order == ["a", "b"] * runtime_launch.TUNING_ROUNDS   # the candidates in turn, every round


def test_the_faster_candidate_wins_without_drift(monkeypatch):
    assert time_with_a_slow_moment(monkeypatch, slow_calls=set())[0] == "a"


def test_a_fast_moment_during_one_timing_does_not_decide_the_pick(monkeypatch):
    # "b" timed once during a fast moment (0.945 ms): the lowest single time, but not the lowest median
    assert time_with_a_slow_moment(monkeypatch, slow_calls=set(), fast_calls=frozenset({1}))[0] == "a"


def fit_only(monkeypatch, fits) -> list:
    """Run ``fastest`` over "a" and "b" where do_bench call number n (0 first) of a candidate raises
    OutOfResources unless ``fits(candidate, n)``; returns the launches."""
    launched, calls = [], {"a": 0, "b": 0}

    def do_bench(fn, **kwargs):
        fn()
        name = launched[-1]
        calls[name] += 1
        if not fits(name, calls[name] - 1):
            raise triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")
        return 2.0

    monkeypatch.setattr(runtime_launch, "interpreting", lambda: False)
    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    launched.append(runtime_launch.fastest(["a", "b"], launched.append, "test"))
    return launched


def test_a_candidate_that_does_not_fit_is_dropped(monkeypatch):
    launched = fit_only(monkeypatch, lambda name, call: name != "a")
    assert launched == ["a"] + ["b"] * runtime_launch.TUNING_ROUNDS + ["b"]   # the last entry: the pick


def test_a_candidate_that_stops_fitting_in_a_later_round_is_dropped(monkeypatch):
    launched = fit_only(monkeypatch, lambda name, call: name != "a" or call == 0)
    assert launched == ["a", "b", "a"] + ["b"] * (runtime_launch.TUNING_ROUNDS - 1) + ["b"]


def test_no_candidate_fitting_is_an_error(monkeypatch):
    with pytest.raises(RuntimeError, match="test: no kernel configuration fits this GPU"):
        fit_only(monkeypatch, lambda name, call: False)
