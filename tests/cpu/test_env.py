"""TRITONPATCH_* variables: parsing, error messages, and activation at interpreter start."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import tritonpatch.llvm as tllvm
from pipeline_helpers import HERE, child_environment, fresh_process_ptx
from tritonpatch import Pipeline, PipelineError, env
from tritonpatch.pipeline import pipeline_from_environ

ROOT = os.path.dirname(os.path.dirname(HERE))   # the repository (HERE: tests/_support)
native = pytest.mark.skipif(not tllvm.available(), reason="tritonpatch._native is not usable here")


@pytest.mark.parametrize("value,expected", [("1", True), (" TRUE ", True), ("on", True), ("yes", True),
                                            ("0", False), ("", False), ("off", False), ("No", False)])
def test_parse_bool(value, expected):
    assert env.parse_bool("TRITONPATCH_STRICT", {"TRITONPATCH_STRICT": value}) is expected


def test_parse_bool_unset_and_bad():
    assert env.parse_bool("TRITONPATCH_STRICT", {}) is False
    with pytest.raises(PipelineError, match=r"TRITONPATCH_STRICT='maybe': bad token 'maybe'"):
        env.strict({"TRITONPATCH_STRICT": "maybe"})


def test_parse_llvm_options():
    assert env.parse_llvm_options("disable-lsr, unroll-count=2,-unroll-runtime") == {
        "disable-lsr": True, "unroll-count": "2", "unroll-runtime": True}
    assert env.parse_llvm_options(" ") == {}


@pytest.mark.parametrize("value,token", [("disable-lsr,,x", ""), ("unroll-count=", "unroll-count="),
                                         ("=3", "=3"), ("bad name", "bad name"), ("a,", "")])
def test_parse_llvm_options_errors(value, token):
    with pytest.raises(PipelineError) as info:
        env.parse_llvm_options(value)
    assert f"TRITONPATCH_LLVM_OPTIONS={value!r}: bad token {token!r}" in str(info.value)


def test_split_pass_list():
    assert env.split_pass_list("a, b(x=1,y=2) ,c()") == ["a", "b(x=1,y=2)", "c()"]
    assert env.split_pass_list("") == []
    for bad in ("a,,b", "a(x=1", "a)b", "a,"):
        with pytest.raises(PipelineError, match="TRITONPATCH_PASSES"):
            env.split_pass_list(bad)


def test_parse_ptxas_options():
    assert env.parse_ptxas_options("  --maxrregcount=64   -O1 ") == ["--maxrregcount=64", "-O1"]
    with pytest.raises(PipelineError, match=r"TRITONPATCH_PTXAS_OPTIONS='-O1 64': bad token '64'"):
        env.parse_ptxas_options("-O1 64")


def test_log_level():
    assert env.log_level({}) is None
    assert env.log_level({"TRITONPATCH_LOG": "INFO"}) == "info"
    with pytest.raises(PipelineError, match="TRITONPATCH_LOG='loud': bad token 'loud'"):
        env.log_level({"TRITONPATCH_LOG": "loud"})


def test_compile_threads():
    assert env.compile_threads({"TRITONPATCH_COMPILE_THREADS": "3"}) == 3
    assert env.compile_threads({"TRITONPATCH_COMPILE_THREADS": " 1024 "}) == 1024
    assert env.compile_threads({}) == min(os.cpu_count() or 1, 16)
    # '\u00b2' and '\u0663' pass str.isdigit(); int() refuses the first and reads the second as 3.
    for bad in ("0", "-2", "four", "2.5", "\u00b2", "\u0663", "1025", "9" * 5000, "3\0"):
        with pytest.raises(PipelineError, match="expected a positive integer") as info:
            env.compile_threads({"TRITONPATCH_COMPILE_THREADS": bad})
        message = str(info.value)
        assert message.startswith(f"TRITONPATCH_COMPILE_THREADS={env.quote(bad)}") and len(message) < 300


def test_quote_bounds_long_values():
    assert env.quote("abc") == "'abc'"
    quoted = env.quote("x" * 100_000)
    assert quoted == repr("x" * env.QUOTE_LIMIT) + "… (100000 characters)"
    assert env.quote("a\0\nb") == "'a\\x00\\nb'"  # escaped: one line, NUL visible


def test_huge_value_gives_a_bounded_message():
    value = "unroll-threshold=1," + "x" * 100_000 + "=,"
    with pytest.raises(PipelineError) as info:
        env.parse_llvm_options(value)
    assert len(str(info.value)) < 400 and "(100021 characters)" in str(info.value)


@pytest.mark.parametrize("value", ["1", "true", " Yes ", "ON"])
def test_tuning_cache_refuses_boolean_words(value):
    """`TRITONPATCH_TUNING_CACHE=1` reads as "turn it on", not as a directory named 1."""
    with pytest.raises(PipelineError, match=r"expected a directory, or 0 .*write \./"):
        env.tuning_cache_dir({"TRITONPATCH_TUNING_CACHE": value})


def test_tuning_cache_values():
    default = os.path.join(os.path.expanduser("~"), ".cache", "tritonpatch", "tuning")
    for value in ("", "  ", "\t\n"):
        assert env.tuning_cache_dir({"TRITONPATCH_TUNING_CACHE": value}) == default
    assert env.tuning_cache_dir({"TRITONPATCH_TUNING_CACHE": "./1"}) == "./1"
    assert env.tuning_cache_dir({"TRITONPATCH_TUNING_CACHE": " /tmp/t\u00fcning "}) == "/tmp/t\u00fcning"
    with pytest.raises(PipelineError, match="no NUL characters"):
        env.tuning_cache_dir({"TRITONPATCH_TUNING_CACHE": "/tmp/a\0b"})


@pytest.mark.parametrize("value,message", [
    ("-O1\0-O3", "contains a NUL character"),
    ("--gpu-name=sm_80", "Triton sets the target"), ("-arch=sm_80", "Triton sets the target"),
    ("-o=/tmp/x.cubin", "Triton sets the output file"), ("--input-as-string=x", "Triton sets the input"),
    ("-optf=flags.txt", "cannot be checked"), ("--help", "compile nothing"), ("-V", "compile nothing"),
])
def test_ptxas_options_refusals(value, message):
    with pytest.raises(PipelineError, match=message):
        env.parse_ptxas_options(value)
    with pytest.raises(PipelineError, match=message):  # the Python API takes the same path
        Pipeline(ptxas=[value])


@pytest.mark.parametrize("value", ["", " ", "\t \n", "\u3000"])
def test_blank_values_mean_the_default(value):
    environ = {name: value for name in (env.DISABLE_LSR, env.LLVM_OPTIONS, env.PASSES, env.PTXAS_OPTIONS, env.LOG,
                                        env.STRICT, env.AUTOLOAD, env.COMPILE_THREADS, env.TUNING_CACHE,
                                        env.FAST_LAUNCH)}
    env.check_environment(environ)
    assert env.pipeline_settings(environ) == {} and env.log_level(environ) is None and not env.strict(environ)
    assert env.compile_threads(environ) == env.compile_threads({}) and env.fast_launch(environ)
    assert env.tuning_cache_dir(environ) == env.tuning_cache_dir({})


@pytest.mark.parametrize("variable,value", [
    ("TRITONPATCH_TUNING_CACHE", "on"), ("TRITONPATCH_COMPILE_THREADS", "\u00b2"), ("TRITONPATCH_FAST_LAUNCH", "2"),
    ("TRITONPATCH_LOG", "\u0131nfo"), ("TRITONPATCH_PTXAS_OPTIONS", "--version"), ("TRITONPATCH_AUTOLOAD", "maybe"),
])
def test_check_environment_covers_every_variable(variable, value):
    with pytest.raises(PipelineError, match=variable):
        env.check_environment({variable: value})


def test_settings_without_llvm():
    assert env.pipeline_settings({}) == {}
    assert env.pipeline_settings({"TRITONPATCH_PTXAS_OPTIONS": "-O1", "TRITONPATCH_DISABLE_LSR": "0"}) == {
        "ptxas": ["-O1"]}  # 0 = Triton's default, not an explicit disable-lsr=false
    with pytest.raises(PipelineError, match="set it in one place"):
        env.pipeline_settings({"TRITONPATCH_DISABLE_LSR": "1", "TRITONPATCH_LLVM_OPTIONS": "disable-lsr"})


@native
def test_pipeline_from_environ():
    environ = {"TRITONPATCH_DISABLE_LSR": "1", "TRITONPATCH_LLVM_OPTIONS": "unroll-count=2",
               "TRITONPATCH_PTXAS_OPTIONS": "-O1"}
    assert pipeline_from_environ(environ) == Pipeline(disable_lsr=True, llvm={"unroll-count": 2}, ptxas=["-O1"])
    assert pipeline_from_environ({}).is_empty


@native
@pytest.mark.parametrize("environ,message", [
    ({"TRITONPATCH_LLVM_OPTIONS": "disable-lsr,no-such-option-xyz"},
     "TRITONPATCH_LLVM_OPTIONS='disable-lsr,no-such-option-xyz': bad token 'no-such-option-xyz'"),
    ({"TRITONPATCH_LLVM_OPTIONS": "unroll-count=many"},
     "TRITONPATCH_LLVM_OPTIONS='unroll-count=many': bad token 'unroll-count=many'"),
    ({"TRITONPATCH_DISABLE_LSR": "sometimes"}, "TRITONPATCH_DISABLE_LSR='sometimes': bad token 'sometimes'"),
    ({"TRITONPATCH_PASSES": "no-such-pass-xyz"}, "TRITONPATCH_PASSES='no-such-pass-xyz': bad token 'no-such-pass-xyz'"),
])
def test_pipeline_from_environ_names_variable_and_token(environ, message):
    with pytest.raises(PipelineError) as info:
        pipeline_from_environ(environ)
    assert message in str(info.value)


# --- activation at interpreter start ------------------------------------------------------------

_AUTOLOAD_CHILD = textwrap.dedent("""
    import json, site, sys
    if sys.argv[1]:
        site.addsitedir(sys.argv[1])  # what `site` does with the installed .pth at start-up
    heavy = sorted(m for m in ("triton", "torch") if m in sys.modules)
    sys.path.insert(0, {here!r})
    import importlib.util
    assert importlib.util.find_spec("triton") is not None  # a probe (torch does one) must not disarm autoload
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from pipeline_helpers import CONSTEXPRS, SIGNATURE, strided_sum
    src = ASTSource(fn=strided_sum, signature={{**SIGNATURE, "BLOCK": "constexpr"}}, constexprs=CONSTEXPRS)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={{"num_warps": 4}})
    hooked = triton.knobs.runtime.add_stages_inspection_hook is not None
    print(json.dumps({{"ptx": kernel.asm["ptx"], "heavy_at_start": heavy, "hooked": hooked}}))
""")


def _pth_installed() -> bool:
    import site

    return any(os.path.exists(os.path.join(d, "tritonpatch_autoload.pth")) for d in site.getsitepackages())


@native
def test_autoload_subprocess(tmp_path):
    """`TRITONPATCH_AUTOLOAD=1 TRITONPATCH_DISABLE_LSR=1` with no tritonpatch import compiles with LSR
    disabled (same PTX as Triton's own DISABLE_LLVM_OPT=disable-lsr) and TRITONPATCH_LOG=info says
    so; a malformed value warns in one line and the program runs unpatched."""
    site_dir = ""
    if not _pth_installed():  # editable checkout: hand the repository's .pth to `site` ourselves
        site_dir = str(tmp_path / "site")
        os.makedirs(site_dir)
        shutil.copy(os.path.join(ROOT, "tritonpatch_autoload.pth"), site_dir)
    code = _AUTOLOAD_CHILD.format(here=HERE)
    cases = {
        "lsr": {"TRITONPATCH_AUTOLOAD": "1", "TRITONPATCH_DISABLE_LSR": "1", "TRITONPATCH_LOG": "info"},
        "malformed": {"TRITONPATCH_AUTOLOAD": "1", "TRITONPATCH_DISABLE_LSR": "sometimes"},
    }
    children = {
        label: subprocess.Popen([sys.executable, "-c", code, site_dir], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=child_environment(extra))
        for label, extra in cases.items()
    }
    reference = fresh_process_ptx({"default": (None, {}), "triton_lsr": (None, {"DISABLE_LLVM_OPT": "disable-lsr"})})
    results = {}
    for label, child in children.items():
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        results[label] = (json.loads(out.strip().splitlines()[-1]), err)

    lsr, lsr_err = results["lsr"]
    assert lsr["heavy_at_start"] == [] and lsr["hooked"]
    assert lsr["ptx"] == reference["triton_lsr"] != reference["default"]
    logged = [line for line in lsr_err.splitlines() if "tritonpatch" in line]
    assert logged == ["[tritonpatch] strided_sum compiled with Pipeline(llvm={'disable-lsr': True}) "
                      f"[{Pipeline(disable_lsr=True).fingerprint()}]"], lsr_err

    malformed, malformed_err = results["malformed"]
    warnings = [line for line in malformed_err.splitlines() if "tritonpatch" in line]
    assert len(warnings) == 1, malformed_err
    assert "TRITONPATCH_DISABLE_LSR='sometimes': bad token 'sometimes'" in warnings[0]
    assert not malformed["hooked"] and malformed["ptx"] == reference["default"]


_TRITONPATCH_FIRST = textwrap.dedent("""
    import site, sys
    if sys.argv[1]:
        site.addsitedir(sys.argv[1])
    {first}
    import triton
    import tritonpatch.hooks
    print(tritonpatch.hooks.installed() and triton.knobs.runtime.add_stages_inspection_hook is not None)
""")


@native
@pytest.mark.parametrize("first", ["import tritonpatch.llvm as llvm; llvm.get_option('disable-lsr')",
                                   "import tritonpatch.targets", "import tritonpatch.kernels"])
def test_autoload_installs_when_a_tritonpatch_module_imports_triton_first(tmp_path, first):
    """A program that uses tritonpatch before importing Triton: the tritonpatch module's own `import triton`
    triggered the install while that module was half imported ("partially initialized module
    'tritonpatch._triton_compat'", or the registry's gate held), autoload was disabled and every compile
    ran unpatched. The install now waits until tritonpatch's modules are whole, outside the gate."""
    site_dir = ""
    if not _pth_installed():
        site_dir = str(tmp_path / "site")
        os.makedirs(site_dir)
        shutil.copy(os.path.join(ROOT, "tritonpatch_autoload.pth"), site_dir)
    result = subprocess.run([sys.executable, "-c", _TRITONPATCH_FIRST.format(first=first), site_dir],
                            capture_output=True, text=True, timeout=300,
                            env=child_environment({"TRITONPATCH_AUTOLOAD": "1", "TRITONPATCH_DISABLE_LSR": "1"}))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tritonpatch warning" not in result.stderr, result.stderr[-2000:]
    assert result.stdout.strip() == "True", (result.stdout, result.stderr[-2000:])


_AUTOLOAD_PROBE = textwrap.dedent("""
    import site, sys
    if sys.argv[1]:
        site.addsitedir(sys.argv[1])
    import triton
    print(triton.knobs.runtime.add_stages_inspection_hook is not None)
""")


@native
def test_autoload_bad_values_warn_in_one_bounded_line(tmp_path):
    """Each malformed variable, whether caught at start-up or when tritonpatch installs (a 100,000-character
    LLVM option value), gives exactly one `tritonpatch warning:` line of bounded length; Triton runs unpatched."""
    from tritonpatch import _autoload

    site_dir = ""
    if not _pth_installed():
        site_dir = str(tmp_path / "site")
        os.makedirs(site_dir)
        shutil.copy(os.path.join(ROOT, "tritonpatch_autoload.pth"), site_dir)
    cases = {
        "tuning cache 1": ({"TRITONPATCH_TUNING_CACHE": "1"}, "TRITONPATCH_TUNING_CACHE='1'"),
        "superscript two": ({"TRITONPATCH_COMPILE_THREADS": "\u00b2"}, "TRITONPATCH_COMPILE_THREADS='\u00b2'"),
        "huge llvm value": ({"TRITONPATCH_LLVM_OPTIONS": "unroll-threshold=" + "9" * 100_000},
                            "TRITONPATCH_LLVM_OPTIONS="),
        "ptxas version": ({"TRITONPATCH_PTXAS_OPTIONS": "--version"}, "compile nothing"),
    }
    children = {
        label: subprocess.Popen([sys.executable, "-c", _AUTOLOAD_PROBE, site_dir], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env=child_environment({"TRITONPATCH_AUTOLOAD": "1", **extra,
                                                       "TRITON_CACHE_DIR": str(tmp_path / "cache")}))
        for label, (extra, _fragment) in cases.items()
    }
    for label, child in children.items():
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, (label, err[-2000:])
        warnings = [line for line in err.splitlines() if "tritonpatch" in line]
        assert len(warnings) == 1, (label, err[:2000])
        assert warnings[0].startswith("tritonpatch warning: autoload disabled: "), (label, warnings[0])
        assert len(warnings[0]) <= _autoload.WARNING_LIMIT + 30, (label, len(warnings[0]))
        assert cases[label][1] in warnings[0], (label, warnings[0])
        assert out.strip() == "False", (label, out)  # unpatched


def test_one_reading_of_boolean_words():
    """Variables, pass options and LLVM bool values read the same words (any case, blanks around)."""
    from tritonpatch.passes import parse_pass_spec

    for word in ("1", "true", "YES", " on "):
        assert env.bool_word(word) is True
    for word in ("0", "False", "no", "OFF"):
        assert env.bool_word(word) is False
    for word in ("", "2", "enable", "truthy"):
        assert env.bool_word(word) is None
    assert parse_pass_spec("elide-uniform-masks(all_false_loops=no)") == ("elide-uniform-masks",
                                                                            (("all_false_loops", False),))
    assert env.BOOL_WORDS == "1/true/yes/on or 0/false/no/off"


@native
def test_llvm_bool_values_read_the_same_words():
    for word in env.TRUE_WORDS:
        assert tllvm.normalize_value("disable-lsr", f" {word.upper()} ") is True
    for word in env.FALSE_WORDS:
        assert tllvm.normalize_value("disable-lsr", word.title()) is False
    with pytest.raises(tllvm.OptionTypeError, match="expects a bool"):
        tllvm.normalize_value("disable-lsr", "enable")


def test_the_autoload_pth_reads_the_same_false_words():
    """``tritonpatch_autoload.pth`` runs in every Python process before tritonpatch can be imported,
    so it repeats the words that switch autoload off: they must be ``env.FALSE_WORDS`` (and blank)."""
    import ast

    with open(os.path.join(ROOT, "tritonpatch_autoload.pth")) as f:
        line = f.read()
    tuples = [node for node in ast.walk(ast.parse(line)) if isinstance(node, ast.Tuple)]
    (words,) = [ast.literal_eval(node) for node in tuples if all(isinstance(e, ast.Constant) for e in node.elts)]
    assert set(words) == {"", *env.FALSE_WORDS}
    assert ".strip().lower()" in line  # as bool_word reads them


def test_misspelt_variables_are_named_with_the_closest_one():
    # TRITONPATCH_PASS=... left the program unpatched without a word
    lines = env.unknown_variables({"TRITONPATCH_PASS": "skip-masked-blocks", "TRITONPATCH_DISABLE_LRS": "1",
                                   "TRITONPATCH_PASSES": "hoist-masks", "TRITONPATCH_TEST_REDIS": "1",
                                   "TRITONPATCH_WHATEVER": "x", "OTHER": "1"})
    assert lines == ["TRITONPATCH_DISABLE_LRS is not a tritonpatch variable and is ignored; did you mean "
                     "TRITONPATCH_DISABLE_LSR?",
                     "TRITONPATCH_PASS is not a tritonpatch variable and is ignored; did you mean TRITONPATCH_PASSES?",
                     "TRITONPATCH_WHATEVER is not a tritonpatch variable and is ignored; the variables are "
                     + ", ".join(env.VARIABLES)]


# How each program reaches the install: its lines, and the line the warning must name.
_INSTALL_PATHS = {
    "options": ("import triton\nimport tritonpatch\nwith tritonpatch.options(disable_lsr=False):\n    pass\n", 3),
    # the packaged kernels' tuner installs tritonpatch before it compiles its candidates
    "kernel launch": ("from tritonpatch.kernels._runtime.launch import parallel_compiles\n"
                      "with parallel_compiles():\n    pass\n", 2),
    "autoload": ("import triton\n", 1),
}


@pytest.mark.parametrize("path", list(_INSTALL_PATHS))
def test_misspelt_variable_warning_names_the_users_line(tmp_path, path):
    """The warning points at the user's line that led into the install (``options()``, a launch of a packaged
    kernel, or with autoload the ``import triton``) rather than at tritonpatch's own frames."""
    site_dir = ""
    if path == "autoload" and not _pth_installed():   # editable checkout: hand the repository's .pth to `site`
        site_dir = str(tmp_path / "site")
        os.makedirs(site_dir)
        shutil.copy(os.path.join(ROOT, "tritonpatch_autoload.pth"), site_dir)
    lines, line = _INSTALL_PATHS[path]
    program = tmp_path / "user_program.py"
    program.write_text("import site, sys\nif sys.argv[1]:\n    site.addsitedir(sys.argv[1])\n" + lines)
    extra = {"TRITONPATCH_AUTOLOAD": "1" if path == "autoload" else "0", "TRITONPATCH_PASS": "hoist-masks",
             "TRITONPATCH_COMPILE_THREADS": "2"}
    result = subprocess.run([sys.executable, "-W", "always", str(program), site_dir], capture_output=True,
                            text=True, timeout=300, env=child_environment(extra))
    assert result.returncode == 0, result.stderr
    assert f"{program}:{3 + line}: RuntimeWarning: tritonpatch: TRITONPATCH_PASS is not a tritonpatch variable" \
        in result.stderr, result.stderr
