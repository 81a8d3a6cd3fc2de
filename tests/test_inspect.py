"""tritonpatch.inspect: output parsers, SASS/LLIR analysis and compare(), on samples and live compiles."""
from __future__ import annotations

import json
import os

import pytest

from compile_helpers import KERNELS
from test_cli import run_cli
from tritonpatch import Pipeline
from tritonpatch import inspect

CUOBJDUMP_SAMPLE = """
Resource usage:
 Common:
  GLOBAL:11 CONSTANT[4]:8
 Function masked_attention_kernel:
  REG:183 STACK:16 SHARED:1024 LOCAL:24 CONSTANT[0]:600 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
PTXAS_SAMPLE = """ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers
"""
SASS_SAMPLE = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 BRA `(.L_x_1) ;
.L_x_0:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0030*/                   FFMA R2, R3, R4, R5 ;
        /*0040*/                   MUFU.EX2 R6, R7 ;
        /*0050*/                   IADD3 R8, R8, 0x40, RZ ;
        /*0060*/               @P1 BRA `(.L_x_0) ;
.L_x_1:
        /*0070*/                   STG.E.128 desc[UR4][R2.64], R4 ;
        /*0080*/                   EXIT ;
"""


def test_parse_resource_usage_and_ptxas_samples():
    assert inspect.parse_resource_usage(CUOBJDUMP_SAMPLE) == {"registers": 183, "stack": 16, "shared": 1024, "local": 24}
    assert inspect.parse_ptxas_verbose(PTXAS_SAMPLE) == {"stack_frame": 16, "spill_stores": 8, "spill_loads": 12,
                                                         "registers": 255}
    with pytest.raises(ValueError, match="REG"):
        inspect.parse_resource_usage("nothing here")


def test_sass_sample_classes_and_main_loop():
    stats = inspect.analyze_sass(SASS_SAMPLE)
    assert stats.total == {"constant": 1, "branch": 3, "tensor-core": 1, "fp": 1, "mufu": 1, "int": 1,
                           "store-global": 1}
    # The loop is .L_x_0 .. the backward BRA: HGMMA, FFMA, MUFU, IADD3, BRA.
    assert stats.main_loop == {"tensor-core": 1, "fp": 1, "mufu": 1, "int": 1, "branch": 1}
    assert stats.loops == 1


def test_llir_loops_on_a_handwritten_module():
    llir = """define void @k(ptr %p, i32 %n) {
entry:
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %next, %loop ]
  %next = add i32 %i, 1
  store i32 %i, ptr %p
  %done = icmp eq i32 %next, %n
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""
    (loop,) = inspect.llir_loops(llir)
    assert loop.header == "loop" and loop.blocks == 1
    assert loop.opcodes == {"phi": 1, "add": 1, "store": 1, "icmp": 1, "br": 1}


def _report(name, pipeline=None):
    fn, signature, constexprs, options = KERNELS[name]
    return inspect.compile_report(fn, signature, constexprs, pipeline, **options)


def test_live_compile_report_is_consistent():
    report = _report("masked_attention")
    # cuobjdump read the cubin Triton built; ptxas -v recompiled the PTX: two tools, one answer.
    verbose = inspect.parse_ptxas_verbose(inspect._run([
        inspect._tool("ptxas"), "-v", "--gpu-name=sm_90a", _write(report.asm["ptx"]), "-o", os.devnull]))
    assert report.resources.registers == verbose["registers"] > 0
    assert report.sass.total["tensor-core"] == report.asm["sass"].count("HGMMA")
    assert report.sass.main_loop["tensor-core"] == report.sass.total["tensor-core"]  # every dot is in the loop
    assert len(report.loops) == 1 and report.loops[0].opcodes["phi"] > 0
    assert report.resources.dynamic_shared > 0


def _write(text):
    import tempfile

    handle = tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False)
    handle.write(text)
    handle.close()
    return handle.name


def test_compare_reports_known_differences():
    unrolled = _report("fixed_trip_loop")
    rolled = _report("fixed_trip_loop", Pipeline(llvm={"unroll-threshold": 0}))
    comparison = inspect.compare(unrolled, rolled)
    rows = {metric: (a, b) for metric, a, b in comparison.rows}
    assert rows["LLIR loops"] == (0, 1)  # fully unrolled by default, kept as a loop without unrolling
    assert unrolled.loops == [] and rolled.loops[0].opcodes["phi"] >= 1  # (ptxas may still unroll the SASS)
    assert comparison.diffs["ptx"] and not comparison.diffs["ttgir"]  # LLVM options act after TTGIR

    default = _report("masked_attention")
    no_lsr = _report("masked_attention", Pipeline(disable_lsr=True))
    comparison = inspect.compare(default, no_lsr)
    assert comparison.diffs["ptx"]
    assert default.sass.main_loop != no_lsr.sass.main_loop
    text = inspect.format_comparison(comparison)
    assert "plain Triton" in text and "disable-lsr" in text
    assert "<table>" in inspect.comparison_html(comparison)


def test_cli_compare_json_html_and_cache_dir(tmp_path):
    spec = os.path.join(os.path.dirname(__file__), "..", "examples", "masked_attention.toml")
    html = tmp_path / "report.html"
    cache = tmp_path / "cache"
    result = run_cli_env({"TRITON_CACHE_DIR": str(cache)}, "compare", spec, "--b", "disable-lsr", "--json",
                         "--html", str(html))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["b"]["pipeline"] == json.loads(json.dumps(Pipeline(disable_lsr=True).to_dict()))
    assert data["a"]["resources"]["registers"] > 0 and html.read_text().startswith("<!doctype html>")
    listed = run_cli("compare", "--cache-dir", str(cache), "--json")
    assert listed.returncode == 0, listed.stderr
    assert {r["kernel"] for r in json.loads(listed.stdout)} == {"masked_attention_kernel"}


def test_cli_compare_rejects_a_bad_pipeline():
    spec = os.path.join(os.path.dirname(__file__), "..", "examples", "masked_attention.toml")
    result = run_cli("compare", spec, "--b", "frobnicate")
    assert result.returncode == 2 and "bad item 'frobnicate'" in result.stderr


def run_cli_env(env, *args):
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(sys.executable), "tritonpatch")
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **env})


@pytest.mark.parametrize("launch,message", [
    ({"args": {}}, "needs grid"),
    ({"grid": [1], "args": {"X": {"shape": [4], "dtype": "float17"}}}, "launch argument 'X'"),
    ({"grid": [1], "args": {"X": {"shape": [4], "dtype": "float16", "init": "ones"}}}, "init = randn|zeros|nan"),
    ({"grid": [1], "args": {"N": 3}, "outputs": ["N"]}, "not a tensor argument"),
    ({"grid": ["a"], "args": {}}, "grid must be 1 to 3 positive integers"),
    ({"grid": [0], "args": {}}, "grid must be 1 to 3 positive integers"),
    ({"grid": [1, 1, 1, 1], "args": {}}, "grid must be 1 to 3 positive integers"),
    ({"grid": [1], "args": {"X": {"shape": [-4], "dtype": "float16"}}}, "launch argument 'X'"),
])
def test_launch_sections_are_checked(launch, message):
    with pytest.raises(ValueError, match=message):
        inspect.check_launch(launch)


def test_example_launch_section_is_valid():
    from tritonpatch.cli import load_kernel_spec

    spec = load_kernel_spec(os.path.join(os.path.dirname(__file__), "..", "examples", "masked_attention.toml"))
    assert spec["launch"]["outputs"] == ["Out"]


@pytest.mark.gpu
def test_cli_compare_times_both_variants_and_checks_outputs_on_a_gpu():
    """disable-lsr rewrites address arithmetic only: the outputs must be bitwise equal."""
    spec = os.path.join(os.path.dirname(__file__), "..", "examples", "masked_attention.toml")
    result = run_cli("compare", spec, "--b", "disable-lsr", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["a"]["runtime_ms"] > 0 and data["b"]["runtime_ms"] > 0
    assert data["outputs_bitwise_equal"] is True
