"""Bad input to the command line: every mistake is one `tritonpatch COMMAND: error: ...` line and exit
status 2, never a Python traceback. Most run `cli.main([...])` in this process with captured output;
the few that need a real process (a closed pipe) run the console script."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import triton
import triton.language as tl

from test_cli import run_cli
from tritonpatch import cli

KERNELS = textwrap.dedent("""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(X, Y, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(Y + offs, tl.load(X + offs))

    @triton.jit
    def broken_kernel(X, Y, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(Y + offs, tl.load(X + offs) + undefined_name)

    @triton.jit
    def scale_kernel(X, Y, N, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(Y + offs, tl.load(X + offs, mask=offs < N) * 2, mask=offs < N)

    def plain_function(X, Y):
        pass
""")
SPEC = textwrap.dedent("""
    kernel = "{kernel}"
    [signature]
    X = "*fp32"
    Y = {y_type}
    [constexprs]
    BLOCK = 128
    [{options_table}]
    {option} = {value}
""")


@pytest.fixture
def spec_dir(tmp_path, monkeypatch):
    """A folder with the kernels above and a `write(name, **fields)` helper for spec files; Triton
    compiles into a private cache."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    (tmp_path / "kernels.py").write_text(KERNELS)
    (tmp_path / "raises.py").write_text("raise RuntimeError('this module raises when imported')\n")

    def write(name: str = "spec.toml", kernel: str = "kernels.py:copy_kernel", y_type: str = '"*fp32"',
              options_table: str = "options", option: str = "num_warps", value: str = "4") -> str:
        path = tmp_path / name
        path.write_text(SPEC.format(kernel=kernel, y_type=y_type, options_table=options_table, option=option,
                                    value=value))
        return str(path)

    write.dir = tmp_path
    return write


def run_main(capsys, *argv: str):
    """``(exit status, stdout, the error lines of stderr, stderr)`` of ``cli.main(argv)``."""
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, [line for line in err.splitlines() if ": error:" in line], err


def assert_one_error(result, command: str, *fragments: str):
    status, _out, errors, err = result
    assert status == 2, err
    assert len(errors) == 1 and errors[0].startswith(f"tritonpatch {command}: error: "), err
    assert "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize("fields,fragments", [
    ({"kernel": "raises.py:copy_kernel"},
     ["importing the kernel module 'raises.py' failed: RuntimeError: this module raises when imported", "--traceback"]),
    ({"kernel": "no_such_module_xyz:copy_kernel"}, ["no module named 'no_such_module_xyz'"]),
    ({"kernel": "missing.py:copy_kernel"}, ["kernel file", "missing.py does not exist"]),
    ({"kernel": "kernels.py:no_such_function"}, ["has no attribute 'no_such_function'"]),
    ({"kernel": "kernels.py:plain_function"}, ["plain_function is a function, not a @triton.jit function"]),
    ({"value": "3"}, ["num_warps in [options] must be a power of two (1, 2, 4, 8, 16, 32), got 3"]),
    ({"value": "4.0"}, ["num_warps in [options] must be an integer, got 4.0"]),
    ({"option": "foo"}, ["unknown key 'foo' in [options]; known keys: num_warps, "]),
    ({"option": "num_warp"}, ["unknown key 'num_warp' in [options] (did you mean 'num_warps'?)"]),
    ({"option": "arch", "value": '"sm80"'}, ["'arch' in [options] is set by the target"]),
    ({"options_table": "option"}, ["unknown key 'option' (did you mean 'options'?)"]),
    ({"y_type": '"*fp17"'}, ["'Y' in [signature] has type '*fp17', which Triton does not know"]),
    ({"y_type": "3"}, ["'Y' in [signature] has type 3"]),
])
def test_bad_spec_is_one_error_line(spec_dir, capsys, fields, fragments):
    assert_one_error(run_main(capsys, "compare", spec_dir(**fields)), "compare", *fragments)


def test_bad_spec_files(spec_dir, capsys):
    folder = spec_dir.dir
    (folder / "bad.toml").write_text("kernel = \n")
    (folder / "bad.json").write_text("{")
    (folder / "list.json").write_text("[1]")
    (folder / "colon.toml").write_text('kernel = "kernels.py"\n[signature]\n')
    for name, fragment in (("bad.toml", "bad.toml: not valid TOML"), ("bad.json", "bad.json: not valid JSON"),
                           ("list.json", "expected a table"), ("colon.toml", "expected \"module:function\""),
                           ("absent.toml", "absent.toml does not exist")):
        assert_one_error(run_main(capsys, "compare", str(folder / name)), "compare", fragment)


LAUNCH_SPEC = textwrap.dedent("""
    kernel = "kernels.py:scale_kernel"
    [signature]
    X = "*fp32"
    Y = "*fp32"
    N = "i32"
    [constexprs]
    BLOCK = 128
    [launch]
    grid = [1]
    {launch}
    [launch.args]
    {args}
""")
LAUNCH_ARGS = {"X": '{ shape = [128], dtype = "float32" }', "Y": '{ shape = [128], dtype = "float32" }', "N": "100"}


@pytest.mark.parametrize("launch,args,fragments", [
    ("gird = [1]", {}, ["unknown key 'gird' in [launch] (did you mean 'grid'?); known keys: grid, outputs, args"]),
    ('outputs = "Y"', {}, ["outputs in [launch] must be a list of argument names, got 'Y'"]),
    ("", {"Bogus": '{ shape = [4], dtype = "float16" }'},
     ["'Bogus' in [launch.args] is not an argument of scale_kernel(X, Y, N, BLOCK)"]),
    ("", {"NN": "100"}, ["'NN' in [launch.args] is not an argument", "(did you mean 'N'?)"]),
    ("", {"Y": None}, ["argument 'Y' of scale_kernel is missing from [launch.args]"]),
    ("", {"BLOCK": "128"}, ["'BLOCK' is in both [launch.args] and [constexprs]"]),
    ("", {"X": "3"}, ["'X' is a pointer (*fp32 in [signature]); give a tensor in [launch.args]"]),
    ("", {"N": '{ shape = [1], dtype = "int32" }'}, ["'N' is 'i32' in [signature], not a pointer; give a number"]),
    ("", {"N": '"100"'}, ["'N' in [launch.args] must be a number"]),
    ("", {"Y": '{ shape = [128], dtype = "float16" }'},
     ["'Y' is *fp32 in [signature] but its [launch.args] tensor is float16 (fp16)", "make the two agree"]),
])
def test_bad_launch_is_one_error_line_before_any_compile(spec_dir, capsys, launch, args, fragments):
    """[launch] is checked against the kernel without a GPU too: on a GPU a wrong name or kind would
    fail only at the launch, after both compiles."""
    lines = [f"{name} = {value}" for name, value in {**LAUNCH_ARGS, **args}.items() if value is not None]
    path = spec_dir.dir / "launch.toml"
    path.write_text(LAUNCH_SPEC.format(launch=launch, args="\n".join(lines)))
    result = run_main(capsys, "compare", str(path))
    assert_one_error(result, "compare", *fragments)
    assert "compiling" not in result[3]


@triton.jit
def _fill_kernel(X, N):
    tl.store(X + tl.arange(0, 16), 0, mask=tl.arange(0, 16) < N)


@pytest.mark.parametrize("kind,dtype", [("*fp32", "float32"), ("*fp32", "float"), ("*fp16", "half"),
                                        ("*bf16", "bfloat16"), ("*i1", "bool"), ("*u1", "bool"), ("*i64", "long"),
                                        ("*i16", "short"), ("*fp8e4nv", "float8_e4m3fn"), ("*fp8e5", "float8_e5m2")])
def test_launch_tensors_of_their_pointers_element_type_are_taken(kind, dtype):
    from tritonpatch._cli_spec import check_launch_arguments

    check_launch_arguments(_fill_kernel, {"X": kind, "N": "i32"}, {}, {"X": {"shape": [16], "dtype": dtype}, "N": 4})


@pytest.mark.parametrize("kind,dtype,fragment", [
    ("*fp32", "long", "'X' is *fp32 in [signature] but its [launch.args] tensor is long (i64)"),
    ("*fp16", "bfloat16", "tensor is bfloat16 (bf16): the launch would compile and time a *bf16 kernel"),
    ("*fp32", "complex64", "'X' in [launch.args] has dtype complex64, which Triton kernels cannot take"),
    ("*kfp32", "float32", "'X' is *kfp32 in [signature], but the kernel's X is not annotated const: write *fp32"),
    ("tensordesc<fp32[16]>", "float32", "compare launches only kernels whose arguments are tensors and numbers"),
])
def test_launch_tensors_of_another_type_are_refused(kind, dtype, fragment):
    """A launch specializes the kernel by its tensors: a dtype other than the signature's would run and time
    another specialization than the one compiled and compared."""
    from tritonpatch._cli_spec import check_launch_arguments

    with pytest.raises(ValueError) as info:
        check_launch_arguments(_fill_kernel, {"X": kind, "N": "i32"}, {}, {"X": {"shape": [16], "dtype": dtype},
                                                                           "N": 4})
    assert fragment in str(info.value)


def test_the_examples_launch_fits_its_kernel():
    from tritonpatch._cli_spec import check_launch_arguments, load_kernel_spec

    spec = load_kernel_spec(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "masked_attention.toml"))
    check_launch_arguments(spec["kernel"], spec["signature"], spec["constexprs"], spec["launch"]["args"])


def test_kernel_compile_error_shows_the_compiler_message_only(spec_dir, capsys):
    result = run_main(capsys, "compare", spec_dir(kernel="kernels.py:broken_kernel"))
    assert_one_error(result, "compare", "broken_kernel does not compile for sm_90 with A (plain Triton)",
                     "undefined_name", "--traceback or TRITONPATCH_LOG=debug")
    with_traceback = run_main(capsys, "compare", spec_dir(kernel="kernels.py:broken_kernel"), "--traceback")
    assert with_traceback[0] == 2 and "Traceback (most recent call last)" in with_traceback[3]
    before_the_command = run_main(capsys, "--traceback", "compare", spec_dir(kernel="kernels.py:broken_kernel"))
    assert before_the_command[0] == 2 and "Traceback (most recent call last)" in before_the_command[3]


def test_ptxas_failure_is_ptxas_message_and_stdout_stays_clean(spec_dir, capsys):
    """Triton prints the whole PTX on stdout when ptxas fails; the report's stdout (--json) stays empty."""
    result = run_main(capsys, "compare", spec_dir(), "--a", "ptxas:--maxrregcount=abc", "--json")
    assert_one_error(result, "compare", "ptxas failed: ptxas", "Invalid value 'abc' for option 'maxrregcount'")
    assert result[1] == "" and ".target sm_90a" not in result[3]


@pytest.mark.parametrize("argv,fragments", [
    (["--target", "sm_5"], ["--target 'sm_5': expected sm_NN with NN >= 50"]),
    (["--target", "banana"], ["--target 'banana': expected sm_NN"]),
    (["--target", ""], ["--target '': expected sm_NN"]),
    (["--b", " "], ["--b ' ': empty; give default (plain Triton), disable-lsr"]),
    (["--html", ""], ["--html is empty"]),
    (["--b", "frobnicate"], ["--b 'frobnicate': bad item 'frobnicate'"]),
    (["--b", "llvm:no-such-option-xyz"], ["--b 'llvm:no-such-option-xyz': unknown LLVM option"]),
    (["--b", "llvm:a,,b"], ["--b llvm='a,,b': bad token ''"]),
    (["--b", "passes:no-such-pass"], ["--b 'passes:no-such-pass': unknown pass 'no-such-pass'"]),
    (["--b", "ptxas:-O1\0"], ["--b ptxas='-O1\\x00': contains a NUL character"]),
    (["--b", "ptxas:--version"], ["--b ptxas='--version': bad token '--version'", "compile nothing"]),
    (["--b", "ptxas:--gpu-name=sm_80"], ["Triton sets the target"]),
    (["--html", "/no/such/folder/report.html"], ["--html /no/such/folder/report.html: directory /no/such/folder"]),
    (["--cache-dir", "/no/such/cache"], ["--cache-dir lists the kernels of a Triton cache; it takes no SPEC"]),
])
def test_bad_compare_flags_are_one_error_line_before_any_compile(spec_dir, capsys, argv, fragments):
    result = run_main(capsys, "compare", spec_dir(), *argv)
    assert_one_error(result, "compare", *fragments)
    assert "compiling" not in result[3]  # refused before the first compile


def test_bad_target_lists_every_capability_whatever_was_asked(spec_dir, capsys):
    """Triton uses one ptxas for older GPUs and another for newer ones; the error lists the
    capabilities of both (each one that compiles), not those of the ptxas the bad target chose."""
    from tritonpatch import targets

    listed = []
    for target in ("sm_999", "sm_91", "sm_5"):
        result = run_main(capsys, "compare", spec_dir(), "--target", target)
        assert_one_error(result, "compare", f"--target '{target}': expected sm_NN")
        listed.append(result[2][0].rsplit("compiles for: ", 1)[1])
    assert listed[0] == listed[1] == listed[2], listed
    capabilities = [int(n) for n in listed[0].split(", ")]
    accepted = []
    for n in range(50, 130):
        try:
            accepted.append(targets.parse_target(f"sm_{n}").arch)
        except ValueError:
            pass
    assert capabilities == accepted


def test_compare_cache_dir_must_exist(tmp_path, capsys):
    assert_one_error(run_main(capsys, "compare", "--cache-dir", str(tmp_path / "x")), "compare",
                     f"--cache-dir {tmp_path / 'x'} does not exist")
    (tmp_path / "file").write_text("")
    assert_one_error(run_main(capsys, "compare", "--cache-dir", str(tmp_path / "file")), "compare",
                     "is not a directory")
    assert_one_error(run_main(capsys, "compare"), "compare", "give a kernel SPEC file, or --cache-dir DIR")


def test_compare_cache_dir_skips_an_unreadable_cubin(tmp_path, capsys):
    entry = tmp_path / "ENTRY"
    entry.mkdir()
    (entry / "junk_kernel.cubin").write_bytes(b"not a cubin")
    status, out, errors, err = run_main(capsys, "compare", "--cache-dir", str(tmp_path), "--json")
    assert status == 0 and not errors and "Traceback" not in err, err
    (report,) = json.loads(out)
    assert report["kernel"] == "junk_kernel" and report["error"]
    assert "warning: skipped ENTRY/junk_kernel.cubin" in err


@pytest.mark.parametrize("variable,value,fragment", [
    ("TRITONPATCH_TUNING_CACHE", "1", "TRITONPATCH_TUNING_CACHE='1': bad token '1'; expected a directory, or 0"),
    ("TRITONPATCH_COMPILE_THREADS", "\u00b2", "TRITONPATCH_COMPILE_THREADS='\u00b2': bad token"),
    ("TRITONPATCH_LOG", "loud", "TRITONPATCH_LOG='loud'"),
    ("TRITONPATCH_PASSES", "x(" * 50000, "TRITONPATCH_PASSES='x(x(x("),
])
def test_bad_environment_is_one_bounded_error_line(spec_dir, capsys, monkeypatch, variable, value, fragment):
    monkeypatch.setenv(variable, value)
    result = run_main(capsys, "compare", spec_dir())
    assert_one_error(result, "compare", fragment)
    assert len(result[2][0]) < 500 and "compiling" not in result[3]


def test_bench_and_llvm_options_errors(capsys):
    assert_one_error(run_main(capsys, "bench", "mask_passes", "--script-args", "'"), "bench",
                     "--script-args \"'\": No closing quotation")
    assert_one_error(run_main(capsys, "bench", "--list", "mask_passes"), "bench", "--list takes no benchmark names")
    assert_one_error(run_main(capsys, "bench", "no-such-benchmark"), "bench",
                     "unknown benchmark(s) 'no-such-benchmark'")
    status, _out, _errors, err = run_main(capsys, "llvm-options", "y" * 100_000)
    assert status == 1 and "… (100000 characters)" in err and len(err) < 300, err[:300]


def test_closed_pipe_ends_quietly():
    """`tritonpatch llvm-options --json | head -c 10`: the output (hundreds of KB) outlives the reader."""
    script = os.path.join(os.path.dirname(sys.executable), "tritonpatch")
    result = subprocess.run(f"'{script}' llvm-options --json | head -c 10 >/dev/null; echo \"${{PIPESTATUS[0]}}\"",
                            shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "141" and "Broken pipe" not in result.stderr and "Traceback" not in result.stderr, \
        result.stderr


def test_console_script_error_line():
    """The installed script reports through the same path (exit status 2, one line)."""
    result = run_cli("compare", "--target", "sm_5", "spec.toml")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("tritonpatch compare: error: --target 'sm_5': expected sm_NN"), result.stderr


def test_demo_under_the_interpreter_says_to_unset_it():
    # TRITON_INTERPRET=1 (which the kernels' CPU docs ask for) made the demo blame an autotune wrapper
    result = subprocess.run([sys.executable, "-m", "tritonpatch", "demo"], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert result.returncode == 2, result.stderr[-2000:]
    assert "TRITON_INTERPRET=1 is set" in result.stderr and "unset it to compile for a GPU target" in result.stderr
