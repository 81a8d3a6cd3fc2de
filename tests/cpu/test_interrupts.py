"""Ctrl-C (SIGINT) while a compile's LLVM options change hands: it is held back until they are applied or
restored, so no option stays set for later compiles and the option gate is never left taken; while the
stage itself runs it interrupts as before."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

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


def test_ctrl_c_at_any_bytecode_of_a_compiles_option_section_leaves_nothing_behind():
    """The SIGINT handler in effect is run at each bytecode of one wrapped stage in turn, as a signal arriving
    there would be: the KeyboardInterrupt is raised, and no option, gate hold or handler is left behind. A signal
    handled right after the stage returned left the deferring handler installed for good (every later Ctrl-C
    recorded and never handed on), and one read while a recorded signal was cleared was lost."""
    defaults = option_values()
    run = stage_with_options()
    faults = []

    def run_with_a_signal_at(point):
        counter = [0]

        def tracer(frame, event, arg):
            frame.f_trace_opcodes = True
            if event == "opcode":
                counter[0] += 1
                if counter[0] == point:
                    signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)
            return tracer

        interrupted = False
        sys.settrace(tracer)
        try:
            run(None, None)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sys.settrace(None)
        return counter[0], interrupted

    total, _ = run_with_a_signal_at(0)
    for point in range(1, total + 1):
        _, interrupted = run_with_a_signal_at(point)
        state = (option_values(), gate._holders, gate._transition, signal.getsignal(signal.SIGINT))
        if not interrupted or state != (defaults, 0, False, signal.default_int_handler):
            faults.append((point, interrupted, state))
            signal.signal(signal.SIGINT, signal.default_int_handler)
    assert not faults, faults[:5]


def test_ctrl_c_stops_a_wait_for_the_option_gate():
    """A compile waiting for another thread's compile with other options to leave its LLVM stages: Ctrl-C was
    held back until that compile ended (the wait sits inside the held-back section); nothing is applied yet
    there, so it goes through at once."""
    defaults = option_values()
    holding, release = threading.Event(), threading.Event()

    def other_compile():
        hooks._with_llvm_options(lambda src, metadata: (holding.set(), release.wait(30)),
                                 tritonpatch.Pipeline(disable_lsr=True).llvm, ())(None, None)

    thread = threading.Thread(target=other_compile)
    thread.start()
    holding.wait(30)
    timer = threading.Timer(0.3, ctrl_c)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            stage_with_options()(None, None)           # another option set: waits for the gate
        waited = time.monotonic() - started
    finally:
        release.set()
        thread.join(60)
        timer.cancel()
    assert waited < 10
    assert_left_as_found(defaults)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("installed", ["a handler", "SIG_IGN"])
def test_a_handler_the_stage_installs_stays(installed):
    defaults = option_values()
    handler = (lambda signum, frame: None) if installed == "a handler" else signal.SIG_IGN

    def stage(src, metadata):
        signal.signal(signal.SIGINT, handler)

    try:
        stage_with_options(stage)(None, None)
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert_left_as_found(defaults)
