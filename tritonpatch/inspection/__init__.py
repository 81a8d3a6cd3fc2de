"""Compare a kernel compiled under two pipelines: registers, spills, SASS mix, loops, IR diffs.

Everything here works without a GPU: Triton compiles for any ``sm_XX`` on the CPU and ships
``ptxas``, ``cuobjdump`` and ``nvdisasm``. ::

    from tritonpatch import inspection
    a = inspection.compile_report(kernel, signature, constexprs)                        # plain Triton
    b = inspection.compile_report(kernel, signature, constexprs, Pipeline(disable_lsr=True))
    print(inspection.format_comparison(inspection.compare(a, b)))

One concern per module: :mod:`.tools` (the CUDA tools Triton ships), :mod:`.sass`, :mod:`.resources`,
:mod:`.llir` (what a compile is measured by), :mod:`.report` (one compile, measured), :mod:`.compare`
(two side by side), :mod:`.report_html`, :mod:`.gpu` (running a spec's launch), :mod:`.cache` (a
Triton cache directory's kernels).
"""
from .cache import cache_dir_reports, describe_recorded_pipeline
from .compare import (DIFF_STAGES, Comparison, change_direction, change_text, compare, describe_pipeline,
                      diff_counts, format_comparison, format_number, lower_is_better, metrics, sass_classes)
from .gpu import bitwise_equal, check_launch, launch_inputs, run_on_gpu
from .llir import LoopStats, llir_loops
from .report import CompileReport, compile_report, describe_pass
from .report_html import comparison_html, report_environment
from .resources import Resources, measure_resources, parse_ptxas_verbose, parse_resource_usage, ptxas_warnings
from .sass import SASS_CLASSES, SassStats, analyze_sass, disassemble, loop_instructions, sass_class, sass_loops, wgmma_overlap
from .tools import run_tool, tool_path

__all__ = [
    "cache_dir_reports", "describe_recorded_pipeline",
    "DIFF_STAGES", "Comparison", "change_direction", "change_text", "compare", "describe_pipeline", "diff_counts",
    "format_comparison", "format_number", "lower_is_better", "metrics", "sass_classes",
    "bitwise_equal", "check_launch", "launch_inputs", "run_on_gpu",
    "LoopStats", "llir_loops", "CompileReport", "compile_report", "describe_pass",
    "comparison_html", "report_environment",
    "Resources", "measure_resources", "parse_ptxas_verbose", "parse_resource_usage", "ptxas_warnings",
    "SASS_CLASSES", "SassStats", "analyze_sass", "disassemble", "loop_instructions", "sass_class", "sass_loops",
    "wgmma_overlap",
    "run_tool", "tool_path",
]
