"""tritonpatch.inspection: output parsers, SASS/LLIR analysis and compare(), on samples and live compiles."""
from __future__ import annotations

import json
import os

import pytest
import triton
import triton.language as tl

from compile_helpers import KERNELS
from test_cli import run_cli
from tritonpatch import Pipeline
from tritonpatch import inspection

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
    assert inspection.parse_resource_usage(CUOBJDUMP_SAMPLE) == {"registers": 183, "stack": 16, "shared": 1024, "local": 24}
    assert inspection.parse_ptxas_verbose(PTXAS_SAMPLE) == {"stack_frame": 16, "spill_stores": 8, "spill_loads": 12,
                                                         "registers": 255}
    with pytest.raises(ValueError, match="REG"):
        inspection.parse_resource_usage("nothing here")


def test_sass_sample_classes_and_main_loop():
    stats = inspection.analyze_sass(SASS_SAMPLE)
    assert stats.total == {"constant": 1, "branch": 3, "tensor-core": 1, "fp": 1, "mufu": 1, "int": 1,
                           "store-global": 1}
    # The loop is .L_x_0 .. the backward BRA: HGMMA, FFMA, MUFU, IADD3, BRA.
    assert stats.main_loop == {"tensor-core": 1, "fp": 1, "mufu": 1, "int": 1, "branch": 1}
    assert stats.loops == 1


@triton.jit
def tensor_descriptor_sum(X, OUT, M, N, BM: tl.constexpr, BN: tl.constexpr):
    """A loop of TMA loads: nvdisasm puts the mbarrier wait retries after EXIT, jumping back in."""
    desc = tl.make_tensor_descriptor(X, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    acc = tl.zeros([BM, BN], tl.float32)
    for start in range(0, N, BN):
        acc += desc.load([tl.program_id(0) * BM, start]).to(tl.float32)
    tl.store(OUT + tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :], acc)


@triton.jit
def scaled_copy(X, Y, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offsets, tl.load(X + offsets) * 2)


def test_reports_compile_with_aligned_pointers_as_a_launch_does():
    """By default the pointers are 16-byte aligned, as torch tensors launch them: 128-bit loads and
    stores; without it each element is a load of its own, which no GPU launch would run."""
    signature = {"X": "*fp16", "Y": "*fp16"}
    aligned = inspection.compile_report(scaled_copy, signature, {"BLOCK": 1024})
    unaligned = inspection.compile_report(scaled_copy, signature, {"BLOCK": 1024}, aligned_pointers=False)
    assert ".v4.b32" in aligned.asm["ptx"] and ".v4.b32" not in unaligned.asm["ptx"]
    assert aligned.sass.total["load-global"] < unaligned.sass.total["load-global"]


def test_the_main_loop_of_a_tma_kernel_is_its_loop():
    """The retry blocks after EXIT branch back into the loop: not a loop of their own, and the
    main loop is the loop of TMA loads, not a span reaching into the epilogue's stores."""
    from tritonpatch.targets import compile_for_target

    kernel = compile_for_target(tensor_descriptor_sum, {"X": "*fp16", "OUT": "*fp32", "M": "i32", "N": "i32"},
                                {"BM": 64, "BN": 64}, target="sm_90", num_warps=4, num_stages=3)
    stats = inspection.analyze_sass(inspection.disassemble(kernel.asm["cubin"]))
    assert stats.loops == 1
    assert stats.main_loop.get("barrier") and "store-global" not in stats.main_loop, stats.main_loop


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
    (loop,) = inspection.llir_loops(llir)
    assert loop.header == "loop" and loop.blocks == 1
    assert loop.opcodes == {"phi": 1, "add": 1, "store": 1, "icmp": 1, "br": 1}


def _report(name, pipeline=None):
    fn, signature, constexprs, options = KERNELS[name]
    return inspection.compile_report(fn, signature, constexprs, pipeline, **options)


def test_live_compile_report_is_consistent():
    report = _report("masked_attention")
    # cuobjdump read the cubin Triton built; ptxas -v recompiled the PTX: two tools, one answer.
    verbose = inspection.parse_ptxas_verbose(inspection.run_tool([
        inspection.tool_path("ptxas"), "-v", "--gpu-name=sm_90a", _write(report.asm["ptx"]), "-o", os.devnull]))
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
    comparison = inspection.compare(unrolled, rolled)
    rows = {metric: (a, b) for metric, a, b in comparison.rows}
    assert rows["LLIR loops"] == (0, 1)  # fully unrolled by default, kept as a loop without unrolling
    assert unrolled.loops == [] and rolled.loops[0].opcodes["phi"] >= 1  # (ptxas may still unroll the SASS)
    assert comparison.diffs["ptx"] and not comparison.diffs["ttgir"]  # LLVM options act after TTGIR
    # a pass that leaves a loop as it is says why, under its line in the comparison (it gave the counts only)
    skipping = _report("fixed_trip_loop", Pipeline(passes=["skip-masked-blocks"]))
    lines = inspection.format_comparison(inspection.compare(unrolled, skipping)).splitlines()
    at = lines.index("pass (B) skip-masked-blocks on ttir: loops_narrowed=0")
    assert lines[at + 1].startswith("  loop %") and lines[at + 1].endswith("its body has no tensor select (tl.where)")

    default = _report("masked_attention")
    no_lsr = _report("masked_attention", Pipeline(disable_lsr=True))
    comparison = inspection.compare(default, no_lsr)
    assert comparison.diffs["ptx"]
    assert default.sass.main_loop != no_lsr.sass.main_loop
    text = inspection.format_comparison(comparison)
    assert "plain Triton" in text and "disable-lsr" in text
    assert "<table class=metrics>" in inspection.comparison_html(comparison)


def test_cli_compare_json_html_and_cache_dir(tmp_path):
    spec = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "masked_attention.toml")
    html = tmp_path / "report.html"
    cache = tmp_path / "cache"
    result = run_cli_env({"TRITON_CACHE_DIR": str(cache)}, "compare", spec, "--b", "disable-lsr", "--json",
                         "--html", str(html))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["b"]["pipeline"] == json.loads(json.dumps(Pipeline(disable_lsr=True).to_dict()))
    assert data["a"]["resources"]["registers"] > 0 and html.read_text().startswith("<!doctype html>")
    # Both compile times come from a warm process (A alone paid for the first compile before).
    assert data["a"]["compile_warmed_up"] and data["b"]["compile_warmed_up"]
    assert "--b disable-lsr --json --html" in html.read_text()  # the command, in the report's header
    listed = run_cli("compare", "--cache-dir", str(cache), "--json")
    assert listed.returncode == 0, listed.stderr
    entries = json.loads(listed.stdout)
    assert {r["kernel"] for r in entries} == {"masked_attention_kernel"}
    assert all(r["pipeline"] for r in entries)
    table = run_cli("compare", "--cache-dir", str(cache))
    assert table.stdout.splitlines()[0].split() == ["KERNEL", "ENTRY", "REGS", "LOCAL", "SHARED", "LOOP-SASS",
                                                    "PIPELINE"]
    assert "plain Triton" in table.stdout


def test_cli_cache_dir_names_the_pipeline_that_built_each_entry(tmp_path):
    spec = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "masked_attention.toml")
    cache = tmp_path / "cache"
    built = run_cli_env({"TRITON_CACHE_DIR": str(cache)}, "compare", spec, "--b", "disable-lsr", "--json")
    assert built.returncode == 0, built.stderr
    listed = run_cli("compare", "--cache-dir", str(cache), "--json")
    assert sorted(r["pipeline"] for r in json.loads(listed.stdout)) == ["disable-lsr", "plain Triton"]


def test_cli_compare_rejects_a_bad_pipeline():
    spec = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "masked_attention.toml")
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
        inspection.check_launch(launch)


def test_example_launch_section_is_valid():
    from tritonpatch.cli import load_kernel_spec

    spec = load_kernel_spec(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "masked_attention.toml"))
    assert spec["launch"]["outputs"] == ["Out"]


@pytest.mark.gpu
def test_cli_compare_times_both_variants_and_checks_outputs_on_a_gpu():
    """disable-lsr rewrites address arithmetic only: the outputs must be bitwise equal."""
    spec = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "masked_attention.toml")
    result = run_cli("compare", spec, "--b", "disable-lsr", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["a"]["runtime_ms"] > 0 and data["b"]["runtime_ms"] > 0
    assert data["outputs_bitwise_equal"] is True


# --- compare's output, on reports built by hand ---------------------------------------------------

def fake_report(pipeline=None, registers=128, sass_total=None, main_loop=None, ptx="", sass=SASS_SAMPLE,
                compile_seconds=0.5, warmed_up=True, passes=()):
    """A CompileReport with the given numbers, without compiling anything."""
    resources = inspection.Resources(registers=registers, spill_stores=0, spill_loads=0, stack_frame=0,
                                  local_memory=0, static_shared=0, dynamic_shared=24576)
    total = sass_total or {"int": 700, "fp": 370, "tensor-core": 8}
    stats = inspection.SassStats(total=total, main_loop=main_loop or {"int": 240, "fp": 230, "tensor-core": 8},
                              loops=1, opcodes={})
    return inspection.CompileReport(kernel="k", target="sm_90", pipeline=pipeline or Pipeline(),
                                 compile_seconds=compile_seconds, resources=resources, sass=stats, loops=[],
                                 passes=list(passes), asm={"ttir": "", "ttgir": "same\n", "llir": "", "ptx": ptx,
                                                           "sass": sass},
                                 warmed_up=warmed_up)


def _long_ptx(tag):
    return "\n".join(f"line {i} {tag if i % 2 else 'same'}" for i in range(1200))


def _fake_comparison():
    a = fake_report(registers=128, sass_total={"int": 150000, "fp": 370, "tensor-core": 8}, ptx=_long_ptx("a"),
                    compile_seconds=0.604)
    b = fake_report(Pipeline(disable_lsr=True), registers=218, sass_total={"int": 300000, "fp": 370,
                                                                             "tensor-core": 8},
                    main_loop={"int": 187, "fp": 230, "tensor-core": 8}, ptx=_long_ptx("b"), compile_seconds=0.566)
    return inspection.compare(a, b)


def test_change_column_integers_as_integers_with_direction():
    assert inspection.change_text("registers", 128, 218) == "+90 (+70.3%) worse"
    assert inspection.change_text("SASS int", 150000, 300000) == "+150000 (+100.0%) worse"  # was +1.5e+05
    assert inspection.change_text("SASS main loop int", 242, 187) == "-55 (-22.7%) better"
    assert inspection.change_text("compile time (s)", 0.604, 0.566) == "-0.038 (-6.3%) better"
    assert inspection.change_text("LLIR loops", 1, 3) == "+2 (+200.0%)"  # no direction: more loops can be the point
    assert inspection.change_text("spill stores", 0, 16) == "+16 worse"
    assert inspection.change_text("registers", 5, 5) == "same"
    assert inspection.change_text("kernel", "a", "b") == ""
    assert [inspection.format_number(v) for v in (12345.678, 0.0001234, 1.5, 3)] == ["12346", "0.0001234", "1.5", "3"]


def test_format_comparison_says_where_the_whole_diff_is():
    comparison = _fake_comparison()
    text = inspection.format_comparison(comparison, html_path="report.html")
    rows = {line.split("  ")[0].strip(): line for line in text.splitlines()}
    assert rows["registers"].split()[1:] == ["128", "218", "+90", "(+70.3%)", "worse"]
    assert rows["SASS int"].split()[2:5] == ["150000", "300000", "+150000"]
    assert "e+" not in text
    assert "ttgir: identical" in text
    # The whole diff is kept (it was cut at 200 lines and reported as "201 diff lines").
    lines, added, removed = inspection.diff_counts(comparison.diffs["ptx"])
    assert added == removed == 600 and lines > 1200
    assert f"ptx: {lines} diff lines (+600 -600); the full diff is in report.html" in text
    assert "--html FILE writes the full diff" in inspection.format_comparison(comparison)
    assert "compile time: each pipeline compiled once untimed, then the median of timed compiles" in text
    cold = inspection.compare(fake_report(warmed_up=False), fake_report())
    assert "compile time: not warmed up" in inspection.format_comparison(cold)


def test_html_report_structure():
    import re

    comparison = _fake_comparison()
    page = inspection.comparison_html(comparison, command="tritonpatch compare spec.toml --html r.html",
                                   generated="2026-12-02 01:30 UTC",
                                   environment={"tritonpatch": "0.1.0", "triton": "3.6.0", "torch": "2.13.0"})
    for field in ("tritonpatch version", "triton version", "torch version", "command", "date"):
        assert f"<th>{field}</th>" in page
    assert "<code>tritonpatch compare spec.toml --html r.html</code>" in page and "2026-12-02 01:30 UTC" in page
    assert "<th class=num>change (B vs A)</th>" in page
    changed = [m for m, x, y in comparison.rows if x != y]
    assert page.count("<tr class=changed>") == len(changed) > 0
    assert "<td class='num worse'>+90 (+70.3%) worse</td>" in page
    assert "<td class='num better'>-53 (-22.1%) better</td>" in page
    # Every line of the whole diff, coloured by kind.
    assert page.count("<span class=add>+line") == 600 and page.count("<span class=del>-line") == 600
    assert "<span class=hunk>@@" in page and "<span class=file>--- a/k.ptx</span>" in page
    # Bar charts: the main loop and the whole kernel, each count written beside its bar.
    assert "<h3>main loop</h3>" in page and "<h3>whole kernel</h3>" in page
    assert re.search(r"<td class=cls>int</td><td><div class=barline><div class='bar a' style='width:\d+px'>"
                     r"</div>240</div><div class=barline><div class='bar b' style='width:\d+px'></div>187</div>", page)


def test_cache_entries_name_their_pipeline():
    describe = inspection.describe_recorded_pipeline
    assert describe({}) == "plain Triton"
    assert describe({"tritonpatch_pipeline": Pipeline().to_dict()}) == "plain Triton"
    assert describe({"tritonpatch_pipeline": Pipeline(disable_lsr=True).to_dict()}) == "disable-lsr"
    pipeline = Pipeline(disable_lsr=True, llvm={"unroll-threshold": 0}, passes=["skip-masked-blocks"],
                        ptxas=["--def-load-cache=cg"])
    record = json.loads(json.dumps(pipeline.to_dict()))  # as the metadata file holds it
    assert describe({"tritonpatch_pipeline": record}) == \
        "disable-lsr;llvm:unroll-threshold=0;passes:skip-masked-blocks;ptxas:--def-load-cache=cg"
    assert describe({"tritonpatch_pipeline": record, "tritonpatch_fallback": "ptxas failed"}).endswith(
        " (passes fell back)")
    # What it prints is what --a/--b read back.
    from tritonpatch.cli import pipeline_from_text

    assert pipeline_from_text(describe({"tritonpatch_pipeline": record})) == pipeline


def test_compile_report_takes_a_pipeline_dict_as_jit_does():
    """A dict of Pipeline keywords works as in ``tritonpatch.jit``: the same report as the Pipeline it
    names; anything else is an error naming compile_report's parameter and how to build a Pipeline."""
    from tritonpatch import PipelineError

    fn, signature, constexprs, options = KERNELS["fixed_trip_loop"]
    from_dict = inspection.compile_report(fn, signature, constexprs, {"disable_lsr": True}, **options)
    from_pipeline = inspection.compile_report(fn, signature, constexprs, Pipeline(disable_lsr=True),
                                              **options)
    assert from_dict.pipeline == from_pipeline.pipeline == Pipeline(disable_lsr=True)
    assert from_dict.asm["sass"] == from_pipeline.asm["sass"]
    with pytest.raises(PipelineError, match=r"compile_report\(pipeline=...\): a Pipeline dict got unknown keyword"
                                            r".*did you mean disable_lsr \(for dissable_lsr\)"):
        inspection.compile_report(fn, signature, constexprs, {"dissable_lsr": True}, **options)
    with pytest.raises(PipelineError, match=r"compile_report\(pipeline=...\) takes a tritonpatch.Pipeline or a dict "
                                            r".*got 'disable-lsr'; for the text form use "
                                            r"tritonpatch.Pipeline.parse\('disable-lsr'\)"):
        inspection.compile_report(fn, signature, constexprs, pipeline="disable-lsr", **options)


def test_compile_report_warms_up_and_takes_the_median(monkeypatch):
    """warm_up compiles once untimed; repeat=N times N compiles and keeps their median."""
    calls = []
    from tritonpatch.inspection import report as report_module
    real = report_module.compile_for_target

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(report_module, "compile_for_target", counting)
    fn, signature, constexprs, options = KERNELS["fixed_trip_loop"]
    report = inspection.compile_report(fn, signature, constexprs, warm_up=True, repeat=2, **options)
    assert len(calls) == 3 and report.warmed_up and report.compile_seconds > 0
    calls.clear()
    assert not inspection.compile_report(fn, signature, constexprs, **options).warmed_up and len(calls) == 1
