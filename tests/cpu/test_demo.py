"""`tritonpatch demo`: end to end on a CPU machine (both kernels compiled under every demo pipeline),
and its formatting on reports and GPU timings made up for the test."""
from __future__ import annotations

import io
import warnings

import pytest

from test_cli import run_cli
from test_inspect import fake_report
from tritonpatch import Pipeline, demo


def _assert_fits(text):
    long = [line for line in text.splitlines() if len(line) > demo.WIDTH]
    assert not long, long


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="on a GPU the demo also times kernels")
def test_demo_runs_compile_only_and_shows_the_passes_working():
    result = run_cli("demo")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    _assert_fits(out)
    assert "no GPU: compile-only, target sm_90" in out and "timings skipped" in out
    for name in [*demo.SEED_PIPELINES, demo.UNMASKED]:
        assert name in out
    assert "skip-masked-blocks on ttir: loops_narrowed=1" in out
    assert "elide-uniform-masks on ttir: loops_split=1" in out
    assert "skip + elide also splits the loop into runs of tiles with and without the mask" in out
    assert out.count("  metric ") == 5 and " change" in out  # a change column per variant
    registers = [line.split() for line in out.splitlines() if line.strip().startswith("registers")]
    assert all(int(n) > 0 for row in registers for n in row[1:3])
    assert any(row[-1] in ("better", "worse") for row in registers)
    assert "Warning" not in result.stderr


def test_variant_table_has_a_change_column_with_directions():
    plain = {"registers": 128, "loops (SASS)": 1, "SASS per loop": "556", "leanest loop: SASS": 556}
    split = {"registers": 198, "loops (SASS)": 3, "SASS per loop": "560 / 429 / 562", "leanest loop: SASS": 429}
    rows = {line.split("  ")[1]: line for line in demo.variant_table(plain, split, "skip + elide").splitlines()}
    assert rows["metric"].split()[-1] == "change"
    assert rows["registers"].endswith("+70 (+54.7%) worse")
    assert rows["leanest loop: SASS"].endswith("-127 (-22.8%) better")
    assert rows["loops (SASS)"].endswith("+2 (+200.0%)")  # more loops is what a split is for: no direction
    assert rows["SASS per loop"].endswith("560 / 429 / 562")


def test_identical_variant_is_one_line_not_two_equal_columns():
    report = fake_report()
    text = demo.packaged_section({"plain Triton": report, "disable-lsr": fake_report(Pipeline(disable_lsr=True))})
    assert "disable-lsr changes nothing on this kernel: every count is the same as plain Triton's." in text
    assert all("disable-lsr" not in line for line in text.splitlines() if line.strip().startswith("metric"))
    moved = demo.packaged_section({"plain Triton": report, "disable-lsr": fake_report(registers=126)})
    assert "disable-lsr barely moves this kernel: registers 128 -> 126 (-1.6%, better); every other count" in moved


def test_gpu_timings_are_formatted_within_the_width():
    timings = {"seed unmasked": 2.0, "seed": {name: 2.0 + i for i, name in enumerate(demo.SEED_PIPELINES)},
               "attention": 1.25, "flex": 2.5, "sdpa": 1.0}
    text = demo.format_gpu_timings(timings, "NVIDIA H200")
    _assert_fits(text)
    lines = text.splitlines()
    assert lines[0].startswith("GPU timings on NVIDIA H200 (B=4 H=16 S=4096 D=64 P=1024")
    assert "seed kernel, unmasked" in lines[1] and lines[1].endswith("2.000 ms   1.00x unmasked")
    skip_elide = next(line for line in lines if "skip + elide-uniform-masks" in line)
    assert skip_elide.endswith("5.000 ms   2.50x unmasked")
    assert next(line for line in lines if "FlexAttention" in line).endswith("2.500 ms   tritonpatch is 2.00x as fast")
    assert lines[-1].endswith("1.000 ms")
    assert len({line.index(" ms") for line in lines[1:]}) == 1  # one column of times
    unavailable = demo.format_gpu_timings({**timings, "flex": "ImportError: " + "x" * 200}, "GPU")
    _assert_fits(unavailable)
    assert "FlexAttention unavailable: ImportError: xxx" in unavailable


def test_compile_warnings_are_held_back_to_the_end(monkeypatch):
    def reports(*names):
        def build():
            warnings.warn("enable_fp_fusion is deprecated", DeprecationWarning)
            warnings.warn("enable_fp_fusion is deprecated", DeprecationWarning)
            return {name: fake_report() for name in names}
        return build

    monkeypatch.setattr(demo, "seed_reports", reports(*demo.SEED_PIPELINES, demo.UNMASKED))
    monkeypatch.setattr(demo, "packaged_reports", reports("plain Triton", "disable-lsr"))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    out = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert demo.run(out) == 0
    text = out.getvalue()
    _assert_fits(text)
    tail = text.split("timings skipped")[1]
    assert text.count("enable_fp_fusion is deprecated") == 1 and "enable_fp_fusion is deprecated" in tail
    assert "1 warning(s) raised while compiling (each shown once, held back until here" in tail
