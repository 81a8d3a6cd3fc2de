"""``tritonpatch.llvm.snapshot()``: the current values of the settable LLVM options, read-only, to
compare against (``assert llvm.snapshot() == before``)."""
from __future__ import annotations

import pytest
from triton import knobs

import tritonpatch
import tritonpatch.llvm as llvm
from pipeline_helpers import compile_kernel

pytestmark = pytest.mark.skipif(not llvm.available(), reason="tritonpatch._native is not usable here")


def test_snapshot_holds_every_settable_option_and_nothing_else():
    everything = llvm.list_options()
    snapshot = llvm.snapshot()
    assert list(snapshot) == sorted(snapshot)
    assert snapshot == {option.name: option.value for option in everything if option.settable}
    assert "disable-lsr" in snapshot and "unroll-threshold" in snapshot
    assert "opt-bisect-limit" not in snapshot  # setting it runs a callback: never settable
    assert any(not option.settable for option in everything)


def test_snapshot_of_named_options():
    assert llvm.snapshot("unroll-threshold", "--disable-lsr") == {
        "disable-lsr": llvm.get_option("disable-lsr").value,
        "unroll-threshold": llvm.get_option("unroll-threshold").value}
    assert llvm.snapshot("opt-bisect-limit") == {"opt-bisect-limit": llvm.get_option("opt-bisect-limit").value}
    with pytest.raises(llvm.UnknownOptionError, match="did you mean"):
        llvm.snapshot("disable-lrs")


def test_a_live_change_shows_up_and_is_gone_after_restore():
    before = llvm.snapshot()
    saved = llvm.apply_options({"unroll-threshold": before["unroll-threshold"] + 7, "disable-lsr": True})
    try:
        during = llvm.snapshot()
    finally:
        llvm.restore_options(saved)
    assert {name for name in before if during[name] != before[name]} == {"unroll-threshold", "disable-lsr"}
    assert during["unroll-threshold"] == before["unroll-threshold"] + 7 and during["disable-lsr"] is True
    assert llvm.snapshot() == before


def test_snapshot_changes_nothing():
    before = llvm.list_options()
    llvm.snapshot()
    llvm.snapshot("disable-lsr")
    assert llvm.list_options() == before


@pytest.fixture
def stage_recorder(monkeypatch, tmp_path):
    """A stages hook under tritonpatch's that records ``llvm.snapshot()`` inside each compile's
    ``llir`` stage, where tritonpatch applies the Pipeline's LLVM options."""
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DISABLE_LLVM_OPT", raising=False)
    seen = []

    def recorder(*args):
        if not args:  # Triton 3.7+: this hook adds nothing to the cache keys
            return "", ""
        stages = args[1]
        llir = stages["llir"]

        def llir_recorded(src, metadata):
            seen.append(llvm.snapshot())
            return llir(src, metadata)

        stages["llir"] = llir_recorded

    tritonpatch.uninstall()
    knobs.runtime.add_stages_inspection_hook = recorder
    tritonpatch.install()
    yield seen
    tritonpatch.uninstall()
    knobs.runtime.add_stages_inspection_hook = None


def test_a_plain_compile_leaves_every_value_as_it_was(stage_recorder):
    """Once Triton's first compile in the process has set what it sets itself in C++ (on 3.6.0
    nvptx-short-ptr, nvptx-mad-wide-opt and slp-copyable-elements), a compile changes nothing."""
    compile_kernel()
    after_one = llvm.snapshot()
    compile_kernel()
    assert llvm.snapshot() == after_one


def test_set_option_shows_up_inside_a_compile_only(stage_recorder):
    compile_kernel()  # what Triton's first compile in a process sets itself, set before `before`
    stage_recorder.clear()
    before = llvm.snapshot()
    previous = llvm.set_option("unroll-threshold", before["unroll-threshold"] + 3)
    try:
        assert llvm.snapshot() == before  # set_option changes LLVM only around compiles
        compile_kernel()
    finally:
        llvm.set_option("unroll-threshold", previous)
    (inside,) = stage_recorder
    assert {name for name in before if inside[name] != before[name]} == {"unroll-threshold"}
    assert llvm.snapshot() == before
