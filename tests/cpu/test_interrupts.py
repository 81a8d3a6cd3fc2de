"""Ctrl-C (SIGINT) while a compile's LLVM options change hands: it is held back until they are applied or
restored, so no option stays set for later compiles and the option gate is never left taken; while the
stage itself runs it interrupts as before."""
from __future__ import annotations

import os
import signal
import threading

import pytest

import tritonpatch
import tritonpatch.llvm as tllvm
from pipeline_helpers import BOTH
from tritonpatch import hooks
from tritonpatch._llvm_gate import gate
from tritonpatch._llvm_scope import registry as scope_registry

pytestmark = pytest.mark.skipif(not tllvm.available(), reason="tritonpatch._native is not usable here")


def option_values() -> dict:
    return {name: tllvm.get_option(name).value for name in ("disable-lsr", "unroll-count")}


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def stage_with_options(stage=lambda src, metadata: option_values()):
    return hooks._with_llvm_options(stage, tritonpatch.Pipeline(**BOTH).llvm, ())


def assert_left_as_found(defaults: dict) -> None:
    assert option_values() == defaults
    assert gate.depth() == 0 and gate._holders == 0 and not gate._transition


@pytest.mark.parametrize("when", ["applying", "restoring"])
def test_ctrl_c_while_options_change_hands_leaves_nothing_set(monkeypatch, when):
    """SIGINT arriving while the options were applied (after the last one was set) or restored (before the
    first was put back): the KeyboardInterrupt left every option set for the compiles after it (under their
    own cache keys), with nothing left to restore them."""
    defaults = option_values()
    name = "apply_options_into" if when == "applying" else "restore_options_from"
    real = getattr(scope_registry, name)

    def interrupted(*args):
        if when == "applying":
            real(*args)
            ctrl_c()
        else:
            ctrl_c()
            real(*args)

    monkeypatch.setattr(scope_registry, name, interrupted)
    run = stage_with_options()
    with pytest.raises(KeyboardInterrupt):
        run(None, None)
    monkeypatch.undo()
    assert_left_as_found(defaults)
    assert run(None, None) != defaults            # the options still reach a compile, and go again after it
    assert_left_as_found(defaults)


def test_ctrl_c_during_the_stage_interrupts_it():
    defaults = option_values()
    reached = []

    def long_stage(src, metadata):
        reached.append(option_values())
        ctrl_c()
        reached.append("after the signal")   # not reached: the interrupt is delivered in the stage

    with pytest.raises(KeyboardInterrupt):
        stage_with_options(long_stage)(None, None)
    assert reached == [{"disable-lsr": True, "unroll-count": BOTH["llvm"]["unroll-count"]}]
    assert_left_as_found(defaults)


def test_a_handler_of_the_programs_own_runs_once_the_options_are_restored(monkeypatch):
    defaults = option_values()
    seen = []

    def handler(signum, frame):
        seen.append(option_values())

    previous = signal.signal(signal.SIGINT, handler)
    try:
        real = scope_registry.restore_options_from

        def interrupted(*args):
            ctrl_c()
            real(*args)

        monkeypatch.setattr(scope_registry, "restore_options_from", interrupted)
        stage_with_options()(None, None)
        assert seen == [defaults]                          # called once, after the restore
        assert signal.getsignal(signal.SIGINT) is handler  # and in place again
    finally:
        signal.signal(signal.SIGINT, previous)
    assert_left_as_found(defaults)


def test_other_threads_compile_as_before():
    defaults = option_values()
    results = []
    thread = threading.Thread(target=lambda: results.append(stage_with_options()(None, None)))
    thread.start()
    thread.join(60)
    assert results and results[0] != defaults
    assert_left_as_found(defaults)
