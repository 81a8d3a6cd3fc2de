"""Options whose valid values still end the process inside LLVM, touch files or start programs are
refused at validation (Pipeline, options(), environment variables, CLI), with the reason and the
way to allow them; allowed, they reach LLVM unchanged."""
from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import textwrap

import pytest

import tritonpatch
import tritonpatch.llvm as llvm
from pipeline_helpers import HERE, child_environment
from test_llvm_options import llvm_state_unchanged, triton_initialized  # noqa: F401 (fixtures)
from tritonpatch.errors import OptionTypeError, PipelineError, UnsafeOptionError
from tritonpatch.pipeline import pipeline_from_environ

# Values that fit their option's type and, set for a compile, ended the process (Triton 3.6-3.9,
# whose LLVM is built with assertions), plus options that write files or start programs.
DEADLY = [
    ("stop-after", "bogus"),                       # LLVM ERROR: "bogus" pass is not registered (exit 1)
    ("stop-after", "block-placement"),             # SIGSEGV
    ("chr-function-list", "x"),                    # cannot read the file: exit 1
    ("forceattrs-csv-path", "x"),                  # cannot open the CSV file: exit 1 (3.6)
    ("fast-isel-abort", 1),                        # LLVM ERROR: -fast-isel-abort > 0 requires -fast-isel
    ("enable-ml-inliner", "development"),          # could not set up the inlining advisor: exit 1
    ("accel-tables", "Dwarf"),                     # assertion in DwarfUnit (abort, 3.6)
    ("non-global-value-max-name-size", 0),         # assertion in ValueSymbolTable (abort)
    ("stackmap-version", 0),                       # UNREACHABLE in StackMaps (abort)
    ("lsr-complexity-limit", 1),                   # assertion in LoopStrengthReduce (abort)
    ("enable-gvn-memoryssa", True),                # assertion in GVN (abort)
    ("enable-implicit-null-checks", True),         # UNREACHABLE in MachineFunctionPass (abort)
    ("disable-fp-call-folding", True),             # SIGSEGV (3.9)
    ("view-isel-dags", True),                      # starts a graph viewer
    ("exec-on-ir-change", "x"),                    # runs a program after every changing pass
    ("info-output-file", "x"),                     # writes a file
]


@pytest.mark.parametrize("name,value", DEADLY)
def test_deadly_values_are_refused_with_the_reason(name, value):
    with pytest.raises(OptionTypeError) as info:
        tritonpatch.Pipeline(llvm={name: value})
    message = str(info.value)
    assert name in message
    if isinstance(info.value, UnsafeOptionError):  # refused by the safety rules: says how to allow it
        assert llvm.unsafe_reason(name) in message
        assert f"allow_unsafe_options({name!r})" in message
    else:  # not settable at all (info-output-file: its callback could not be checked)
        assert "cannot be set" in message


_REFUSE_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {here!r})
    import tritonpatch
    from pipeline_helpers import compile_kernel
    for name, value in json.loads(sys.argv[1]):
        try:
            with tritonpatch.options(llvm={{name: value}}):
                compile_kernel()
        except tritonpatch.OptionTypeError as exc:
            print("refused", name, flush=True)
        else:
            print("compiled", name, flush=True)
""")


def test_deadly_values_never_reach_llvm():
    """All of them in one process, compiling for real: each is refused and the process lives."""
    child = subprocess.run([sys.executable, "-c", _REFUSE_CHILD.format(here=HERE), json.dumps(DEADLY)],
                           capture_output=True, text=True, timeout=300, env=child_environment())
    assert child.returncode == 0, f"exit {child.returncode} after:\n{child.stdout}\n{child.stderr[-2000:]}"
    assert child.stdout.split("\n")[:-1] == [f"refused {name}" for name, _ in DEADLY]


def test_allowed_option_reaches_llvm_unchanged():
    """The escape hatch passes the value through as it is: here LLVM ends the process, as it says."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {HERE!r})
        import tritonpatch, tritonpatch.llvm
        from pipeline_helpers import compile_kernel
        tritonpatch.llvm.allow_unsafe_options("stop-after")
        with tritonpatch.options(llvm={{"stop-after": "bogus"}}):
            compile_kernel()
    """)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env=child_environment())
    assert child.returncode != 0 and '"bogus" pass is not registered' in child.stderr, child.stderr[-2000:]


def test_allowance_is_process_wide_or_for_a_block():
    with pytest.raises(UnsafeOptionError):
        llvm.normalize_value("print-after-all", True)
    with llvm.allow_unsafe_options("print-after-all", "-stop-after"):
        assert llvm.normalize_value("print-after-all", True) is True
        assert llvm.normalize_value("stop-after", "block-placement") == "block-placement"
        with llvm.allow_unsafe_options("print-after-all"):  # grants nest
            pass
        assert llvm.normalize_value("print-after-all", True) is True
    with pytest.raises(UnsafeOptionError):
        llvm.normalize_value("print-after-all", True)
    grant = llvm.allow_unsafe_options("print-after-all")  # no block: from now on
    try:
        assert llvm.normalize_value("print-after-all", True) is True
    finally:
        grant.__exit__(None, None, None)
    with pytest.raises(UnsafeOptionError):
        llvm.normalize_value("print-after-all", True)


def test_callback_options_cannot_be_allowed():
    with pytest.raises(OptionTypeError, match="cannot be allowed: setting it runs a callback"):
        llvm.allow_unsafe_options("opt-bisect-limit")


def test_options_that_crash_on_purpose_are_refused():
    """Test aids of Triton 3.9's LLVM (``codegen-pipeline-trigger-crash``, ...) abort when switched on."""
    for option in llvm.list_options("*trigger-crash"):
        assert llvm.unsafe_reason(option.name) is not None, option.name


def test_codegen_tuning_options_are_not_refused():
    for name in ("disable-lsr", "unroll-threshold", "enable-misched", "scalable-vectorization", "lsr-drop-solution"):
        assert llvm.unsafe_reason(name) is None, name
    assert llvm.unsafe_reason("nvptx-lower-global-ctor-dtor-id") is not None  # every string option is


def test_environment_names_the_variable_and_the_reason():
    with pytest.raises(PipelineError, match=r"TRITONPATCH_LLVM_OPTIONS='stop-after=bogus': bad token "
                                            r"'stop-after=bogus': LLVM option 'stop-after' is refused"):
        pipeline_from_environ({"TRITONPATCH_LLVM_OPTIONS": "stop-after=bogus"})


_AUTOLOAD_CHILD = textwrap.dedent("""
    import site, sys
    if sys.argv[1]:
        site.addsitedir(sys.argv[1])  # what `site` does with the installed .pth at start-up
    sys.path.insert(0, {here!r})
    from pipeline_helpers import compile_kernel
    print(len(compile_kernel().asm["ptx"]))
""")


def test_autoload_with_a_refused_option_warns_once_and_runs_unpatched(tmp_path):
    """``TRITONPATCH_AUTOLOAD=1 TRITONPATCH_LLVM_OPTIONS=stop-after=bogus``: one warning line, the
    compile runs unpatched, the process exits 0."""
    site_dir = ""
    if not any(os.path.exists(os.path.join(d, "tritonpatch_autoload.pth")) for d in site.getsitepackages()):
        site_dir = str(tmp_path / "site")  # editable checkout: hand the repository's .pth to `site`
        os.makedirs(site_dir)
        shutil.copy(os.path.join(os.path.dirname(HERE), "tritonpatch_autoload.pth"), site_dir)
    child = subprocess.run(
        [sys.executable, "-c", _AUTOLOAD_CHILD.format(here=HERE), site_dir], capture_output=True, text=True,
        timeout=300, env=child_environment({"TRITONPATCH_AUTOLOAD": "1", "TRITONPATCH_LLVM_OPTIONS": "stop-after=bogus"}))
    assert child.returncode == 0, child.stderr[-2000:]
    warnings = [line for line in child.stderr.splitlines() if line.startswith("tritonpatch warning:")]
    assert len(warnings) == 1 and "'stop-after' is refused" in warnings[0], child.stderr
    assert int(child.stdout.split()[-1]) > 0
