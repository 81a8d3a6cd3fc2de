"""The benchmarks' timing in rounds (``scripts/benchmarks/_common.py``): every implementation is timed once per
round in a fixed order, a failing anchor is dropped only where the caller allows it, and the reported time
is a measured round."""
import importlib.util
import os

import pytest

COMMON = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "benchmarks", "_common.py")
_spec = importlib.util.spec_from_file_location("benchmarks_common", COMMON)
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)


def recording_timers(order: list, names: str, failing: str = "") -> dict:
    """Timers that append their name to ``order`` and return its position; those in ``failing`` raise."""
    def timer(name):
        def time_it():
            order.append(name)
            if name in failing:
                raise RuntimeError(f"{name} broke")
            return float(len(order))
        return time_it
    return {name: timer(name) for name in names}


def test_rounds_interleave_the_implementations():
    order = []
    times = _common.time_in_rounds(recording_timers(order, "abc"), 3)
    assert order == list("abcabcabc")
    assert times == {"a": [1.0, 4.0, 7.0], "b": [2.0, 5.0, 8.0], "c": [3.0, 6.0, 9.0]}


def test_a_failing_timer_stops_the_run_unless_the_caller_records_it():
    with pytest.raises(RuntimeError, match="b broke"):
        _common.time_in_rounds(recording_timers([], "abc", failing="b"), 2)
    order, failures = [], []
    times = _common.time_in_rounds(recording_timers(order, "abc", failing="b"), 2,
                                   lambda name, exc: failures.append((name, str(exc))))
    assert failures == [("b", "b broke")]
    assert order == list("abcac")   # dropped from the later rounds
    assert times == {"a": [1.0, 4.0], "c": [3.0, 5.0]}


def test_the_median_round_is_a_measured_round():
    assert _common.median_round([3.0, 1.0, 2.0]) == 2.0
    assert _common.median_round([4.0, 1.0, 3.0, 2.0]) == 2.0   # the lower middle one, not 2.5
    assert _common.median_round([5.0]) == 5.0
