"""tritonpatch.llvm and the native registry: listing, typing, set/restore round trips, errors."""
from __future__ import annotations

import ctypes

import pytest

import tritonpatch.llvm as llvm
from tritonpatch import _llvm_registry
from tritonpatch.errors import NativeUnavailableError, OptionTypeError, UnknownOptionError, UnsafeOptionError


def state():
    """Every option's full observable state, to prove that nothing changed."""
    return {o.name: o for o in llvm.list_options()}


@pytest.fixture(scope="session")
def triton_initialized(tmp_path_factory):
    """Triton 3.6 sets a few LLVM options itself at its first compile in a process
    (``nvptx-short-ptr``, ...): compile once, so that the state compared is the one every later
    compile starts from."""
    from compile_helpers import compile_ptx

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_ALWAYS_COMPILE", "1")
        patch.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
        compile_ptx("fixed_trip_loop")


@pytest.fixture(autouse=True)
def llvm_state_unchanged(triton_initialized):
    """Every test leaves LLVM's options exactly as it found them."""
    before = state()
    yield
    assert state() == before


def test_lists_all_options_with_types():
    options = {o.name: o for o in llvm.list_options()}
    assert len(options) >= 1500
    assert options["disable-lsr"].type == "bool"
    assert options["unroll-threshold"].type == "unsigned"
    assert options["stop-after"].type == "string"
    assert options["lsr-drop-solution"].type == "boolOrDefault"
    assert options["debug-pass"].type == "enum"
    assert {"Disabled", "Structure"} <= set(options["debug-pass"].choices)
    assert len(options["debug-pass"].choice_values) == len(options["debug-pass"].choices)
    assert options["debug"].external  # cl::location(DebugFlag)
    assert options["regalloc"].type == "other" and not options["regalloc"].settable
    assert options["disable-lsr"].callback == "none"
    # cl::cb callbacks: the pass bisector's limit, and time-passes switched on by time-passes-per-run.
    for name in ("opt-bisect-limit", "time-passes-per-run"):
        assert options[name].callback == "custom" and not options[name].settable


def test_native_info_reports_calibration():
    info = llvm.native_info()
    assert info["registry_layout"] in {"StringMap", "DenseMap+tombstones", "DenseMap", "DenseMap+used-bitmap"}
    assert int(info["options"]) >= 1500
    assert "disable-lsr" in info["calibrated_with"]
    # Symbols come from the mapped file itself where /proc allows it, else from the checked path.
    assert info["symbols_from"].startswith("/proc/self/map_files/") or info["symbols_from"] == info["libtriton"]


def test_pattern_filters_substring_and_glob():
    names = [o.name for o in llvm.list_options("LSR")]
    assert "disable-lsr" in names and all("lsr" in n for n in names)
    assert all(n.startswith("nvptx-") for n in (o.name for o in llvm.list_options("nvptx-*")))


def _first(kind, external=False):
    """The first option of this kind that can be set and is not refused by default (strings all
    are: the first string option then)."""
    for o in llvm.list_options():
        if (o.type == kind and o.external == external and o.settable and o.value is not None and not o.specified
                and (kind == "string" or llvm.unsafe_reason(o.name) is None)):
            return o
    pytest.skip(f"no settable {kind} option in this LLVM")


def _other_value(o):
    """A valid value different from the current one."""
    if o.type in ("bool", "boolOrDefault"):
        return not o.value if o.value is not None else True
    if o.type == "string":
        return o.value + "-tritonpatch"
    if o.type == "enum":
        return next(c for c, v in zip(o.choices, o.choice_values) if v != o.choice_values[o.choices.index(o.value)])
    if o.type in ("float", "double"):
        return o.value + 0.5
    return o.value + 3


def _applied(settings):
    """Apply ``settings`` to LLVM's live values; return what they read back and the saved states."""
    saved = llvm.apply_options(settings)
    return {name: llvm.get_option(name) for name in settings}, saved


@pytest.mark.parametrize("kind,external", [
    ("bool", False), ("bool", True), ("int", False), ("unsigned", False), ("unsigned long", False),
    ("float", False), ("double", False), ("string", False), ("enum", False),
])
def test_round_trip_restores_exactly(kind, external):
    option = _first(kind, external)
    value = _other_value(option)
    with llvm.allow_unsafe_options(option.name):  # string options are refused by default
        inside, saved = _applied({option.name: value})
    llvm.restore_options(saved)
    assert inside[option.name].value == value and inside[option.name].specified


@pytest.mark.parametrize("value", [True, False, None])
def test_bool_or_default_takes_true_false_and_unset(value):
    """``None`` (or ``'unset'``) puts a boolOrDefault back to unset, as never given; restoring puts
    back the value and occurrence count it had."""
    outer, outer_saved = _applied({"lsr-drop-solution": not value if value is not None else True})
    try:
        for spelling in (value, "unset") if value is None else (value,):
            inside, saved = _applied({"lsr-drop-solution": spelling})
            llvm.restore_options(saved)
            assert inside["lsr-drop-solution"].value is value
            assert inside["lsr-drop-solution"].specified is (value is not None)
            assert llvm.get_option("lsr-drop-solution") == outer["lsr-drop-solution"]
    finally:
        llvm.restore_options(outer_saved)


def test_every_enum_choice_can_be_set_aliases_included():
    """Two names for one value (``scalable-vectorization`` on/preferred) are aliases: both can be
    set, and both read back as the first name."""
    for option in llvm.list_options():
        if option.type != "enum" or not option.settable:
            continue
        for choice, stored in zip(option.choices, option.choice_values):
            canonical = option.choices[option.choice_values.index(stored)]
            with llvm.allow_unsafe_options(option.name):  # set, never compiled with: harmless
                inside, saved = _applied({option.name: choice})
            llvm.restore_options(saved)
            assert inside[option.name].value == canonical, (option.name, choice)


@pytest.mark.parametrize("name,alias,canonical", [
    ("scalable-vectorization", "on", "preferred"), ("enable-machine-outliner", "", "always")])
def test_enum_alias_is_set_as_its_canonical_name(name, alias, canonical):
    inside, saved = _applied({name: alias})
    llvm.restore_options(saved)
    assert inside[name].value == canonical
    assert llvm.normalize_value(name, alias) == canonical


def test_restore_keeps_an_already_specified_option():
    outer, saved = _applied({"unroll-threshold": 77})
    try:
        inside, inner = _applied({"unroll-threshold": 5})
        llvm.restore_options(inner)
        assert inside["unroll-threshold"].value == 5
        assert llvm.get_option("unroll-threshold") == outer["unroll-threshold"]
        assert outer["unroll-threshold"].value == 77 and outer["unroll-threshold"].specified
    finally:
        llvm.restore_options(saved)
    assert not llvm.get_option("unroll-threshold").specified


@pytest.mark.parametrize("settings,error,message", [
    ({"disable-lsrr": True}, UnknownOptionError, "did you mean disable-lsr"),
    ({"disable-lsr": "maybe"}, OptionTypeError, "expects a bool"),
    ({"lsr-drop-solution": "maybe"}, OptionTypeError, "or None/'unset'"),
    ({"unroll-threshold": -1}, OptionTypeError, r"integer in \[0, 4294967295\]"),
    ({"unroll-threshold": 2**32}, OptionTypeError, "integer"),
    ({"debug-pass": "Nope"}, OptionTypeError, "one of 'Disabled'"),
    ({"stop-after": "a\0b"}, OptionTypeError, "without NUL characters"),
    ({"regalloc": "fast"}, OptionTypeError, "cannot be set"),
    ({"debug-only": "isel"}, OptionTypeError, "type 'other' is read-only"),  # its type, not its callback
    ({"cold-branch-ratio": 1e39}, OptionTypeError, r"a float can hold \(magnitude at most 3.40282"),
    ({"cold-branch-ratio": "-1e39"}, OptionTypeError, "a float can hold"),
    ({"opt-bisect-limit": 20}, OptionTypeError, r"runs a callback \(cl::cb\)"),
    ({"stop-after": "bogus"}, UnsafeOptionError, "allow_unsafe_options"),
    ({"disable-lsr": True, "unroll-threshold": "lots"}, OptionTypeError, "integer"),  # all or nothing
    ({"disable-lsr": True, "stop-after": "bogus"}, UnsafeOptionError, "stop-after"),  # all or nothing
])
def test_bad_input_raises_and_changes_nothing(settings, error, message):
    with pytest.raises(error, match=message):
        llvm.apply_options(settings)


@pytest.mark.parametrize("call,message", [
    (lambda: llvm.list_options(5), r"list_options\(\) takes a pattern string such as 'lsr' .*, got 5$"),
    (lambda: llvm.apply_options("disable-lsr"),
     r"apply_options\(\) takes a mapping of option name to value such as \{'disable-lsr': True\}, got 'disable-lsr'"),
    (lambda: llvm.apply_options(["disable-lsr"]), r"apply_options\(\) takes a mapping .*, got \['disable-lsr'\]"),
    (lambda: llvm.llvm_options(["disable-lsr"]), r"llvm_options\(\) takes a mapping .*, got \['disable-lsr'\]"),
    (lambda: llvm.restore_options({"x": 1}),
     r"restore_options\(\) takes the list apply_options\(\) returned, got \{'x': 1\}"),
    (lambda: llvm.restore_options(None), r"restore_options\(\) takes the list apply_options\(\) returned, got None"),
    (lambda: llvm.restore_options([1]), r"it holds 1 \(int\), which is no saved option state"),
])
def test_arguments_of_the_wrong_type_name_the_problem(call, message):
    """Wrong argument types give an OptionTypeError (a TypeError) saying what the call takes, not an
    AttributeError or a pybind11 signature from inside (the autouse fixture: nothing changed)."""
    with pytest.raises(OptionTypeError, match=message):
        call()


def test_restore_checks_every_state_before_restoring_any():
    saved = llvm.apply_options({"unroll-threshold": 7})
    try:
        with pytest.raises(OptionTypeError, match=r"it holds 'x' \(str\)"):
            llvm.restore_options(["x"] + saved)  # newest first: saved's state would be restored before 'x'
        assert llvm.get_option("unroll-threshold").value == 7
    finally:
        llvm.restore_options(saved)


@pytest.mark.parametrize("call", [
    lambda: llvm.get_option(None),
    lambda: llvm.set_option(None, 1),
    lambda: llvm.set_option(None, None),
    lambda: llvm.normalize_value(None, 1),
    lambda: llvm.snapshot(None),
    lambda: llvm.unsafe_reason(None),
    lambda: llvm.apply_options({None: 1}),
    lambda: llvm.llvm_options({None: 1}),
])
def test_a_name_that_is_not_a_string_is_an_option_type_error_everywhere(call):
    """One behaviour for every call taking an option name: a non-string is a type problem
    (OptionTypeError); an empty string is an unknown name (UnknownOptionError, below)."""
    with pytest.raises(OptionTypeError, match=r"an LLVM option name is a string such as 'disable-lsr', got None"):
        call()


@pytest.mark.parametrize("call", [lambda: llvm.get_option(""), lambda: llvm.set_option("--", 1)])
def test_an_empty_name_is_an_unknown_option(call):
    with pytest.raises(UnknownOptionError, match="must not be empty"):
        call()


def test_value_parsing_accepts_common_spellings():
    assert llvm.normalize_value("disable-lsr", "TRUE") is True
    assert llvm.normalize_value("-disable-lsr", 0) is False
    assert llvm.normalize_value("unroll-threshold", "0x10") == 16
    assert llvm.normalize_value("lsr-drop-solution", " Unset ") is None
    assert llvm.normalize_value("cold-branch-ratio", 0.1) == 0.10000000149011612  # the nearest float32
    assert llvm.normalize_value("cold-branch-ratio", 3.4028235e38) == 3.4028234663852886e38  # rounds down
    with pytest.raises(OptionTypeError):
        llvm.normalize_value("unroll-threshold", True)  # a bool is not an integer here


def test_restores_an_option_triton_set_itself(fresh_compiles, monkeypatch):
    """Triton applies DISABLE_LLVM_OPT itself and, before 3.9, never resets it (3.6 with a bare
    assignment that records no occurrence, 3.8 with an occurrence): a snapshot taken before such a
    compile must still restore exactly."""
    from compile_helpers import compile_ptx

    before = llvm.get_option("disable-lsr")
    saved = _llvm_registry.native_registry().snapshot("disable-lsr")
    monkeypatch.setenv("DISABLE_LLVM_OPT", "disable-lsr")
    try:
        compile_ptx("fixed_trip_loop")
    finally:
        llvm.restore_options([saved])
    assert llvm.get_option("disable-lsr") == before


def test_native_refuses_what_python_refuses():
    """The native module itself never runs a callback it cannot undo, nor unsets a non-boolOrDefault."""
    registry = _llvm_registry.native_registry()
    with pytest.raises(ValueError, match="runs a callback"):
        registry.parse("opt-bisect-limit", "20")
    with pytest.raises(ValueError, match="not a boolOrDefault"):
        registry.unset("disable-lsr")


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

    monkeypatch.setattr(_llvm_registry, "_registry_instance", None)
    monkeypatch.delattr(tritonpatch, "_native", raising=False)
    monkeypatch.setitem(sys.modules, "tritonpatch._native", None)  # as if the build were missing
    with pytest.raises(NativeUnavailableError, match="pip install"):
        llvm.list_options()
    assert not llvm.available()
