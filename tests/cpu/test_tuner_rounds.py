"""The tuners' timing (``kernels/_runtime/launch.fastest``): every candidate is timed in TUNING_ROUNDS
rounds, the candidates in turn each round, and the lowest median wins, so that a slow moment of the GPU
while one candidate is timed does not decide the pick."""
from __future__ import annotations

import triton

from tritonpatch.kernels._runtime import launch as runtime_launch

TRUE_MS = {"a": 1.00, "b": 1.05}   # "a" is the faster kernel


def time_with_a_slow_moment(monkeypatch, slow_calls: set):
    """``fastest`` over TRUE_MS's candidates on a fake GPU that runs 1.3x slower during the do_bench calls
    numbered in ``slow_calls`` (0 first); returns the pick and the candidates in the order they were timed."""
    order = []
    launched = []

    def do_bench(fn, **kwargs):
        fn()
        order.append(launched[-1])
        return TRUE_MS[launched[-1]] * (1.3 if len(order) - 1 in slow_calls else 1.0)

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


def test_a_candidate_that_does_not_fit_is_dropped(monkeypatch):
    def do_bench(fn, **kwargs):
        fn()
        if launched[-1] == "a":
            raise triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")
        return 2.0

    launched = []
    monkeypatch.setattr(runtime_launch, "interpreting", lambda: False)
    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    assert runtime_launch.fastest(["a", "b"], launched.append, "test") == "b"
    assert launched == ["a"] + ["b"] * runtime_launch.TUNING_ROUNDS
