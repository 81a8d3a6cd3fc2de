"""tritonpatch.llvm and the native registry: listing, typing, set/restore round trips, errors."""
from __future__ import annotations

import ctypes

import pytest

import tritonpatch.llvm as llvm
from tritonpatch.errors import NativeUnavailableError, OptionTypeError, UnknownOptionError


def state():
    """Every option's full observable state, to prove that nothing changed."""
    return {o.name: o for o in llvm.list_options()}


def test_lists_all_options_with_types():
    options = {o.name: o for o in llvm.list_options()}
    assert len(options) >= 1500
    assert options["disable-lsr"].type == "bool"
    assert options["unroll-threshold"].type == "unsigned"
    assert options["stop-after"].type == "string"
    assert options["lsr-drop-solution"].type == "boolOrDefault"
    assert options["debug-pass"].type == "enum"
    assert {"Disabled", "Structure"} <= set(options["debug-pass"].choices)
    assert options["debug"].external  # cl::location(DebugFlag)
    assert options["regalloc"].type == "other" and not options["regalloc"].settable


def test_native_info_reports_calibration():
    info = llvm.native_info()
    assert info["registry_layout"] in {"StringMap", "DenseMap+tombstones", "DenseMap", "DenseMap+used-bitmap"}
    assert int(info["options"]) >= 1500
    assert "disable-lsr" in info["calibrated_with"]


def test_pattern_filters_substring_and_glob():
    names = [o.name for o in llvm.list_options("LSR")]
    assert "disable-lsr" in names and all("lsr" in n for n in names)
    assert all(n.startswith("nvptx-") for n in (o.name for o in llvm.list_options("nvptx-*")))


def _first(kind, external=False):
    for o in llvm.list_options():
        if o.type == kind and o.external == external and o.settable and o.value is not None and not o.specified:
            return o
    pytest.skip(f"no settable {kind} option in this LLVM")


def _other_value(o):
    """A valid value different from the current one."""
    if o.type in ("bool", "boolOrDefault"):
        return not o.value if o.value is not None else True
    if o.type == "string":
        return o.value + "-tritonpatch"
    if o.type == "enum":
        return next(c for c in o.choices if c != o.value)
    if o.type in ("float", "double"):
        return o.value + 0.5
    return o.value + 3


@pytest.mark.parametrize("kind,external", [
    ("bool", False), ("bool", True), ("int", False), ("unsigned", False), ("unsigned long", False),
    ("float", False), ("double", False), ("string", False), ("boolOrDefault", False), ("enum", False),
])
def test_round_trip_restores_exactly(kind, external):
    option = _first(kind, external) if kind != "boolOrDefault" else llvm.get_option("lsr-drop-solution")
    before = state()
    value = _other_value(option)
    with llvm.llvm_options({option.name: value}):
        inside = llvm.get_option(option.name)
        assert inside.value == value and inside.specified
    assert state() == before


def test_restore_keeps_an_already_specified_option():
    saved = llvm.apply_options({"unroll-threshold": 77})
    try:
        with llvm.llvm_options({"unroll-threshold": 5}):
            assert llvm.get_option("unroll-threshold").value == 5
        after = llvm.get_option("unroll-threshold")
        assert after.value == 77 and after.specified
    finally:
        llvm.restore_options(saved)
    assert not llvm.get_option("unroll-threshold").specified


def test_restore_on_exception():
    before = state()
    with pytest.raises(RuntimeError, match="boom"):
        with llvm.llvm_options({"disable-lsr": True, "unroll-threshold": 9}):
            raise RuntimeError("boom")
    assert state() == before


def test_set_option_is_sticky_and_returns_previous():
    before = llvm.get_option("disable-lsr")
    saved = llvm._registry().snapshot("disable-lsr")
    try:
        assert llvm.set_option("disable-lsr", True) is before.value
        assert llvm.get_option("disable-lsr").value is True
    finally:
        llvm.restore_options([saved])
    assert llvm.get_option("disable-lsr") == before


@pytest.mark.parametrize("settings,error,message", [
    ({"disable-lsrr": True}, UnknownOptionError, "did you mean disable-lsr"),
    ({"disable-lsr": "maybe"}, OptionTypeError, "expects a bool"),
    ({"unroll-threshold": -1}, OptionTypeError, r"integer in \[0, 4294967295\]"),
    ({"unroll-threshold": 2**32}, OptionTypeError, "integer"),
    ({"debug-pass": "Nope"}, OptionTypeError, "one of 'Disabled'"),
    ({"stop-after": "a\0b"}, OptionTypeError, "NUL"),
    ({"regalloc": "fast"}, OptionTypeError, "cannot be set"),
    ({"disable-lsr": True, "unroll-threshold": "lots"}, OptionTypeError, "integer"),  # all or nothing
])
def test_bad_input_raises_and_changes_nothing(settings, error, message):
    before = state()
    with pytest.raises(error, match=message):
        llvm.apply_options(settings)
    assert state() == before


def test_value_parsing_accepts_common_spellings():
    assert llvm.normalize_value("disable-lsr", "TRUE") is True
    assert llvm.normalize_value("-disable-lsr", 0) is False
    assert llvm.normalize_value("unroll-threshold", "0x10") == 16
    with pytest.raises(OptionTypeError):
        llvm.normalize_value("unroll-threshold", True)  # a bool is not an integer here


def test_restores_a_value_set_without_an_occurrence(fresh_compiles, monkeypatch):
    """Triton applies DISABLE_LLVM_OPT with a bare assignment (no occurrence) and never resets it
    on 3.6-3.8: a snapshot taken before such a compile must still restore exactly."""
    from compile_helpers import compile_ptx

    before = llvm.get_option("disable-lsr")
    saved = llvm._registry().snapshot("disable-lsr")
    monkeypatch.setenv("DISABLE_LLVM_OPT", "disable-lsr")
    try:
        compile_ptx("fixed_trip_loop")
        leaked = llvm.get_option("disable-lsr")
        assert not leaked.specified  # Triton never records an occurrence
    finally:
        llvm.restore_options([saved])
    assert llvm.get_option("disable-lsr") == before


def _loaded(path):
    ctypes.CDLL(path)
    return path


def test_native_fails_closed_on_libraries_it_cannot_use():
    from tritonpatch import _native
    import triton._C.libproton as proton

    with pytest.raises(RuntimeError, match="not loaded in this process"):
        _native.Registry("/nonexistent/libtriton.so")
    with pytest.raises(RuntimeError, match="stripped"):
        _native.Registry(_loaded("libc.so.6"))
    with pytest.raises(RuntimeError, match="LLVMParseCommandLineOptions"):
        _native.Registry(_loaded(proton.__file__))


def test_unavailable_native_gives_an_actionable_error(monkeypatch):
    import sys

    import tritonpatch

    monkeypatch.setattr(llvm, "_registry_instance", None)
    monkeypatch.delattr(tritonpatch, "_native", raising=False)
    monkeypatch.setitem(sys.modules, "tritonpatch._native", None)  # as if the build were missing
    with pytest.raises(NativeUnavailableError, match="pip install"):
        llvm.list_options()
    assert not llvm.available()
