"""Opening the native registry (its constructor calibrates by flipping ``disable-lsr`` and
``unroll-threshold`` through LLVM's parser) holds the LLVM option scope exclusively, so no compile
is in its LLVM stages meanwhile. Each check runs in a fresh process, where the registry is not open yet."""
from __future__ import annotations

import textwrap

import pytest

import tritonpatch.llvm as tllvm
from pipeline_helpers import child_environment, run_fresh_process

pytestmark = pytest.mark.skipif(not tllvm.available(), reason="tritonpatch._native is not usable here")

PRELUDE = textwrap.dedent("""
    import json, sys, threading, time
    from tritonpatch._llvm_scope import scope
    from tritonpatch import _llvm_registry
    import tritonpatch.llvm as llvm
    assert _llvm_registry._registry_instance is None
""")


def run(code: str) -> dict:
    return run_fresh_process(PRELUDE + textwrap.dedent(code), child_environment())


def test_first_open_waits_for_a_compile_in_its_llvm_stages():
    result = run("""
        in_stage, leave_stage, opened = threading.Event(), threading.Event(), threading.Event()

        def compile_in_its_llvm_stage():  # what a compile holds around llir / ptx
            scope.enter((), ())
            in_stage.set()
            leave_stage.wait(60)
            scope.exit()

        def list_options():  # e.g. a user's llvm.list_options() in another thread
            llvm.list_options("lsr")
            opened.set()

        compiler = threading.Thread(target=compile_in_its_llvm_stage)
        compiler.start()
        in_stage.wait(60)
        lister = threading.Thread(target=list_options)
        lister.start()
        opened_during_stage = opened.wait(1.0)
        leave_stage.set()
        compiler.join()
        lister.join(60)
        sys.stdout.write(json.dumps({"during": opened_during_stage, "after": opened.is_set()}))
    """)
    assert result == {"during": False, "after": True}


def test_a_compile_waits_while_the_registry_calibrates():
    result = run("""
        real_open = _llvm_registry._open_registry
        calibrating, order = threading.Event(), []

        def slow_open():
            calibrating.set()
            time.sleep(1.0)
            order.append("calibrated")
            return real_open()

        _llvm_registry._open_registry = slow_open
        opener = threading.Thread(target=llvm.available)
        opener.start()
        calibrating.wait(60)
        scope.enter((), ())  # a compile reaching its llir stage
        order.append("compile in its stage")
        scope.exit()
        opener.join(60)
        sys.stdout.write(json.dumps(order))
    """)
    assert result == ["calibrated", "compile in its stage"]


def test_opening_from_inside_a_stage_is_an_error_not_a_deadlock():
    result = run("""
        scope.enter((), ())
        try:
            llvm.available()
            outcome = "opened"
        except RuntimeError as exc:
            outcome = str(exc)
        scope.exit()
        sys.stdout.write(json.dumps({"outcome": outcome, "available_after": llvm.available()}))
    """)
    assert "cannot be opened from inside a compile's llir/ptx stage" in result["outcome"]
    assert result["available_after"] is True
