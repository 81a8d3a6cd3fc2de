"""The tritonpatch console script, end to end in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tritonpatch import _cli_bench, cli


def run_cli(*args):
    script = os.path.join(os.path.dirname(sys.executable), "tritonpatch")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "tritonpatch.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)


def test_llvm_options_table_lists_lsr_options():
    result = run_cli("llvm-options", "lsr")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "VALUE", "DEFAULT", "HELP"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["disable-lsr"][1:3] == ["bool", "false"]
    assert all("lsr" in name for name in rows)


def test_llvm_options_json_matches_python_api():
    import tritonpatch.llvm as llvm

    result = run_cli("llvm-options", "unroll-threshold", "--json")
    assert result.returncode == 0, result.stderr
    records = {r["name"]: r for r in json.loads(result.stdout)}
    expected = llvm.get_option("unroll-threshold")
    assert records["unroll-threshold"]["type"] == expected.type == "unsigned"
    assert records["unroll-threshold"]["settable"] is True


@pytest.mark.parametrize("args,code,message", [
    (["llvm-options", "no-such-option-anywhere"], 1, "no LLVM option matches"),
    (["llvm-options", "disable-lrs"], 1, "did you mean disable-lsr"),
    (["llvm-options", "no-such-option-anywhere", "--json"], 1, ""),
    (["llvm-options", "zzz", "--changed"], 1, "no changed LLVM option"),
    (["no-such-command"], 2, "invalid choice"),
])
def test_cli_errors(args, code, message):
    result = run_cli(*args)
    assert result.returncode == code
    assert message in result.stderr


@pytest.fixture
def fake_benchmarks(tmp_path, monkeypatch):
    """A scripts/benchmarks folder of two benchmarks, a helper module and a note, in place of the
    checkout's."""
    folder = tmp_path / "scripts" / "benchmarks"
    folder.mkdir(parents=True)
    script = ("import sys, os\nout = sys.argv[sys.argv.index('--out') + 1]\n"
              "open(os.path.join(out, os.path.basename(__file__)[:-3] + '.json'), 'w').write('{}')\n")
    for name in ("fake.py", "other.py"):
        (folder / name).write_text(script)
    (folder / "_common.py").write_text("")
    (folder / "README.md").write_text("")
    monkeypatch.setattr(_cli_bench, "BENCHMARKS", folder)
    return folder


def test_bench_lists_the_checkouts_benchmarks():
    """The console script finds scripts/benchmarks/<name>.py of the checkout it is installed from."""
    listed = run_cli("bench", "--list")
    assert listed.returncode == 0, listed.stderr
    folder = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "benchmarks")
    listed_paths = {line.split()[0]: os.path.realpath(line.split()[1]) for line in listed.stdout.splitlines()}
    assert listed_paths == {name[:-3]: os.path.realpath(os.path.join(folder, name)) for name in os.listdir(folder)
                            if name.endswith(".py") and not name.startswith("_")}
    assert "mask_passes" in listed_paths
    marked = {line.split()[0] for line in listed.stdout.splitlines() if line.endswith("(measures on a CUDA GPU)")}
    assert "attention" in marked and "compile_overhead" not in marked   # compile_overhead runs on the CPU


def test_gpu_benchmarks_without_a_gpu_stop_with_one_line(tmp_path):
    """Each benchmark that measures on a GPU, run where torch sees none: one line naming what is missing and
    what it can do without one (it failed with a traceback from torch.cuda or inside its first measurement)."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    scripts = {name: path for name, path in _cli_bench.benchmark_scripts(_cli_bench.BENCHMARKS).items()
               if _cli_bench.needs_gpu(path)}
    code = ("import runpy, sys\n"   # as `python scripts/benchmarks/NAME.py` runs them: their folder first on the path
            f"sys.path.insert(0, {str(_cli_bench.BENCHMARKS)!r})\n"
            f"for name, path in {dict((n, str(p)) for n, p in scripts.items())!r}.items():\n"
            f"    sys.argv = [path, '--out', {str(tmp_path)!r}]\n"
            "    try:\n"
            "        runpy.run_path(path, run_name='__main__')\n"
            "    except SystemExit as stop:\n"
            "        print(name, '|', stop.code)\n")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    stops = dict(line.split(" | ", 1) for line in ran.stdout.splitlines() if " | " in line)
    assert set(stops) == set(scripts) and len(scripts) >= 6, ran.stdout
    for name, message in stops.items():
        assert "measures on a CUDA GPU, and torch sees none here" in message and "without one, " in message, name


def test_bench_names_every_script_but_the_helpers(fake_benchmarks, capsys):
    assert cli.main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split() for line in listed] == [["fake", str(fake_benchmarks / "fake.py")],
                                                 ["other", str(fake_benchmarks / "other.py")]]
    assert cli.main(["bench"]) == 0 and capsys.readouterr().out.splitlines() == listed
    assert cli.main(["bench", "_common"]) == 2
    assert "unknown benchmark(s) '_common'; available: fake, other" in capsys.readouterr().err


def test_bench_without_a_checkout_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_cli_bench, "BENCHMARKS", tmp_path / "scripts" / "benchmarks")
    assert cli.main(["bench", "--list"]) == 2
    assert f"no benchmark scripts at {tmp_path / 'scripts' / 'benchmarks'}" in capsys.readouterr().err


VERSION_LINE = (r"tritonpatch \d+\.\d+\.\d+\S* \(triton \d+\.\d+\.\d+\S*, "
                r"native LLVM options: (available|unavailable: .+)\)")


def test_version_line_from_the_console_script_and_python_m():
    import re

    import triton

    import tritonpatch

    script = run_cli("--version")
    module = subprocess.run([sys.executable, "-m", "tritonpatch", "--version"], capture_output=True, text=True,
                            timeout=120)
    assert script.returncode == module.returncode == 0, script.stderr + module.stderr
    assert script.stdout == module.stdout
    line = script.stdout.strip()
    assert re.fullmatch(VERSION_LINE, line), line
    assert line.startswith(f"tritonpatch {tritonpatch.__version__} (triton {triton.__version__}, ")


def test_python_m_runs_the_same_cli():
    result = subprocess.run([sys.executable, "-m", "tritonpatch", "llvm-options", "disable-lsr"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == run_cli("llvm-options", "disable-lsr").stdout


def test_version_says_why_llvm_options_are_unavailable(monkeypatch):
    from tritonpatch import llvm
    from tritonpatch.errors import NativeUnavailableError

    def unavailable():
        raise NativeUnavailableError("tritonpatch._native is not built")

    monkeypatch.setattr(llvm, "native_info", unavailable)
    assert cli.version_text().endswith("native LLVM options: unavailable: tritonpatch._native is not built)")


def test_license_is_mit_as_the_metadata_says():
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "LICENSE")) as f:
        text = f.read()
    with open(os.path.join(root, "pyproject.toml")) as f:
        assert 'license = { text = "MIT" }' in f.read()
    assert text.startswith("MIT License") and "Copyright (c) 2026 the tritonpatch authors" in text


def test_a_failed_benchmark_says_how_to_pass_its_options_and_leaves_no_empty_folder(fake_benchmarks, tmp_path,
                                                                                    capsys):
    (fake_benchmarks / "broken.py").write_text(
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument(\"--compile-only\")\n"
        "raise SystemExit('needs a GPU; without one, --compile-only ...')\n")
    (fake_benchmarks / "gpu_only.py").write_text("raise SystemExit('needs a GPU')\n")
    fresh, existing = tmp_path / "fresh", tmp_path / "existing"
    existing.mkdir()
    for out in (fresh, existing):
        assert cli.main(["bench", "broken", "--out", str(out)]) == 1
        assert ("are passed with --script-args, e.g. --script-args=--compile-only (no GPU needed: broken)"
                in capsys.readouterr().err)
    assert not fresh.exists() and existing.is_dir()
    # a script without --compile-only is not offered it
    assert cli.main(["bench", "gpu_only", "--out", str(fresh)]) == 1
    err = capsys.readouterr().err
    assert "--script-args=--help (each script's options)" in err and "--compile-only" not in err


def test_bench_writes_into_bench_out_of_the_working_directory(fake_benchmarks, tmp_path, monkeypatch, capsys):
    """The default --out is ./bench-out (it was docs/benchmarks of the checkout)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert cli.main(["bench", "fake"]) == 0
    assert (work / "bench-out" / "fake.json").exists()
    assert cli.build_parser().parse_args(["bench"]).out == "bench-out"
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps help at the terminal width
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert "(default: ./bench-out)" in capsys.readouterr().out


@pytest.mark.parametrize("argv,usage", [
    (["demo", "extra"], "usage: tritonpatch demo [-h] [--traceback]"),
    (["llvm-options", "lsr", "extra"], "usage: tritonpatch llvm-options "),
    (["demo", "--traceback", "extra"], "usage: tritonpatch demo [-h] [--traceback]"),
])
def test_extra_arguments_are_the_subcommands_error(capsys, argv, usage):
    """An argument a subcommand does not take is reported with that subcommand's usage."""
    with pytest.raises(SystemExit) as exit_status:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_status.value.code == 2 and err.startswith(usage), err
    assert f"tritonpatch {argv[0]}: error: unrecognized arguments: extra" in err


@pytest.mark.parametrize("argv,wanted", [
    (["demo"], False), (["--traceback", "demo"], True), (["demo", "--traceback"], True),
    (["--traceback", "compare", "spec.toml", "--traceback"], True),
])
def test_traceback_goes_before_or_after_the_subcommand(argv, wanted):
    assert cli.build_parser().parse_args(argv).traceback is wanted


def test_compare_table_shows_ptxas_warnings_as_text(tmp_path):
    """The warnings row reads "none" (or the warnings), never a Python tuple."""
    from tritonpatch import inspection

    assert inspection.format_number(()) == "none"
    assert inspection.format_number(("C7515 a", "C7510 b")) == "C7515 a; C7510 b"
    spec = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "masked_attention.toml")
    result = subprocess.run([os.path.join(os.path.dirname(sys.executable), "tritonpatch"), "compare", spec],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TRITON_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("warnings ")]
    assert "()" not in row and row.split()[1:] == ["none", "none"], row
