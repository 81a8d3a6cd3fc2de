"""``scripts/benchmarks/attention.py --from-json``: rows of several runs merge into one table only where the
runs share a GPU and software, and the merged report names every run's command."""
import importlib.util
import os
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "benchmarks")


@pytest.fixture(scope="module")
def attention():
    """The benchmark script as a module (it imports its shared module as ``_common``, from its folder)."""
    sys.path.insert(0, BENCHMARKS)
    try:
        spec = importlib.util.spec_from_file_location("attention_benchmark", os.path.join(BENCHMARKS, "attention.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(BENCHMARKS)
    return module


def report(command: str, date: str, gpu: str = "NVIDIA H100 80GB HBM3", **row) -> dict:
    environment = {"gpu": gpu, "torch": "2.11.0+cu130", "triton": "3.6.0", "python": "3.12.3", "date_utc": date,
                   "command": command, "batch": 4, "heads": 16, "dtype": "bfloat16", "commit": "abc1234"}
    return {"environment": environment, "mode": "fwd",
            "rows": [dict({"mask": "causal", "head_dim": 128, "seq_len": 8192, "ours_tflops": 500.0,
                           "ours_config": "BM128-BN128-w4-s2-gluon"}, **row)]}


def test_merged_report_names_every_run(attention, tmp_path):
    first = report("python scripts/benchmarks/attention.py --head-dims 128", "2026-12-06 19:06")
    second = report("python scripts/benchmarks/attention.py --head-dims 64", "2026-12-06 19:08", head_dim=64)
    runs = attention.merged_runs([first, second])
    assert [run["command"] for run in runs] == [first["environment"]["command"], second["environment"]["command"]]
    merged = dict(first, rows=first["rows"] + second["rows"], runs=runs)
    # a merge of a merge keeps every run, also from the older {"environment": ...} form
    third = report("python scripts/benchmarks/attention.py --seq-lens 4096", "2026-12-06 19:09", seq_len=4096)
    assert len(attention.merged_runs([merged, dict(third, runs=[{"environment": third["environment"]}])])) == 3
    path = tmp_path / "attention_fwd.md"
    attention.write_markdown(str(path), merged, merged["rows"])
    text = path.read_text()
    assert "2 runs, rows merged with `--from-json`" in text
    assert "`python scripts/benchmarks/attention.py --head-dims 64` (2026-12-06 19:08 UTC, commit `abc1234`)" in text


def test_runs_of_different_gpus_are_not_merged(attention):
    with pytest.raises(SystemExit, match=r"differ in gpu \(NVIDIA H100 80GB HBM3, NVIDIA H200\)"):
        attention.merged_runs([report("a", "2026-12-06 19:06"), report("b", "2026-12-04 15:40", gpu="NVIDIA H200")])


def test_reports_of_different_modes_are_not_merged(attention):
    forward_and_backward = dict(report("b", "2026-12-06 19:08", head_dim=64), mode="fwd_bwd")
    with pytest.raises(SystemExit, match=r"different modes \(fwd, fwd_bwd\)"):
        attention.merged_runs([report("a", "2026-12-06 19:06"), forward_and_backward])


def test_a_row_given_twice_is_refused(attention):
    first = report("a", "2026-12-06 19:06")
    merged = dict(first, runs=[first["environment"]])
    with pytest.raises(SystemExit, match=r"more than one report has a row for causal D=128 S=8192"):
        attention.merged_runs([merged, first])
